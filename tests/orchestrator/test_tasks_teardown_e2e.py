"""Nothing of a session's background tasks is left behind (issue 34, item 9), through the real
`warren` CLI: real tool hosts and pool workers under the floor, the real SDK against the fake
Messages API.

The main agent starts, in one turn, every kind of background task at once: a read-only
endless loop (the read-only tool host) with a loop of its own in a subshell, a writing one
(the read-write tool host) with a loop it moved to a session of its own (`setsid`), a Monitor
whose watch never ends, and a background subagent whose model reply the fake API holds. Each
loop sleeps a duration no other process on the machine sleeps (its marker). Once all of
them run, the session ends in one of the ways a user ends it: SIGTERM, SIGHUP or SIGINT to
the `warren` process alone (`kill PID`), the run's own end, SIGKILL (of `warren` in process,
and of the thin client that ran the session in the suite's warm server), and in the REPL
Ctrl-C twice (the terminal signals the whole foreground group), `/exit` and a closed
terminal. Afterwards no process with a marker is left, nor any process of the session's tree
(its tool hosts, workers, bwraps; in process, also every process naming the workspace), and
the session's output directory is gone. After SIGKILL, which no process can handle, the
sandboxes still die with `warren` (bwrap's `--die-with-parent`, their pid namespaces), and the
next session of the workspace removes the directory it left.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.tasks.outputs import outputs_root
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.server_processes import servers_in
from tests.kit.tty import Terminal

# Each test but the thin client's watches the process tree of the `warren` it started: no
# server in between (`in_process`).
pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
DEADLINE_S = 90.0
"""How long a process may take to appear or to go on a loaded machine (polled, never slept)."""


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-left-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "a.txt").write_text("a\n")
    outputs = outputs_root(path / "ws").parent  # the workspace's, in /tmp/warren-<uid>
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(outputs, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI) -> dict[str, str]:
    """The environment of a `warren` in process (of the suite's server, without
    `WARREN_NO_SERVER`)."""
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-left",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
    }


@dataclass
class Markers:
    """The sleep durations only this test's loops sleep."""

    loop: str = field(default_factory=lambda: _marker("0.21"))
    loop_child: str = field(default_factory=lambda: _marker("0.22"))
    writer: str = field(default_factory=lambda: _marker("0.23"))
    escaped: str = field(default_factory=lambda: _marker("0.24"))
    monitor: str = field(default_factory=lambda: _marker("0.25"))

    def all(self) -> tuple[str, ...]:
        return (self.loop, self.loop_child, self.writer, self.escaped, self.monitor)


def _marker(prefix: str) -> str:
    return f"{prefix}{random.randrange(10**6):06d}"


def _is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _start_everything(marks: Markers, *, with_monitor: bool) -> Reply:
    """The main agent's first turn: every kind of background task (the Monitor but
    without `with_monitor`)."""
    loop = (
        f"(while true; do sleep {marks.loop_child}; done) & "
        f"while true; do echo tick; sleep {marks.loop}; done"
    )
    writer = (
        f"setsid bash -c 'while true; do sleep {marks.escaped}; done' & "
        f"while true; do date > w.txt; sleep {marks.writer}; done"
    )
    watch = f"echo watching; while true; do sleep {marks.monitor}; done"
    calls = [
        {"type": "tool_use", "id": "toolu_loop", "name": "Bash",
         "input": {"command": loop, "run_in_background": True, "description": "loop"}},
        {"type": "tool_use", "id": "toolu_writer", "name": "Bash",
         "input": {"command": writer, "run_in_background": True, "description": "writer"}},
        {"type": "tool_use", "id": "toolu_watch", "name": "Monitor",
         "input": {"command": watch, "description": "watch"}},
        {"type": "tool_use", "id": "toolu_agent", "name": "dispatch_agent",
         "input": {"description": "survey", "prompt": "Survey the code.",
                   "run_in_background": True}},
    ]  # fmt: skip
    return Reply(content=[c for c in calls if with_monitor or c["name"] != "Monitor"])


