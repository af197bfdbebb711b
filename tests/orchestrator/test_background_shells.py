"""Background shells in process (orchestrator/tasks/shells.py), real bash processes, no sandbox:
a `run_in_background` Bash call returns at once with its task id and output file; the
command's bytes land in that file; its end is a notification that says how it ended (exit
code, time limit); TaskStop kills it and what it started; the output file stays bounded; the
output directory refuses a link, another's directory and one open to others; the next
session removes what a killed one left, not what a live one holds; a subagent's Bash refuses
the background. The sandboxed path, through the real CLI, is
tests/orchestrator/test_background_shells_e2e.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from pydantic import ValidationError

from orchestrator.calls.pipeline import InProcessRunner
from orchestrator.calls.plan import CallPlan, Verdict
from orchestrator.errors import ToolError
from orchestrator.messages import ToolUseBlock
from orchestrator.tasks.monitor import MonitorTool
from orchestrator.tasks.outputs import TaskOutputError, TaskOutputs, outputs_root
from orchestrator.tasks.registry import Task, TaskRegistry
from orchestrator.tasks.shells import BackgroundShells
from orchestrator.tools.base import Checked, ToolContext, ToolOutput
from orchestrator.tools.bash import MAX_BACKGROUND_TIMEOUT_MS, MAX_TIMEOUT_MS, BashTool


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[ToolContext]:
    workspace = (tmp_path / "ws").resolve()
    workspace.mkdir()
    context = ToolContext(workspace=workspace, cwd=workspace)
    try:
        yield context
    finally:
        await context.aclose()


def _plan(tool: BashTool, **raw: Any) -> CallPlan:
    block = ToolUseBlock(id=f"toolu_{abs(hash(str(raw))) % 10**8}", name="Bash", input=raw)
    return CallPlan(
        block, tool, tool.parse_input(raw), None, Verdict(True, "read-only (test)", True)
    )


async def _start(shells: BackgroundShells, ctx: ToolContext, **raw: Any) -> tuple[str, Path]:
    """Start a background command; its task id and output file, from the call's result."""
    plan = _plan(BashTool(), run_in_background=True, **raw)
    items = [item async for item in shells.call(plan, ctx, validate=True)]
    assert items[0] == Checked(None)
    [result] = items[1:]
    assert isinstance(result, ToolOutput) and not result.is_error
    found = re.search(r"ID: (bash-[0-9a-f]+)\. Output is being written to: (\S+)", result.content)
    assert found, result.content
    return found[1], Path(found[2])


async def _ended(registry: TaskRegistry, task_id: str) -> Task:
    task = registry.get(task_id)
    assert task is not None
    with trio.fail_after(20):
        while task.running:  # noqa: ASYNC110
            await trio.sleep(0.02)
    return task


@pytest.fixture
def outputs(tmp_path: Path) -> TaskOutputs:
    root = tmp_path / f"warren-{os.getuid()}" / "ws-1" / "tasks"
    return TaskOutputs(root, "session-1", limit_bytes=2_000)


async def test_a_background_command_returns_at_once_and_notifies_its_exit_code(
    ctx: ToolContext, outputs: TaskOutputs
) -> None:
    registry = TaskRegistry()
    runner = InProcessRunner()
    shells = BackgroundShells(runner, direct=runner, tasks=registry, outputs=outputs)
    async with registry.running():
        with trio.fail_after(5):  # the call does not wait for the command
            task_id, path = await _start(
                shells,
                ctx,
                command="printf 'one\\ntwo\\n'; sleep 0.5; echo three >&2; exit 3",
                description="count",
            )
        assert path == outputs.path(task_id) and path.parent.stat().st_mode & 0o777 == 0o700
        task = await _ended(registry, task_id)
        assert task.status == "failed" and task.kind == "shell"
        assert path.read_bytes() == b"one\ntwo\nthree\n"
        [note] = registry.take_notes()
        assert f"<task-id>{task_id}</task-id>" in note and "<status>failed</status>" in note
        assert 'Background command "count" failed with exit code 3' in note
        assert "three" in note, "the notification carries the last output"
        assert f"<output-file>{path}</output-file>" in note


