"""`warren -p` as a person sees it (issue 13, items 8 and 9), with the real `warren` process
and the real SDK against the fake Messages API: progress at a terminal (a real pseudo-terminal,
pexpect), nothing of it in a pipe, colours that follow NO_COLOR, denied calls that never look
like success, and a stdout closed by its reader (`| head -1`) that ends the run quietly."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return {
        **base,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
        "TERM": "xterm-256color",
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def warren(
    args: list[str], env: dict[str, str], **options: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
        **options,  # type: ignore[call-overload]
    )


def _colours(text: str) -> list[str]:
    """The SGR sequences in `text` that set a foreground or background colour."""
    found = []
    for params in re.findall(r"\x1b\[([0-9;]*)m", text):
        codes = [int(p) for p in params.split(";") if p]
        if any(30 <= c <= 49 or 90 <= c <= 107 for c in codes):
            found.append(params)
    return found


def _edit_and_bash(workspace: Path) -> list[Reply]:
    """The model writes a file and runs `make test`, then claims success."""
    calls = Reply(
        content=[
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": str(workspace / "renamed.txt"), "content": "new\n"},
            },
            {"type": "tool_use", "name": "Bash", "input": {"command": "make test"}},
        ]
    )
    return [calls, Reply.text("Renamed it in 3 files.")]


# --- denied calls ----------------------------------------------------------------------------


def test_denied_calls_are_listed_with_how_to_allow_them(
    workspace: Path, env: dict[str, str]
) -> None:
    """No terminal to ask: both calls are denied. Text mode still prints the model's answer,
    then lists the denials on stderr with the flags that allow them, and exits 0; with those
    flags the same run really writes the file."""
    with FakeMessagesAPI(_edit_and_bash(workspace)) as api:
        done = warren(
            ["-p", "rename it", "--cwd", str(workspace)],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Renamed it in 3 files.\n"
    assert not (workspace / "renamed.txt").exists()
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "warren: 2 tool calls were denied; what they would have done did not happen:"
    assert (
        lines[1]
        == f"  x Write {workspace}/renamed.txt: it needs permission and nobody could answer"
    )
    assert lines[2] == "  x Bash make test: it needs permission and nobody could answer"
    [allow] = [line for line in lines if line.startswith("  allow them: warren -p ... ")]
    flags = shlex.split(allow.removeprefix("  allow them: warren -p ... "))
    assert flags == ["--allowed-tools", "Write", "--allowed-tools", "Bash(make test:*)"]
    assert '[permissions] allow = ["Write", "Bash(make test:*)"]' in done.stderr
    assert "--fail-on-denial makes such a run exit 7" in done.stderr

    (workspace / "Makefile").write_text("test:\n\t@echo tested\n")
    with FakeMessagesAPI(_edit_and_bash(workspace)) as api:
        done = warren(
            ["-p", "rename it", "--cwd", str(workspace), *flags],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
        results = api.requests[1].messages[-1]["content"]
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (workspace / "renamed.txt").read_text() == "new\n"
    assert [r["is_error"] for r in results] == [False, False]


@pytest.mark.parametrize("output_format", ["json", "stream-json"])
def test_permission_denials_in_the_result_and_fail_on_denial_exits_7(
    workspace: Path, env: dict[str, str], output_format: str
) -> None:
    for extra, code in (([], 0), (["--fail-on-denial"], 7)):
        with FakeMessagesAPI(_edit_and_bash(workspace)) as api:
            done = warren(
                [
                    *("-p", "rename it", "--cwd", str(workspace), "--output-format", output_format),
                    *extra,
                ],
                {**env, "ANTHROPIC_BASE_URL": api.base_url},
            )
            sent = api.requests[0].body["messages"]
            uses = [b for b in api.requests[1].messages[-2]["content"] if b["type"] == "tool_use"]
        assert sent, "the run reached the model"
        assert done.returncode == code, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        assert result["type"] == "result"
        assert result["permission_denials"] == [
            {"tool_name": u["name"], "tool_use_id": u["id"], "tool_input": u["input"]} for u in uses
        ]
        if code == 7:
            assert result["terminal_reason"] == "permission_denied" and result["is_error"]
        else:
            assert result["terminal_reason"] == "completed" and not result["is_error"]
        assert "warren: 2 tool calls were denied" not in done.stderr  # text mode only


def test_fail_on_denial_in_text_mode(workspace: Path, env: dict[str, str]) -> None:
    with FakeMessagesAPI(_edit_and_bash(workspace)) as api:
        done = warren(
            ["-p", "rename it", "--cwd", str(workspace), "--fail-on-denial"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "Renamed it in 3 files.\n"
    assert done.stderr.splitlines()[-1] == (
        "warren: run ended: permission_denied: calls were denied (--fail-on-denial)"
    )


# --- closed pipes ----------------------------------------------------------------------------


def test_head_closing_the_pipe_ends_quietly_with_141(workspace: Path, env: dict[str, str]) -> None:
    """`warren ... | head -1` in a shell with pipefail: the first line, no traceback and no
    error line, warren's status 141 (128 + SIGPIPE) as any writer a pipe's reader left."""
    replies = [Reply.tool_use("Bash", {"command": "echo hi"}), Reply.text("ok")]
    with FakeMessagesAPI(replies) as api:
        command = " ".join(
            shlex.quote(a)
            for a in [*WARREN, "-p", "hi", "--cwd", str(workspace), "--output-format",
                      "stream-json"]
        )  # fmt: skip
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {command} | head -1"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert json.loads(done.stdout)["subtype"] == "init"
    assert done.stderr == "", done.stderr
    assert done.returncode == 141


def test_a_reader_gone_before_the_answer_is_141_without_a_word(
    workspace: Path, env: dict[str, str]
) -> None:
    api = FakeMessagesAPI([Reply.text("the answer\n" * 20_000)])
    with (
        api,
        subprocess.Popen(
            [*WARREN, "-p", "hi", "--cwd", str(workspace)],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before anything was written
        stderr = proc.stderr.read()
        code = proc.wait(timeout=120)
    assert stderr == ""
    assert code == 141


# --- at a terminal ---------------------------------------------------------------------------


def _spawn(args: list[str], env: dict[str, str]) -> pexpect.spawn:
    return pexpect.spawn(
        WARREN[0],
        [*WARREN[1:], *args],
        env=env,
        encoding="utf-8",
        timeout=90,
        dimensions=(40, 160),
    )


def test_progress_at_a_terminal(workspace: Path, env: dict[str, str]) -> None:
    """The spinner while the model is held, a line per finished tool call with its duration,
    a row per running subagent and its summary when it ends, then the session line."""

    def route(request: RecordedRequest) -> Reply | None:
        if "[survey:billing]" in json.dumps(request.messages[:1]):
            return Reply.text("billing looks fine", hold_before_stop=True)
        return None

    main = [
        Reply.tool_use("Bash", {"command": "echo hi"}, hold_before_stop=True),
        Reply.tool_use(
            "dispatch_agent",
            {"description": "survey billing", "prompt": "[survey:billing] look around"},
        ),
        Reply.text("all done"),
    ]
    with FakeMessagesAPI(main, route=route) as api:
        child = _spawn(
            ["-p", "survey", "--cwd", str(workspace)], {**env, "ANTHROPIC_BASE_URL": api.base_url}
        )
        seen = ""
        try:
            child.expect("waiting for the model")
            seen += child.before + child.after
            api.release()
            child.expect(r"✓ .*Bash\(echo hi\).*exit 0.*\d+ (ms|s)")
            seen += child.before + child.after
            child.expect(r"agent-[0-9a-f]{12}.*survey billing")
            seen += child.before + child.after
            api.release()
            child.expect(r"✓ .*agent-[0-9a-f]{12}.*survey billing.*completed · 1 turns")
            seen += child.before + child.after
            child.expect(pexpect.EOF)
            seen += child.before
        finally:
            child.close(force=True)
    assert child.exitstatus == 0, seen[-3000:]
    assert "all done" in seen
    assert re.search(r"warren: session [0-9a-f-]{36} ended; resume it with: warren --resume", seen)
    assert "Traceback" not in seen
    assert _colours(seen), "a terminal that takes colours gets them"


def test_no_color_quiet_and_a_piped_stdout(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    """NO_COLOR: the progress shows, without a single colour. --quiet: no progress at all.
    stdout in a file, stderr at the terminal: the progress shows, stdout stays pure JSON."""
    replies = [Reply.tool_use("Bash", {"command": "echo hi"}), Reply.text("ok")]
    with FakeMessagesAPI(replies * 3) as api:
        base = {**env, "ANTHROPIC_BASE_URL": api.base_url}
        child = _spawn(["-p", "hi", "--cwd", str(workspace)], {**base, "NO_COLOR": "1"})
        child.expect(pexpect.EOF)
        child.close()
        plain = child.before
        child = _spawn(["-p", "hi", "--cwd", str(workspace), "--quiet"], base)
        child.expect(pexpect.EOF)
        child.close()
        quiet = child.before
        out = tmp_path / "out.jsonl"
        command = shlex.join([*WARREN, "-p", "hi", "--cwd", str(workspace),
                              "--output-format", "stream-json"])  # fmt: skip
        child = pexpect.spawn(
            "bash", ["-c", f"{command} > {shlex.quote(str(out))}"], env=base, encoding="utf-8",
            timeout=90, dimensions=(40, 160),
        )  # fmt: skip
        child.expect(pexpect.EOF)
        child.close()
        piped = child.before
    assert "Bash(echo hi)" in plain and "exit 0" in plain, plain
    assert _colours(plain) == []
    assert "Bash(echo hi)" not in quiet and "waiting for the model" not in quiet
    assert quiet.replace("\r\n", "\n") == "ok\n"
    assert re.search(r"✓ .*Bash\(echo hi\).*exit 0", piped), piped
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert events[0]["subtype"] == "init" and events[-1]["result"] == "ok"


def test_verbose_is_readable_logs_without_tool_lines(workspace: Path, env: dict[str, str]) -> None:
    with FakeMessagesAPI([Reply.tool_use("Bash", {"command": "echo hi"}), Reply.text("ok")]) as api:
        done = warren(
            ["-p", "hi", "--cwd", str(workspace), "--verbose"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(re.match(r"\S+Z \[info\s*\] session opened\s+\S", line) for line in lines), lines
    assert not [line for line in lines if line.startswith(("  -> ", "  <- "))]
    assert _colours(done.stderr) == []  # not a terminal
