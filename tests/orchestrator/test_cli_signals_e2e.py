"""Signals end to end, with the real `warren` process: SIGTERM and SIGHUP (`kill`, `timeout`,
a closed terminal) stop a run the way Ctrl-C does: the result line, a transcript that
resumes, exit 128 + the signal, and no worker, tool host or bwrap process left behind. A
second signal stops at once, still cleanly; Ctrl-C twice while subagents run prints no
traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.cli.demo.sample_repo import generate
from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply
from tests.orchestrator.test_cli_e2e import WARREN, run_cli

ROOT = Path(__file__).resolve().parents[2]

# Each test watches the process tree of the warren it started: no server in between.
pytestmark = pytest.mark.in_process


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return generate(tmp_path / "shop")


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    # Its own process group, as a terminal's foreground job: a signal to the group reaches
    # the coordinator and every child, as Ctrl-C at a terminal does.
    return subprocess.Popen(
        [*WARREN, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _family(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _wait_for(pid: int, found: object, what: str) -> list[psutil.Process]:
    """Poll the process tree until `found(tree)` holds (a real process must appear; there
    is no event to wait on from outside)."""
    assert callable(found)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        family = _family(pid)
        if found(family):
            return family
        time.sleep(0.05)
    raise AssertionError(f"{what} never started")


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(_cmdline(process)) or str(process.pid))
        except psutil.NoSuchProcess:
            pass
    return left


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_stops_the_run_like_ctrl_c(
    sample: Path, env: dict[str, str], signum: signal.Signals
) -> None:
    replies = [
        Reply.tool_use("Bash", {"command": "echo started; sleep 60; echo never"}),
        Reply.text("resumed fine"),
    ]
    with FakeMessagesAPI(replies) as api:
        api_env = {**env, "ANTHROPIC_BASE_URL": api.base_url}
        proc = _start(
            [
                *("-p", "slow", "--cwd", str(sample), "--permission-mode", "bypass"),
                *("--output-format", "stream-json"),
            ],
            api_env,
        )
        family = _wait_for(
            proc.pid,
            lambda tree: any(_cmdline(p)[:2] == ["sleep", "60"] for p in tree),
            "the Bash call",
        )
        assert any("bwrap" in " ".join(_cmdline(p)) for p in family)
        proc.send_signal(signum)
        out, err = _finish(proc)
        assert proc.returncode == 128 + signum, err
        assert "Traceback" not in err
        assert _alive(family) == []
        events = [json.loads(line) for line in out.splitlines()]
        assert events[-1]["type"] == "result" and events[-1]["terminal_reason"] == "interrupted"
        done = run_cli(
            ["-p", "go on", "--cwd", str(sample), "--resume", events[0]["session_id"]], api_env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "resumed fine"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_stops_at_once_and_cleanly(
    sample: Path, env: dict[str, str], signum: signal.Signals
) -> None:
    with FakeMessagesAPI([Reply.tool_use("Bash", {"command": "sleep 60"})]) as api:
        proc = _start(
            ["-p", "slow", "--cwd", str(sample), "--permission-mode", "bypass"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )
        family = _wait_for(
            proc.pid,
            lambda tree: any(_cmdline(p)[:2] == ["sleep", "60"] for p in tree),
            "the Bash call",
        )
        proc.send_signal(signum)
        proc.send_signal(signum)
        _, err = _finish(proc)
    assert proc.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert _alive(family) == []


def test_two_ctrl_c_while_subagents_run_print_no_traceback(
    sample: Path, env: dict[str, str]
) -> None:
    """Ctrl-C at a terminal reaches the whole foreground process group: the coordinator, its
    workers and tool hosts, twice."""

    def route(request: RecordedRequest) -> Reply | None:
        if "[sub]" in json.dumps(request.messages[0]):
            return Reply.text("never finishes", hold_before_stop=True)
        return None

    main = [
        Reply(
            content=[
                {
                    "type": "tool_use",
                    "name": "dispatch_agent",
                    "input": {"description": f"survey {i}", "prompt": f"Survey {i}. [sub]"},
                }
                for i in range(2)
            ]
        )
    ]
    with FakeMessagesAPI(main, route=route) as api:
        proc = _start(
            ["-p", "survey", "--cwd", str(sample), "--permission-mode", "accept-edits"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )

        def held() -> int:
            return sum(
                1
                for r in api.requests
                if "[sub]" in json.dumps(r.messages[0]) and r.ended_at is None
            )

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and held() < 2:
            time.sleep(0.05)
        assert held() == 2, "the subagents never reached the model"
        family = _family(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = _finish(proc)
        api.release(10)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Traceback" not in out
    assert _alive(family) == []