async def test_the_time_limit_and_task_stop_kill_the_command_and_what_it_started(
    ctx: ToolContext, outputs: TaskOutputs
) -> None:
    registry = TaskRegistry()
    runner = InProcessRunner()
    shells = BackgroundShells(runner, direct=runner, tasks=registry, outputs=outputs)
    async with registry.running():
        timed, _ = await _start(shells, ctx, command="echo up; sleep 30", timeout=500)
        task = await _ended(registry, timed)
        assert task.status == "failed"
        [note] = registry.take_notes()
        assert "timed out after 0.5 s and was stopped" in note and "up" in note

        marker = "sleep 31.4159"
        server, path = await _start(
            shells, ctx, command=f"(while true; do echo tick; {marker}; done) & wait"
        )
        with trio.fail_after(10):
            while not _with(marker):  # noqa: ASYNC110
                await trio.sleep(0.05)
        stopped = await registry.stop(server)
        assert stopped.status == "stopped"
        with trio.fail_after(10):
            while _with(marker):  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert registry.take_notes() == [], "a stopped task is not notified"
        assert b"tick" in path.read_bytes()


def _with(marker: str) -> list[int]:
    """The live processes of this test whose command line holds `marker`."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if marker in " ".join(process.cmdline()) and process.status() != "zombie":
                found.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return found


async def test_the_output_file_stays_bounded(ctx: ToolContext, outputs: TaskOutputs) -> None:
    registry = TaskRegistry()
    runner = InProcessRunner()
    shells = BackgroundShells(runner, direct=runner, tasks=registry, outputs=outputs)
    async with registry.running():
        task_id, path = await _start(
            shells, ctx, command="for i in $(seq 1 3000); do echo line-$i; done"
        )
        task = await _ended(registry, task_id)
        assert task.status == "completed" and task.output_bytes > 20_000
    data = path.read_text()
    assert len(data) <= outputs.limit_bytes
    assert data.startswith("[warren: ") and "bytes of earlier output dropped" in data
    assert data.endswith("line-3000\n")


async def test_without_an_output_directory_or_with_bad_input_nothing_starts(
    ctx: ToolContext,
) -> None:
    registry = TaskRegistry()
    runner = InProcessRunner()
    shells = BackgroundShells(
        runner, direct=runner, tasks=registry, outputs=None, unavailable="no place for output"
    )
    async with registry.running():
        calling = shells.call(_plan(BashTool(), command="true", run_in_background=True), ctx)
        with pytest.raises(ToolError, match="not available in this session: no place"):
            [item async for item in calling]
        # bash cannot parse it: refused before it starts
        plan = _plan(BashTool(), command="if true; then", run_in_background=True)
        items = [item async for item in shells.call(plan, ctx, validate=True)]
        assert len(items) == 1 and isinstance(items[0], Checked)
        assert items[0].refusal is not None and "bash cannot parse it" in items[0].refusal
        # a subagent's Bash has no tasks to keep one in
        sub = BashTool(backgrounds=False)
        refusal = await sub.validate(
            sub.parse_input({"command": "true", "run_in_background": True}), ctx
        )
        assert refusal is not None and "not available here" in refusal
    assert registry.tasks() == []
    tool = BashTool()
    tool.parse_input(
        {"command": "x", "timeout": MAX_BACKGROUND_TIMEOUT_MS, "run_in_background": True}
    )
    with pytest.raises(ValidationError, match="at most 600000 ms for a foreground command"):
        tool.parse_input({"command": "x", "timeout": MAX_TIMEOUT_MS + 1})
    with pytest.raises(ValidationError):
        tool.parse_input(
            {"command": "x", "timeout": MAX_BACKGROUND_TIMEOUT_MS + 1, "run_in_background": True}
        )


def test_the_output_directory_refuses_a_link_another_users_and_an_open_one(
    tmp_path: Path,
) -> None:
    base = tmp_path / f"warren-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    base.symlink_to(elsewhere)
    with pytest.raises(TaskOutputError, match="not a directory"):
        TaskOutputs(base / "ws" / "tasks", "s", limit_bytes=100).create("t1")
    assert list(elsewhere.iterdir()) == [], "nothing was made through the link"
    base.unlink()
    base.mkdir(mode=0o755)
    with pytest.raises(TaskOutputError, match="open to other users"):
        TaskOutputs(base / "ws" / "tasks", "s", limit_bytes=100).create("t1")
    base.chmod(0o700)
    made = TaskOutputs(base / "ws" / "tasks", "s", limit_bytes=100).create("t1")
    made.close()
    assert made.path.stat().st_mode & 0o777 == 0o600
    if os.getuid() == 0:
        os.chown(base / "ws", 12345, 12345)
        with pytest.raises(TaskOutputError, match="belongs to another user"):
            TaskOutputs(base / "ws" / "tasks", "s", limit_bytes=100).create("t2")


_SESSION = """
import os, sys
from pathlib import Path
from orchestrator.tasks.outputs import TaskOutputs
outputs = TaskOutputs.open(Path(sys.argv[1]), sys.argv[2], limit_bytes=100, base=Path(sys.argv[3]))
outputs.create("t1").close()
print("ready", flush=True)
if sys.argv[4] == "killed":
    os._exit(0)  # as SIGKILL would: no remove()
