"""Past sessions (issue 13, item 7), with the real `warren` process against the fake Messages
API: `warren sessions` lists a directory's sessions newest first, escaping what the user or
the model wrote and never reading a whole transcript; `warren --resume` without an id offers a
picker at a terminal (pexpect) and is a one-line error elsewhere; a session that ends at a
terminal or is interrupted says its id and how to resume it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pexpect
import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.orchestrator.test_cli_headless_e2e import WARREN, warren

ROOT = Path(__file__).resolve().parents[2]

EVIL = "fix \x1b]0;pwned\x07\x1b[2J\rit\u202e now\nsecond line"
"""A first prompt that would set the title, clear the screen, return the carriage and
reverse the text if printed raw."""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
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


def _rows(stdout: str) -> list[list[str]]:
    header, *rows = stdout.splitlines()
    assert header.split() == ["ID", "STARTED", "TURNS", "COST", "TASKS", "FIRST", "PROMPT"]
    return [re.split(r"\s{2,}", row.strip(), maxsplit=5) for row in rows]


def test_sessions_lists_this_directory_newest_first_escaped(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with FakeMessagesAPI([Reply.text("one"), Reply.text("two"), Reply.text("three")]) as api:
        base = {**env, "ANTHROPIC_BASE_URL": api.base_url}
        first = warren(["-p", EVIL, "--cwd", str(workspace), "--output-format", "json"], base)
        second = warren(["-p", "second", "--cwd", str(workspace), "--output-format", "json"], base)
        other = warren(["-p", "other", "--cwd", str(elsewhere), "--output-format", "json"], base)
    ids = [json.loads(done.stdout)["session_id"] for done in (first, second, other)]
    cost = json.loads(first.stdout)["total_cost_usd"]
    assert cost > 0

    done = warren(["sessions", "--cwd", str(workspace)], env)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\u202e" not in done.stdout
    rows = _rows(done.stdout)
    assert [row[0] for row in rows] == [ids[1], ids[0]]  # newest first, this directory only
    newest, evil = rows
    assert newest[2:] == [
        "1", f"${json.loads(second.stdout)['total_cost_usd']:.4f}", "0", "second"
    ]  # fmt: skip
    assert evil[2:5] == ["1", f"${cost:.4f}", "0"]
    # Whitespace (the newline, the carriage return) becomes one space; the rest is escaped.
    assert evil[5] == "fix \\x1b]0;pwned\\x07\\x1b[2J it\\u202e now second line"

    everywhere = warren(["sessions", "--all"], env)
    assert {row[0] for row in _rows(everywhere.stdout)} == set(ids)


def test_a_huge_transcript_is_listed_without_reading_it(
    workspace: Path, env: dict[str, str]
) -> None:
    """A 64 GiB transcript (sparse) without a summary file: its head says what it is; the
    listing reads no more (reading it whole would take minutes and all the memory)."""
    sessions = Path(env["XDG_STATE_HOME"]) / "warren" / "sessions"
    sessions.mkdir(parents=True)
    session_id = str(uuid.uuid4())
    path = sessions / f"{session_id}.jsonl"
    header = {"type": "session", "session_id": session_id, "cwd": str(workspace), "ts": 1.0}
    prompt = {"type": "message", "message": {"role": "user", "content": "big \x1b[31mone"}}
    path.write_text(json.dumps(header) + "\n" + json.dumps(prompt) + "\n")
    os.truncate(path, 64 << 30)
    started = time.monotonic()
    done = warren(["sessions", "--cwd", str(workspace)], env)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60
    [row] = _rows(done.stdout)
    assert row[0] == session_id and row[2:] == ["?", "?", "?", "big \\x1b[31mone"]


def test_resume_without_an_id_offers_a_picker_at_a_terminal(
    workspace: Path, env: dict[str, str]
) -> None:
    with FakeMessagesAPI([Reply.text("first answer"), Reply.text("second answer")]) as api:
        base = {**env, "ANTHROPIC_BASE_URL": api.base_url}
        first = warren(["-p", "remember 42", "--cwd", str(workspace), "--output-format", "json"],
                       base)  # fmt: skip
        session_id = json.loads(first.stdout)["session_id"]
        child = pexpect.spawn(
            WARREN[0],
            [*WARREN[1:], "--resume", "-p", "what was it?", "--cwd", str(workspace)],
            env=base,
            encoding="utf-8",
            timeout=90,
            dimensions=(40, 200),
        )
        try:
            child.expect(r"resume which session\? \[1-1, Enter for none\] ")
            listing = child.before
            child.sendline("1")
            child.expect(pexpect.EOF)
            after = child.before
        finally:
            child.close(force=True)
        resumed = api.requests[1].messages
    assert re.search(rf"\s+1  {session_id}  .*remember 42", listing), listing
    assert child.exitstatus == 0, after
    assert "second answer" in after
    assert f"warren: session {session_id} ended; resume it with: warren --resume {session_id}" in (
        after.replace("\r\n", "\n")
    )
    assert [m["role"] for m in resumed] == ["user", "assistant", "user"]
    assert "remember 42" in json.dumps(resumed[0]) and "what was it?" in json.dumps(resumed[2])


def test_resume_without_an_id_and_no_terminal_is_one_line(
    workspace: Path, env: dict[str, str]
) -> None:
    done = warren(["--resume", "-p", "hi", "--cwd", str(workspace)], env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--resume needs a session id" in done.stderr
    assert "warren sessions" in done.stderr


def test_an_interrupted_run_says_how_to_resume_it(workspace: Path, env: dict[str, str]) -> None:
    api = FakeMessagesAPI([Reply.text("never finished", hold_before_stop=True)])
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
        deadline = time.monotonic() + 90
        while not api.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 130, stderr
    [line] = [line for line in stderr.splitlines() if "resume it with" in line]
    session_id = line.split()[2]
    assert line == (
        f"warren: session {session_id} interrupted; resume it with: "
        f"warren --resume {session_id} -p '...'"
    )
    listed = warren(["sessions", "--cwd", str(workspace)], env)
    assert _rows(listed.stdout)[0][0] == session_id
