"""End to end through the `warren` CLI: a real process, the real SDK over a real socket to the
fake Messages API, the real tools on a copy of the demo's sample repository."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.cli.demo.sample_repo import CALL_SITES, generate
from orchestrator.model.scripted import load_script
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, HttpError, RecordedRequest, Reply

DEMO = Path(__file__).resolve().parents[2] / "orchestrator" / "cli" / "demo"
WARREN = [sys.executable, "-m", "orchestrator.cli"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(DEMO.parents[2]),
    }


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return generate(tmp_path / "shop")


def run_cli(
    args: list[str], env: dict[str, str], input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        input=input,
    )


def test_scripted_refactor_through_cli_and_fake_server(sample: Path, env: dict[str, str]) -> None:
    """The demo's refactor through the real CLI and SDK: three subagents survey in parallel
    (each its own sandboxed worker), six reads in parallel, six edits, the tests run green."""
    script = load_script(DEMO / "session.json")
    # Each survey's first answer is held until all three are in flight at once: that is the
    # proof they run concurrently (no timing guess).
    agents = {
        agent.match: [
            dataclasses.replace(Reply.from_turn(t, workspace=str(sample)), hold_before_stop=i == 0)
            for i, t in enumerate(agent.turns)
        ]
        for agent in script.agents
    }

    def route(request: RecordedRequest) -> FakeResponse | None:
        first = request.messages[0]["content"]
        text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
        for match, replies in agents.items():
            if match in text:
                return replies.pop(0)
        return None

    main = [Reply.from_turn(t, workspace=str(sample)) for t in script.turns]
    args = ["-p", "fix the tests", "--cwd", str(sample), "--output-format", "stream-json"]
    args += ["--permission-mode", "accept-edits", "--allowed-tools", "Bash(python -m unittest:*)"]
    with FakeMessagesAPI(main, route=route) as api:
        finished: list[subprocess.CompletedProcess[str]] = []
        cli = threading.Thread(
            target=lambda: finished.append(
                run_cli(args, {**env, "ANTHROPIC_BASE_URL": api.base_url})
            )
        )
        cli.start()
        deadline = time.monotonic() + 90
        in_flight = 0
        while time.monotonic() < deadline and cli.is_alive() and in_flight < 3:
            in_flight = sum(
                1
                for r in api.requests
                if "[survey:" in json.dumps(r.messages[:1]) and r.ended_at is None
            )
            time.sleep(0.01)
        api.release(3)
        cli.join(timeout=120)
        assert in_flight == 3, "the three surveys were never in flight together"
        [done] = finished
        requests = api.requests
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["type"] == "system" and "dispatch_agent" in events[0]["tools"]
    assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    assert events[-1]["num_turns"] == 5
    assert len(requests) == 5 + 3 * 2
    headers = requests[0].headers
    assert "sk-test-e2e" in headers.get("x-api-key", "") + headers.get("authorization", "")
    # Every file was really edited, and the tests really ran green in the persistent shell.
    for path in ["shop/money.py", *CALL_SITES]:
        text = (sample / path).read_text()
        assert "legacy_round" not in text and "round_money" in text
    main_requests = [r for r in requests if "[survey:" not in json.dumps(r.messages[0])]
    bash_result = main_requests[4].messages[-1]["content"][0]
    assert bash_result["is_error"] is False
    assert "OK" in json.dumps(bash_result["content"])
    # Each survey ran in its own worker process, none of them the coordinator.
    results = [e for e in events if e.get("subtype") == "subagent_result"]
    pids = {e["worker_pid"] for e in results}
    assert len(pids) == 3 and events[0]["pid"] not in pids and None not in pids
    # The three survey reports came back to the main agent in dispatch order.
    reports = main_requests[1].messages[-1]["content"]
    assert [r["is_error"] for r in reports] == [False, False, False]
    for area, report in zip(("billing", "catalog", "shipping"), reports, strict=True):
        assert f"shop/{area}:" in json.dumps(report["content"])


def test_invalid_key_is_one_sentence_and_exit_1(sample: Path, env: dict[str, str]) -> None:
    with FakeMessagesAPI([HttpError(401)]) as api:
        done = run_cli(
            ["-p", "hi", "--cwd", str(sample)], {**env, "ANTHROPIC_BASE_URL": api.base_url}
        )
        assert len(api.requests) == 1
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "API key" in done.stderr


def test_prompt_too_long_exit_code(sample: Path, env: dict[str, str]) -> None:
    too_long = HttpError(400, "invalid_request_error", "prompt is too long: 250000 tokens > 200000")
    with FakeMessagesAPI([too_long]) as api:
        done = run_cli(
            ["-p", "hi", "--cwd", str(sample), "--output-format", "json"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
    assert done.returncode == 4
    result = json.loads(done.stdout)
    assert result["terminal_reason"] == "prompt_too_long" and result["is_error"] is True


def test_prompt_on_stdin_and_retry_event(sample: Path, env: dict[str, str]) -> None:
    with FakeMessagesAPI(
        [HttpError(429, headers={"retry-after": "0"}), Reply.text("hello")]
    ) as api:
        done = run_cli(
            ["--cwd", str(sample), "--output-format", "stream-json"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
            input="say hello",
        )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    retry = [e for e in events if e.get("subtype") == "api_retry"]
    assert retry and retry[0]["attempt"] == 1  # Claude Code counts retries from 1
    assert retry[0]["max_retries"] == 9 and retry[0]["retry_delay_ms"] == 0
    assert events[-1]["result"] == "hello"


def test_headless_ask_becomes_deny(sample: Path, env: dict[str, str]) -> None:
    replies = [
        Reply.tool_use("Write", {"file_path": str(sample / "new.txt"), "content": "x"}),
        Reply.text("could not write"),
    ]
    with FakeMessagesAPI(replies) as api:
        done = run_cli(
            ["-p", "write", "--cwd", str(sample)], {**env, "ANTHROPIC_BASE_URL": api.base_url}
        )
        denial = api.requests[1].messages[-1]["content"][0]
    assert done.returncode == 0
    assert not (sample / "new.txt").exists()
    assert denial["is_error"] is True
    assert "--allowed-tools Write" in json.dumps(denial["content"])


def test_usage_errors_exit_2(sample: Path, env: dict[str, str]) -> None:
    done = run_cli(["-p", "x", "--resume", "a", "--continue"], env)
    assert done.returncode == 2
    done = run_cli(["-p", "x", "--model", "scripted:/nonexistent.json", "--cwd", str(sample)], env)
    assert done.returncode == 2 and "cannot read the script" in done.stderr


def test_demo_runs_end_to_end(env: dict[str, str]) -> None:
    done = run_cli(["demo"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: completed after 5 turns" in done.stdout
    assert "subagents: 3, each in its own sandboxed worker" in done.stdout
    assert "6 x Edit" in done.stdout


def test_demo_with_parallel_writers_renames_with_three_scoped_writers_at_once(
    env: dict[str, str],
) -> None:
    done = run_cli(["demo", "--parallel-writers"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: completed after 3 turns" in done.stdout
    assert "scoped writers: 3, each writable only in:" in done.stdout
    assert "all running at once" in done.stdout
    assert "<- Bash: exit 0" in done.stdout  # the sample's tests pass after the rename


def test_demo_with_a_workflow_renames_with_scoped_writers_then_tests(
    env: dict[str, str],
) -> None:
    """`warren demo --workflow`: the main agent starts a workflow (its script in a sandbox of
    its own) whose writers rename in their packages and whose test agent reports through
    StructuredOutput; the main agent ends after its one notification."""
    done = run_cli(["demo", "--workflow"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: completed after 3 turns" in done.stdout
    assert "workflow phases: Rename -> Test" in done.stdout
    assert 'Workflow "rename"' in done.stdout and "completed: 4 done" in done.stdout
    assert "subagents: 4, each in its own sandboxed worker" in done.stdout
    assert "structured output" in done.stdout


def test_sandbox_off_says_so_on_every_run(sample: Path, env: dict[str, str]) -> None:
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        done = run_cli(
            ["-p", "hi", "--cwd", str(sample), "--sandbox", "off"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
    assert done.returncode == 0
    assert "--sandbox=off" in done.stderr and "unsandboxed" not in done.stdout


@pytest.mark.in_process  # watches the process tree of the warren it started
def test_tool_calls_run_in_a_sandboxed_host(sample: Path, env: dict[str, str]) -> None:
    """Through the CLI: a Bash call runs in bwrap — it sees no API key and cannot write /etc,
    and the init event says the floor is proven. Nothing but the coordinator runs when the
    first request arrives: the tool hosts and the change scan start once it is on its way
    (orchestrator/session/later.py), off the cold start's path."""
    import psutil

    replies = [
        Reply.tool_use(
            "Bash",
            {"command": "echo key=${ANTHROPIC_API_KEY:-none}; touch /etc/warren-escape; echo $?"},
        ),
        Reply.text("done"),
    ]
    at_first: list[list[str]] = []

    def route(request: RecordedRequest) -> None:
        if not at_first:
            (warren,) = psutil.Process().children()
            at_first.append([" ".join(_cmdline(p)) for p in warren.children(recursive=True)])

    with FakeMessagesAPI(replies, route=route) as api:
        done = run_cli(
            [
                "-p",
                "x",
                "--cwd",
                str(sample),
                "--permission-mode",
                "bypass",
                "--output-format",
                "stream-json",
            ],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
        result = json.dumps(api.requests[1].messages[-1]["content"][0]["content"])
    assert done.returncode == 0, done.stderr
    init = json.loads(done.stdout.splitlines()[0])
    assert init["sandbox"] == "proven"
    assert "key=none" in result
    assert not Path("/etc/warren-escape").exists()
    assert at_first == [[]]


def test_a_session_keeps_one_api_connection(sample: Path, env: dict[str, str]) -> None:
    """Through the CLI: every turn of a run goes over the same connection to the API (one
    TLS handshake per session against the real one, not one per turn)."""
    replies = [Reply.tool_use("Read", {"file_path": str(sample / "README.md")})] * 3
    with FakeMessagesAPI([*replies, Reply.text("done")]) as api:
        done = run_cli(
            ["-p", "x", "--cwd", str(sample), "--permission-mode", "bypass"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert [r.response for r in requests] == ["Reply"] * 4
    # The first turn starts the tool host, which on a loaded machine can take longer than the
    # pool keeps an idle connection (5 s): from then on, one connection.
    assert len({r.connection for r in requests[1:]}) == 1


@pytest.mark.in_process  # watches the process tree of the warren it started
def test_ctrl_c_interrupts_and_the_session_resumes(sample: Path, env: dict[str, str]) -> None:
    """SIGINT mid-tool: exit 130, no process left, the transcript closes the dangling call,
    and `--continue` carries on without an API protocol error."""
    import signal

    import psutil

    replies = [
        Reply.tool_use("Bash", {"command": "echo started; sleep 60; echo never"}),
        Reply.text("resumed fine"),
    ]
    with FakeMessagesAPI(replies) as api:
        proc = subprocess.Popen(
            [
                *WARREN,
                "-p",
                "slow",
                "--cwd",
                str(sample),
                "--permission-mode",
                "bypass",
                "--output-format",
                "stream-json",
            ],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            sleeping: list[psutil.Process] = []
            while time.monotonic() < deadline and not sleeping:
                try:
                    family = psutil.Process(proc.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    break
                sleeping = [p for p in family if _cmdline(p)[:2] == ["sleep", "60"]]
                time.sleep(0.05)
            assert sleeping, "the Bash call never started"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in sleeping)
        events = [json.loads(line) for line in out.splitlines()]
        assert events[-1]["terminal_reason"] == "interrupted"
        session_id = events[0]["session_id"]

        done = run_cli(
            ["-p", "go on", "--cwd", str(sample), "--resume", session_id],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "resumed fine"
        sent = api.requests[-1].messages
    # The interrupted Bash call got its result, then the interruption note, then the new prompt.
    results = sent[2]["content"]
    assert results[0]["type"] == "tool_result" and results[0]["is_error"] is True
    assert "Interrupted" in json.dumps(results[0]["content"])
    assert sent[-1]["content"][-1]["text"] == "go on"


def _cmdline(process: object) -> list[str]:
    import psutil

    assert isinstance(process, psutil.Process)
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_unproven_floor_refuses_to_run_tools(sample: Path, env: dict[str, str]) -> None:
    """--sandbox=required (the default) with a bwrap that cannot sandbox: no model request,
    exit 2, and the probe's explanation with a fix."""
    with FakeMessagesAPI([Reply.text("never")]) as api:
        done = run_cli(
            ["-p", "hi", "--cwd", str(sample)],
            {**env, "ANTHROPIC_BASE_URL": api.base_url, "WARREN_BWRAP": "/bin/false"},
        )
        assert api.requests == []
    assert done.returncode == 2
    assert "floor is not proven" in done.stderr
    assert "--sandbox=off" in done.stderr and "Traceback" not in done.stderr


def test_policy_commands_through_the_cli(sample: Path, env: dict[str, str]) -> None:
    """init writes a starter policy from the build files; its allow rule waits for trust;
    check explains a decision as JSON; the [[examples]] pass once trusted."""
    (sample / "Makefile").write_text("check:\n\tpython -m unittest\n")
    cwd = ["--cwd", str(sample)]
    done = run_cli(["policy", "init", *cwd], env)
    assert done.returncode == 0, done.stderr
    assert "Bash(make check)" in (sample / ".warren" / "policy.toml").read_text()

    def check() -> dict[str, object]:
        done = run_cli(["policy", "check", "--json", *cwd, "--", "make", "check"], env)
        assert done.returncode == 0, done.stderr
        decision: dict[str, object] = json.loads(done.stdout)
        return decision

    before = check()
    assert before["decision"] == "ask"
    assert set(before) == {
        "decision",
        "read_only",
        "concurrency_safe",
        "rule",
        "source",
        "mode",
        "floor",
    }
    assert run_cli(["policy", "test", *cwd], env).returncode == 1
    assert run_cli(["policy", "trust", *cwd], env).returncode == 0
    after = check()
    assert after["decision"] == "allow" and after["rule"] == "Bash(make check)"
    assert run_cli(["policy", "test", *cwd], env).returncode == 0
    assert run_cli(["untrust", str(sample)], env).returncode == 0
    assert check()["decision"] == "ask"
