"""A session's background tasks: work that outlives the call that started it.

A background subagent (`dispatch_agent` with `run_in_background`) is a task: the call that
starts it returns at once with the task's id, the task runs in the registry's nursery, and when
it ends its notification (Claude Code's `<task-notification>`: id, status, summary, result)
waits in the registry's inbox until the conversation reaches a turn boundary, where the loop
adds it (`TaskRegistry.take_notes`; never inside a turn). `TaskStop` ends a task by id or name.

One registry per session owns every task's id, lifecycle and limits (`[limits] max_tasks`,
`task_time_s`), and nothing of it survives the session: leaving `running()` stops every task
still running (its cancel scope, shielded and bounded), and the processes each started are
stopped by what started them (a subagent's worker by the pool).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from xml.sax.saxutils import escape

import structlog
import trio

from orchestrator.events import EventSink, TaskChanged

__all__ = [
    "TASK_STOP_WAIT_S",
    "Task",
    "TaskEnd",
    "TaskError",
    "TaskKind",
    "TaskRegistry",
    "TaskStatus",
]

TaskKind = Literal["agent", "shell", "monitor", "workflow"]
TaskStatus = Literal["running", "completed", "failed", "stopped"]

TASK_STOP_WAIT_S = 10.0
"""Seconds the session's end waits for its tasks to stop (each is cancelled at once)."""
_RESULT_CHARS = 20_000
"""Characters of a task's result a notification carries (its head and tail)."""
EVENT_LINES = 100
"""Lines of a running task's events (a monitor's) one turn boundary carries; older ones are
counted and dropped."""
_EVENT_LINE_CHARS = 2_000


class TaskError(Exception):
    """A task that cannot start (the limit is reached) or is not known (`stop`): the
    message says which, for the model."""


@dataclass(frozen=True)
class TaskEnd:
    """How a task ended, as its notification tells it."""

    status: TaskStatus
    summary: str
    """One line: what ended and how (`Agent "survey billing" completed`)."""
    result: str = ""
    """What it produced for the model (a subagent's final text)."""


@dataclass
class Task:
    """One background task, as the registry and `/tasks` see it."""

    id: str
    kind: TaskKind
    description: str
    name: str | None = None
    """A name the model gave it (`dispatch_agent`'s `name`): `TaskStop` and `SendMessage`
    take it instead of the id."""
    tool_use_id: str | None = None
    output_file: Path | None = None
    """Where its output is written (a background shell's), which every sandbox can read."""
    output_bytes: int = 0
    """Bytes of output so far."""
    started: float = field(default_factory=time.monotonic)
    status: TaskStatus = "running"
    ended: float | None = None
    end: TaskEnd | None = None
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope, repr=False)
    _stopping: bool = field(default=False, repr=False)
    _done: trio.Event = field(default_factory=trio.Event, repr=False)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def label(self) -> str:
        """How notifications name it: `Shell "dev server"`."""
        return _label(self.kind, self.description)

    def notification(self) -> str:
        """Claude Code's `<task-notification>` for this task's end."""
        end = self.end or TaskEnd("stopped", f"{self.description} was stopped")
        result = end.result
        if len(result) > _RESULT_CHARS:
            half, cut = _RESULT_CHARS // 2, len(result) - _RESULT_CHARS
            result = f"{result[:half]}\n[... {cut} characters ...]\n{result[-half:]}"
        return _notification(
            self.id,
            end.status,
            end.summary,
            output_file=self.output_file,
            element=("result", result) if result else None,
        )


@dataclass
class _Events:
    """A running task's events since the last turn boundary (a monitor's output lines): one
    notification, `status` running."""

    task: Task
    lines: list[str] = field(default_factory=list)
    dropped: int = 0

    def add(self, line: str) -> None:
        if len(line) > _EVENT_LINE_CHARS:
            line = line[: _EVENT_LINE_CHARS - 1] + "…"
        self.lines.append(line)
        if len(self.lines) > EVENT_LINES:
            del self.lines[0]
            self.dropped += 1

    def notification(self) -> str:
        count = len(self.lines) + self.dropped
        summary = f"{self.task.label}: {count} new line{'' if count == 1 else 's'}"
        if self.dropped:
            summary += f" (the first {self.dropped} dropped)"
        return _notification(
            self.task.id, "running", summary, element=("events", "\n".join(self.lines))
        )