@dataclass
class Scenario:
    """The fake API's side of a session that starts every kind of background task."""

    marks: Markers = field(default_factory=Markers)
    with_monitor: bool = True
    started: dict[str, str] = field(default_factory=dict)
    """Each start call's result text, by tool_use id."""

    def route(self, request: RecordedRequest) -> FakeResponse:
        if _is_subagent(request):
            return Reply.text("report: the code is fine", hold_before_stop=True)
        if len(request.messages) == 1:
            return _start_everything(self.marks, with_monitor=self.with_monitor)
        if len(request.messages) == 3:
            for block in request.messages[-1]["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self.started[block["tool_use_id"]] = _text(block)
            return Reply.text("Started; waiting.")
        if "report: the code is fine" in json.dumps(request.messages[-1]):
            return Reply.text("All done.")
        return Reply.text("Still waiting.")

    def output_dir(self) -> Path:
        """The session's output directory, from the loop's output file."""
        found = re.search(r"written to: (\S+)", self.started.get("toolu_loop", ""))
        assert found is not None, self.started
        return Path(found.group(1)).parent


def _text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


# -- the host's processes --


def _loops(marks: Markers) -> dict[str, list[psutil.Process]]:
    """By marker, each process sleeping it and that sleep's parent (the loop's bash), in one
    scan of the host's processes. A scan lists the pids first: a sleep that ends during it
    is missed, and so is the next one, started after the listing."""
    wanted = set(marks.all())
    found: dict[str, list[psutil.Process]] = {}
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) == 2 and cmdline[0] == "sleep" and cmdline[1] in wanted:
            try:
                found.setdefault(cmdline[1], []).extend([proc, psutil.Process(proc.info["ppid"])])
            except psutil.NoSuchProcess:
                pass
    return found


def _markers_running(marks: Markers) -> set[str]:
    """The markers some process sleeps now. It may miss one (see `_loops`); once the loops'
    bashes are gone no sleep starts again, and then an empty answer is the truth."""
    return set(_loops(marks))


def _of_session(home: Path) -> list[psutil.Process]:
    """Processes naming the test's directory (the workspace) in their command lines: the
    tool hosts' and workers' bwraps, the sandboxes' inits."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and str(home) in " ".join(proc.info["cmdline"]):
            found.append(proc)
    return found


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmdline(process: psutil.Process) -> str:
    """Its command line; empty once it has ended."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
        except psutil.Error:
            pass
    return left


def _wait(until: Callable[[], bool]) -> bool:
    """Until `until()` holds, at most `DEADLINE_S`; whether it did. What it waits for is
    another process's doing, seen from outside: no event to wait on."""
    deadline = time.monotonic() + DEADLINE_S
    while not until():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _poll(until: Callable[[], bool], what: str) -> None:
    assert _wait(until), f"{what}: not within {DEADLINE_S} s"


def _held(api: FakeMessagesAPI) -> int:
    return sum(1 for r in api.requests if _is_subagent(r) and r.ended_at is None)


def _wait_running(scenario: Scenario, api: FakeMessagesAPI) -> list[psutil.Process]:
    """Until every loop has been seen sleeping (the monitor's too) and the subagent's reply
    is held; the loops' processes, their bashes among them."""
    marks = scenario.marks
    wanted = set(marks.all()) if scenario.with_monitor else set(marks.all()) - {marks.monitor}
    seen: dict[str, list[psutil.Process]] = {}

    def running() -> bool:
        for marker, processes in _loops(marks).items():
            seen.setdefault(marker, []).extend(processes)
        return set(seen) >= wanted and _held(api) == 1

    _poll(running, "the tasks running")
    _poll(lambda: "toolu_loop" in scenario.started, "the start calls' results")
    return list({p.pid: p for processes in seen.values() for p in processes}.values())


