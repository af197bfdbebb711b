"""The session's background tasks (orchestrator/tasks/registry.py), in process with trio's
clock: a task's end is a notification in the inbox; `stop` ends one by id or name without
one; the limits refuse a task too many and stop one that runs too long; leaving `running()`
stops every task; `wait` returns at a notification or once no agent waits."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from orchestrator.tasks.registry import Task, TaskEnd, TaskError, TaskRegistry


async def _forever(task: Task) -> TaskEnd:
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _after(seconds: float, result: str = "done") -> object:
    async def body(task: Task) -> TaskEnd:
        await trio.sleep(seconds)
        return TaskEnd("completed", f"{task.description} finished", result)

    return body


async def test_an_ended_task_notifies_and_a_stopped_one_does_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = TaskRegistry(max_tasks=4)
    async with registry.running():
        registry.start("agent", "survey", _after(1, "report <x>"), id="t1")  # type: ignore[arg-type]
        registry.start("agent", "slow", _forever, id="t2", name="slow")
        assert registry.waits()
        await registry.wait()
        [note] = registry.take_notes()
        assert "<task-id>t1</task-id>" in note and "<status>completed</status>" in note
        assert "report &lt;x&gt;" in note  # the result is escaped
        stopped = await registry.stop("slow")
        assert stopped.status == "stopped" and not registry.waits()
        assert registry.take_notes() == []
        with pytest.raises(TaskError, match="no task is known by 'nope'"):
            await registry.stop("nope")


async def test_the_limits_refuse_one_too_many_and_stop_one_too_long(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = TaskRegistry(max_tasks=1, time_limit_s=5)
    async with registry.running():
        registry.start("monitor", "watch", _forever, id="m1")
        with pytest.raises(TaskError, match="max_tasks = 1"):
            registry.start("agent", "more", _forever, id="a1")
        await registry.wait()
        [note] = registry.take_notes()
        assert "<status>stopped</status>" in note and "task_time_s = 5 s" in note


async def test_a_failing_task_notifies_its_failure_and_the_end_stops_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def broken(task: Task) -> TaskEnd:
        raise RuntimeError("the worker died")

    registry = TaskRegistry()
    async with registry.running():
        registry.start("agent", "broken", broken, id="b1")
        registry.start("shell", "server", _forever, id="s1")
        await registry.wait()
        [note] = registry.take_notes()
        assert "<status>failed</status>" in note and "the worker died" in note
        assert not registry.waits(), "a shell does not keep a run waiting"
    assert [t.status for t in registry.tasks()] == ["failed", "stopped"]
    with pytest.raises(TaskError, match="not available"):
        registry.start("agent", "late", _forever, id="late")