TaskBody = Callable[[Task], Awaitable[TaskEnd]]
"""What a task does, to its end (how it ended); cancelled when the task is stopped."""


class TaskRegistry:
    """The session's background tasks and the notifications they leave for the model.

    `running()` holds the nursery tasks run in; `start` starts one (at most `max_tasks` at
    once), `stop` ends one, `take_notes` drains what ended since the last turn boundary, and
    `wait` lets a headless run wait for the agents and monitors that will still notify it.
    """

    def __init__(
        self,
        *,
        max_tasks: int = 16,
        time_limit_s: float = math.inf,
        emit: EventSink | None = None,
    ) -> None:
        """`emit`: told each task's start, events and end as they happen (`TaskChanged`:
        stream-json, the transcript, the audit log, the REPL)."""
        self.max_tasks = max_tasks
        self.time_limit_s = time_limit_s
        self._emit = emit
        self._tasks: dict[str, Task] = {}
        self._notes: list[str | _Events] = []
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[TaskRegistry]:
        """Run tasks until the block ends; then stop every one still running.

        **Cancellation:** the tasks are cancelled with the block; their teardown (a worker's
        stop, a process group's kill) is shielded and bounded by each (`TASK_STOP_WAIT_S` at
        most here).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            finally:
                self._nursery = None
                for task in self._tasks.values():
                    if task.running:
                        task._stopping = True
                        task._scope.cancel()
                with trio.move_on_after(TASK_STOP_WAIT_S) as late:
                    for task in list(self._tasks.values()):
                        await task._done.wait()
                if late.cancelled_caught:
                    nursery.cancel_scope.cancel()

    # -- starting and stopping --

    def start(
        self,
        kind: TaskKind,
        description: str,
        body: TaskBody,
        *,
        id: str,
        name: str | None = None,
        tool_use_id: str | None = None,
        output_file: Path | None = None,
    ) -> Task:
        """Start `body` as a background task now; its `Task`.

        **Errors:** `TaskError` when no task may start (the registry is not running, or
        `max_tasks` are running), or `name` is taken by a running task.
        """
        if self._nursery is None:
            raise TaskError("background tasks are not available in this session")
        running = [t for t in self._tasks.values() if t.running]
        if len(running) >= self.max_tasks:
            raise TaskError(
                f"{len(running)} background tasks are running, the most this session allows "
                f"([limits] max_tasks = {self.max_tasks}); wait for one to end, or stop one "
                "with TaskStop"
            )
        if name is not None and any(t.name == name for t in running):
            raise TaskError(f"a running task is already named {name!r}; choose another name")
        task = Task(
            id, kind, description, name=name, tool_use_id=tool_use_id, output_file=output_file
        )
        self._tasks[id] = task
        self._nursery.start_soon(self._run, task, body)
        self._tell(task, "started")
        structlog.get_logger().info("task started", task_id=id, kind=kind)
        return task

    async def _run(self, task: Task, body: TaskBody) -> None:
        end: TaskEnd | None = None
        try:
            with task._scope, trio.move_on_after(self.time_limit_s) as limit:
                end = await body(task)
            if end is None:
                why = (
                    f"ran past [limits] task_time_s = {self.time_limit_s:g} s and was stopped"
                    if limit.cancelled_caught
                    else "was stopped"
                )
                end = TaskEnd("stopped", f"{task.label} {why}")
        except Exception as exc:  # a task's own failure is its notification, never ours
            end = TaskEnd("failed", f"{task.label} failed: {exc}")
        finally:
            task.end = end or TaskEnd("stopped", f"{task.label} was stopped")
            task.status = task.end.status
            task.ended = time.monotonic()
            if not task._stopping:  # stopped by TaskStop or the session's end: said there
                self._notes.append(task.notification())
            task._done.set()
            self._tell(task, "ended", task.end.summary)
            self._changed.set()
            self._changed = trio.Event()
            structlog.get_logger().info("task ended", task_id=task.id, status=task.status)

    def get(self, key: str) -> Task | None:
        """The task with id `key`, else the latest one named `key`."""
        task = self._tasks.get(key)
        if task is None:
            named = [t for t in self._tasks.values() if t.name == key]
            task = named[-1] if named else None
        return task

    async def stop(self, key: str) -> Task:
        """End the task `key` names (an id or a name) and what it started; the task, once
        it has stopped (bounded by `TASK_STOP_WAIT_S`).

        **Errors:** `TaskError` when no task is known by `key`.
        """
        task = self.get(key)
        if task is None:
            known = ", ".join(f"{t.id} ({t.description})" for t in self.tasks() if t.running)
            raise TaskError(
                f"no task is known by {key!r}"
                + (f"; running: {known}" if known else "; none is running")
            )
        if task.running:
            task._stopping = True
            task._scope.cancel()
            with trio.move_on_after(TASK_STOP_WAIT_S):
                await task._done.wait()
        return task

    def tasks(self) -> list[Task]:
        """Every task of the session, oldest first."""
        return list(self._tasks.values())

    def _tell(
        self, task: Task, phase: Literal["started", "progress", "ended"], text: str = ""
    ) -> None:
        if self._emit is None:
            return
        self._emit(
            TaskChanged(
                phase,
                task.id,
                task.kind,
                task.description,
                task.status,
                tool_use_id=task.tool_use_id,
                summary=text,
                output_file=None if task.output_file is None else str(task.output_file),
                duration_s=(task.ended or time.monotonic()) - task.started,
                output_bytes=task.output_bytes,
            )
        )

    # -- the inbox --

    def ended_before(self, tasks: list[dict[str, str]], why: str) -> None:
        """Tell the model, at the next turn boundary, of tasks an earlier process of this
        session started and did not see end (`task_id`, `kind`, `description` each): each
        ended with that process, `why`."""
        for task in tasks:
            label = _label(task.get("kind", "task"), task.get("description", ""))
            self._notes.append(_notification(task.get("task_id", ""), "stopped", f"{label} {why}"))

    def event(self, task: Task, line: str) -> None:
        """A running task's event (a line its monitor printed), for the next turn boundary:
        the lines of one task since the last boundary are one notification, at most
        `EVENT_LINES` of them."""
        if not task.running:
            return
        last = self._notes[-1] if self._notes else None
        if not (isinstance(last, _Events) and last.task is task):
            last = _Events(task)
            self._notes.append(last)
        last.add(line)
        self._tell(task, "progress", line)
        self._changed.set()
        self._changed = trio.Event()

    def take_notes(self) -> list[str]:
        """The notifications since the last call (the loop's turn boundary), in order: the
        tasks that ended, and the events of those still running; drained."""
        notes, self._notes = self._notes, []
        return [n if isinstance(n, str) else n.notification() for n in notes]

    def pending(self) -> bool:
        """Whether a notification waits for the next turn boundary."""
        return bool(self._notes)

    def waits(self) -> bool:
        """Whether a running agent, monitor or workflow will still notify the conversation (a
        shell does not keep a headless run waiting)."""
        return any(
            t.running and t.kind in ("agent", "monitor", "workflow") for t in self._tasks.values()
        )

    async def wait(self) -> None:
        """Return once a notification is waiting, or no agent or monitor runs.

        **Cancellation:** returns nothing; the tasks go on.
        """
        while not self._notes and self.waits():
            await self._changed.wait()


def _label(kind: str, description: str) -> str:
    return f'{kind.capitalize()} "{description}"'


def _notification(
    task_id: str,
    status: TaskStatus,
    summary: str,
    *,
    output_file: Path | None = None,
    element: tuple[str, str] | None = None,
) -> str:
    """Claude Code's `<task-notification>`; `element`: one more (`result`, `events`), by
    name and text."""
    lines = [
        "<task-notification>",
        f"<task-id>{escape(task_id)}</task-id>",
        *([f"<output-file>{escape(str(output_file))}</output-file>"] if output_file else []),
        f"<status>{status}</status>",
        f"<summary>{escape(summary)}</summary>",
        *([f"<{element[0]}>{escape(element[1])}</{element[0]}>"] if element else []),
        "</task-notification>",
    ]
    return "\n".join(lines)