@dataclass
class Watched:
    """What ran, seen while it ran: to be gone afterwards."""

    processes: list[psutil.Process]

    @classmethod
    def now(
        cls, loops: list[psutil.Process], pid: int, home: Path, *, named: bool = True
    ) -> Watched:
        """The loops' processes, the tree of `pid` (the coordinator), and with `named` every
        process naming the workspace."""
        processes = [*loops, *_tree(pid)]
        if named:
            processes += _of_session(home)
        # Workers and bwraps of the session: the tree must hold sandboxes of all kinds.
        assert any("bwrap" in _cmdline(p) for p in processes)
        return cls(processes)

    def assert_gone(self, scenario: Scenario, home: Path, *, named: bool = True) -> None:
        """Nothing of the session is left (polled: a pid namespace's end is the kernel's,
        after bwrap's); with `named`, no process naming the workspace either."""
        _wait(lambda: not _alive(self.processes))
        assert _alive(self.processes) == []
        # The loops' bashes are gone: a sleep of theirs still running is seen now.
        _wait(lambda: not _markers_running(scenario.marks))
        assert _markers_running(scenario.marks) == set()
        if named:
            _wait(lambda: not _alive(_of_session(home)))
            assert _alive(_of_session(home)) == []


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WARREN, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _headless(home: Path) -> list[str]:
    return ["-p", "go", "--cwd", str(home / "ws"), "--permission-mode", "bypassPermissions"]


@pytest.mark.in_process
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_warren_stops_every_background_task(home: Path, signum: signal.Signals) -> None:
    """The signal reaches the `warren` process alone (`kill PID`), not its children: the
    coordinator stops them all."""
    scenario = Scenario()
    with FakeMessagesAPI(route=scenario.route) as api:
        proc = _start(_headless(home), _env(home, api))
        try:
            loops = _wait_running(scenario, api)
            watched = Watched.now(loops, proc.pid, home)
            proc.send_signal(signum)
            _, err = _finish(proc)
        finally:
            api.release(10)
    assert proc.returncode == 128 + signum, err
    # A line saying the run was interrupted, then how to resume it; nothing else.
    lines = err.strip().splitlines()
    assert lines[0] == "warren: run ended: interrupted: The run was interrupted.", err
    assert len(lines) == 2 and lines[1].startswith("warren: session "), err
    watched.assert_gone(scenario, home)
    assert not scenario.output_dir().exists()


@pytest.mark.in_process
def test_the_end_of_a_run_stops_the_background_commands_it_leaves(home: Path) -> None:
    """The run ends once the subagent has reported, its background commands still running."""
    scenario = Scenario(with_monitor=False)
    with FakeMessagesAPI(route=scenario.route) as api:
        proc = _start([*_headless(home), "--output-format", "json"], _env(home, api))
        try:
            loops = _wait_running(scenario, api)
            watched = Watched.now(loops, proc.pid, home)
            api.release()  # the subagent reports; the main agent ends its run
            out, err = _finish(proc)
        finally:
            api.release(10)
    assert proc.returncode == 0, err
    assert json.loads(out)["result"] == "All done."
    watched.assert_gone(scenario, home)
    assert not scenario.output_dir().exists()


