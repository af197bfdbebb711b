"""Background tasks as people see them: one line per task, the tail of its output (`/tasks`
in the REPL, its panel line)."""

from __future__ import annotations

import os
import time

from orchestrator.tasks.registry import Task
from orchestrator.text import escape_controls

__all__ = ["output_tail", "running_line", "task_rows"]

TAIL_BYTES = 4_000
"""How much of a task's output file `/tasks ID` shows (its end)."""


def _age(task: Task) -> str:
    seconds = (task.ended or time.monotonic()) - task.started
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def task_rows(tasks: list[Task]) -> list[str]:
    """One line per task: id, kind, status, age, description, output size or end."""
    rows = []
    for task in tasks:
        status = task.status
        more = ""
        if task.output_file is not None:
            more = f" · {task.output_bytes} bytes → {task.output_file}"
        elif task.end is not None and not task.running:
            more = f" · {task.end.summary}"
        rows.append(
            escape_controls(
                f"{task.id}  {task.kind:7}  {status:9}  {_age(task):>5}  "
                f"{task.description}{more}"
            )
        )
    return rows


def running_line(tasks: list[Task]) -> str | None:
    """The panel's line while tasks run (`2 tasks: bash-1a2b (dev server), …`); None when
    none does."""
    running = [t for t in tasks if t.running]
    if not running:
        return None
    shown = ", ".join(f"{t.id} ({t.description[:30]})" for t in running[:3])
    more = f", +{len(running) - 3}" if len(running) > 3 else ""
    noun = "task" if len(running) == 1 else "tasks"
    return escape_controls(f"{len(running)} background {noun}: {shown}{more} · /tasks")


def output_tail(task: Task) -> str:
    """The end of the task's output file (a shell's), or its result once it has ended (an
    agent's, a monitor's); empty when there is neither. The file is the coordinator's own
    (orchestrator/tasks/outputs.py), opened without following a link."""
    if task.output_file is not None:
        try:
            fd = os.open(task.output_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return ""
        try:
            size = os.fstat(fd).st_size
            os.lseek(fd, max(0, size - TAIL_BYTES), os.SEEK_SET)
            data = os.read(fd, TAIL_BYTES)
        finally:
            os.close(fd)
        return data.decode("utf-8", errors="replace")
    if task.end is not None:
        return task.end.result[-TAIL_BYTES:]
    return ""
