"""The TaskStop tool: end a background task (an agent, a shell, a monitor) and everything it
started, by its id or the name it was given.

Claude Code's `TaskStopInput` (`task_id`; `shell_id`, its older spelling, taken too). It runs in
the coordinator, where the session's tasks are (orchestrator/tasks/registry.py), and touches no
file: it is read-only, and runs without asking.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from pydantic import Field, model_validator

from orchestrator.errors import ToolError
from orchestrator.tasks.registry import TaskError, TaskRegistry
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts

__all__ = ["TaskStopInput", "TaskStopTool"]

DESCRIPTION = """\
Stops a running background task (a subagent started with run_in_background, a background \
Bash command, a Monitor) and everything it started. Give the task's id (returned when it \
started) or the name you gave it. A stopped task sends no notification."""


class TaskStopInput(ToolInput):
    task_id: str | None = Field(
        default=None, description="The id (or name) of the background task to stop."
    )
    shell_id: str | None = Field(
        default=None, description="Deprecated: use task_id (a background shell's id)."
    )

    @model_validator(mode="after")
    def _one(self) -> TaskStopInput:
        if not (self.task_id or self.shell_id):
            raise ValueError("give task_id: the id or name of the task to stop")
        return self


class TaskStopTool(Tool[TaskStopInput]):
    name: ClassVar[str] = "TaskStop"
    facts: ClassVar[ToolFacts] = ToolFacts(family="meta", runs_in_coordinator=True)
    input_model: ClassVar[type[ToolInput]] = TaskStopInput
    description: ClassVar[str] = DESCRIPTION
    read_only: ClassVar[bool] = True

    def __init__(self, tasks: TaskRegistry) -> None:
        self._tasks = tasks

    async def call(
        self, input: TaskStopInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        key = input.task_id or input.shell_id or ""
        try:
            task = await self._tasks.stop(key)
        except TaskError as exc:
            raise ToolError(str(exc)) from None
        if task.status == "running":
            yield ToolOutput(f"Task {task.id} is still stopping.", is_error=True)
            return
        how = "was stopped" if task.status == "stopped" else f"had already ended ({task.status})"
        yield ToolOutput(f"Task {task.id} ({task.description}) {how}.")

    def render_use(self, input: TaskStopInput) -> str:
        return f"TaskStop({input.task_id or input.shell_id})"