@pytest.mark.in_process
def test_sigkill_of_warren_takes_every_sandbox_along_and_the_next_session_cleans_up(
    home: Path,
) -> None:
    scenario = Scenario()
    with FakeMessagesAPI(route=scenario.route) as api:
        proc = _start(_headless(home), _env(home, api))
        try:
            loops = _wait_running(scenario, api)
            watched = Watched.now(loops, proc.pid, home)
            proc.kill()
            _finish(proc)
        finally:
            api.release(10)
    assert proc.returncode == -signal.SIGKILL
    watched.assert_gone(scenario, home)

    # No process could remove the session's output directory: the workspace's next session
    # does (its owner is gone).
    left = scenario.output_dir()
    assert left.is_dir()
    with FakeMessagesAPI([Reply.text("hello")]) as api:
        done = subprocess.run(
            [*WARREN, *_headless(home)], env=_env(home, api), capture_output=True, text=True,
            timeout=DEADLINE_S * 2,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not left.exists()
    assert left.parent.is_dir()  # the workspace's directory itself stays


@pytest.mark.skipif(
    os.environ.get("WARREN_TEST_SERVER") == "0", reason="the suite runs without a warm server"
)
def test_sigkill_of_the_thin_client_ends_the_session_it_ran(home: Path) -> None:
    """Through the suite's warm server, `warren` is a thin client and the coordinator a
    session process the server forked: the client's death closes its socket, which the
    session reads as SIGHUP (orchestrator/cli/client.py), and it stops everything it
    started. (What the server starts afterwards for the workspace's next session, its warm
    tool hosts, is the server's.)"""
    scenario = Scenario()
    with FakeMessagesAPI(route=scenario.route) as api:
        env = {k: v for k, v in _env(home, api).items() if k != "WARREN_NO_SERVER"}
        proc = _start(_headless(home), env)
        try:
            loops = _wait_running(scenario, api)
            assert _tree(proc.pid) == [], "the run did not go through the server"
            session = _session_process(loops)
            watched = Watched.now(loops, session.pid, home, named=False)
            watched.processes.append(session)
            proc.kill()
            _finish(proc)
        finally:
            api.release(10)
    assert proc.returncode == -signal.SIGKILL
    watched.assert_gone(scenario, home, named=False)
    assert not scenario.output_dir().exists()


def _session_process(loops: list[psutil.Process]) -> psutil.Process:
    """The server's session process that runs the loops: their ancestor forked by the
    server (its environment names the server's directory)."""
    sessions = {p.pid for p in servers_in(Path(os.environ["WARREN_SERVER_DIR"]))}
    for process in loops:
        try:
            parents = process.parents()
        except psutil.Error:  # a sleep that ended meanwhile: the next one is asked
            continue
        for parent in parents:
            if parent.pid in sessions:
                return parent
    raise AssertionError("no session process of the server runs the loops")


# -- the interactive session --

PROMPT = r"\n> ?(\n|$)"
"""The empty prompt line: the toolbar of running tasks may be below it."""


@pytest.mark.in_process
@pytest.mark.parametrize("how", ["ctrl-c", "exit", "hangup"])
def test_leaving_the_repl_stops_every_background_task(home: Path, tmp_path: Path, how: str) -> None:
    """Ctrl-C at a terminal reaches the whole foreground process group (the coordinator and
    its children alike); `/exit` ends the session with the tasks still running; a closed
    terminal is SIGHUP from the kernel."""
    scenario = Scenario()
    screen = ""
    with FakeMessagesAPI(route=scenario.route) as api:
        terminal = Terminal.start(
            [*WARREN, "--permission-mode", "bypassPermissions"],
            env=_env(home, api),
            cwd=home / "ws",
            socket_dir=tmp_path,
        )
        try:
            terminal.wait_for(r"/help for commands", timeout=DEADLINE_S)
            terminal.wait_for(PROMPT)
            terminal.type("start everything")
            terminal.press("Enter")
            terminal.wait_for(r"Started; waiting\.", timeout=DEADLINE_S)
            terminal.wait_for(PROMPT)
            loops = _wait_running(scenario, api)
            pid = terminal.pid()
            assert pid is not None
            warren = psutil.Process(pid)
            watched = Watched.now(loops, pid, home)
            if how == "ctrl-c":
                terminal.press("C-c")
                terminal.wait_for(r"press Ctrl-C again to exit")
                terminal.press("C-c")
            elif how == "exit":
                terminal.type("/exit")
                terminal.press("Enter")
            if how == "hangup":
                terminal.close()
            else:
                assert terminal.wait_exit(DEADLINE_S) == 0
                screen = terminal.screen()
            warren.wait(DEADLINE_S)
        finally:
            api.release(10)
            terminal.close()
    assert "Traceback" not in screen, screen
    watched.assert_gone(scenario, home)
    assert not scenario.output_dir().exists()