sys.stdin.read()
"""


def _session_process(tmp_path: Path, session_id: str, end: str) -> subprocess.Popen[str]:
    """A process that opens the workspace's outputs as session `session_id`, writes a file,
    then ends without removing anything (`killed`) or lives until its stdin closes."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SESSION, str(tmp_path / "ws"), session_id, str(tmp_path), end],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_the_next_session_removes_what_a_killed_one_left(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    live = _session_process(tmp_path, "live-session", "live")
    try:
        killed = _session_process(tmp_path, "killed-session", "killed")
        killed.communicate(timeout=30)
        assert killed.returncode == 0
        tasks = outputs_root(tmp_path / "ws", base=tmp_path)
        owners = tasks.parent / "owners"
        assert (tasks / "killed-session" / "t1.output").exists()
        assert sorted(p.name for p in owners.iterdir()) == [
            "killed-session.lock",
            "live-session.lock",
        ]
        outputs = TaskOutputs.open(tmp_path / "ws", "next", limit_bytes=100, base=tmp_path)
        assert not (tasks / "killed-session").exists()  # its owner is gone
        assert (tasks / "live-session" / "t1.output").exists()  # its owner lives
        assert sorted(p.name for p in owners.iterdir()) == ["live-session.lock", "next.lock"]
        outputs.create("t1").close()
        outputs.remove()
        assert not (tasks / "next").exists() and not (owners / "next.lock").exists()
    finally:
        live.communicate(timeout=30)  # its stdin closed: it ends, and its lock goes with it
    TaskOutputs.open(tmp_path / "ws", "last", limit_bytes=100, base=tmp_path).remove()
    assert list(tasks.iterdir()) == [] and list(owners.iterdir()) == []


async def _monitor(tool: MonitorTool, ctx: ToolContext, **raw: Any) -> str:
    input = tool.parse_input(raw)
    refusal = await tool.validate(input, ctx)
    assert refusal is None, refusal
    [result] = [item async for item in tool.call(input, ctx)]
    assert isinstance(result, ToolOutput) and not result.is_error
    found = re.search(r"ID: (monitor-[0-9a-f]+)", result.content)
    assert found, result.content
    return found[1]


async def test_a_monitor_gives_each_line_as_an_event_then_its_end(ctx: ToolContext) -> None:
    registry = TaskRegistry()
    tool = MonitorTool(registry, InProcessRunner(), BashTool())
    async with registry.running():
        watch = await _monitor(
            tool,
            ctx,
            description="count to three",
            command="for i in 1 2 3; do echo line-$i; sleep 0.1; done; printf 'last'",
        )
        assert registry.waits(), "a monitor keeps a headless run waiting"
        await _ended(registry, watch)
        notes = registry.take_notes()
        events = "\n".join(notes[:-1])
        assert "<status>running</status>" in events
        assert all(f"line-{i}" in events for i in (1, 2, 3)) and "last" in events
        assert f"<task-id>{watch}</task-id>" in notes[-1]
        assert "<status>completed</status>" in notes[-1] and "(4 lines)" in notes[-1]

        late = await _monitor(
            tool, ctx, description="never", command="echo armed; sleep 30.0731", timeout_ms=500
        )
        ended = await _ended(registry, late)
        notes = registry.take_notes()
        assert ended.status == "completed", (ended.end, notes)
        [event, end] = notes
        assert "armed" in event and "reached its deadline (0.5 s) after 1 line" in end
    input = tool.parse_input({"description": "socket", "ws": {"url": "ws://127.0.0.1:1"}})
    refusal = await tool.validate(input, ctx)
    assert refusal is not None and "no network" in refusal
    capped = tool.parse_input({"description": "x", "command": "true", "timeout_ms": 10**9})
    assert capped.timeout_ms == 10**9  # capped when it runs, as Claude Code's is
