"""The Monitor tool: a watch command whose every output line is an event for the model.

Claude Code's `MonitorInput` (`description`, `timeout_ms`, `command`; `ws` is refused: the
sandboxes have no network). The call returns at once with the monitor's task id; the command
runs as a task in the session's read-only sandbox, whatever was decided about it (a watch
never writes), and each line it prints (stdout and stderr) reaches the model at the next turn
boundary, the lines of one boundary in one `<task-notification>` whose status is `running`
(`TaskRegistry.event`). The command's exit, or its deadline (`timeout_ms`, default 5 minutes,
capped at 30), ends the watch with a last notification; `TaskStop` ends it without one.

The call is decided like a Bash call (`ToolFacts.command_field`): the policy's analyser reads
the command, deny rules apply, a read-only one (`tail -f FILE | grep --line-buffered READY`)
runs without asking, any other asks (denied headless). A headless run waits for a monitor
that still runs, as for a background agent.
"""

from __future__ import annotations

import codecs
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from pydantic import BaseModel, Field, model_validator

from orchestrator.calls.pipeline import ToolRunner
from orchestrator.calls.plan import CallPlan, Verdict
from orchestrator.errors import ToolError
from orchestrator.messages import ToolUseBlock
from orchestrator.tasks.registry import Task, TaskEnd, TaskError, TaskRegistry
from orchestrator.tasks.shells import stream_command
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts

__all__ = ["DEFAULT_TIMEOUT_MS", "MAX_TIMEOUT_MS", "MonitorInput", "MonitorTool"]

DEFAULT_TIMEOUT_MS = 300_000
MAX_TIMEOUT_MS = 1_800_000

DESCRIPTION = f"""\
Starts a background watch: runs `command` in a read-only sandbox, and each line it prints \
becomes an event you receive at your next turn (the lines since your last turn in one \
<task-notification> whose status is running). The call returns at once with the monitor's \
task id; go on with other work. Use it to wait for something to happen without polling: a \
background command's output line (`tail -n +1 -f OUTPUT_FILE | grep --line-buffered READY`), \
a file appearing (`while [ ! -e ready.txt ]; do sleep 1; done; echo ready`), a test \
watcher's failures. Filter to the lines that matter (`grep --line-buffered`): every line \
is an event. The watch ends when the command exits or at `timeout_ms` (default \
{DEFAULT_TIMEOUT_MS}, capped at {MAX_TIMEOUT_MS}); you are told, and may start it again. \
Stop it early with TaskStop. The command cannot write files and has no network; `ws` \
(a WebSocket) is not available."""


class MonitorSocket(BaseModel):
    url: str
    protocols: list[str] | None = None


class MonitorInput(ToolInput):
    description: str = Field(
        description="What you are watching for, in a few words (shown in its notifications)."
    )
    timeout_ms: int = Field(
        default=DEFAULT_TIMEOUT_MS,
        ge=1,
        description=f"End the watch after this many milliseconds (default {DEFAULT_TIMEOUT_MS};"
        f" more than {MAX_TIMEOUT_MS} is capped to {MAX_TIMEOUT_MS}).",
    )
    command: str | None = Field(
        default=None,
        description="Shell command to run; each line it prints is an event, its exit ends "
        "the watch.",
    )
    ws: MonitorSocket | None = Field(
        default=None, description="Not available (no network in the sandbox)."
    )

    @model_validator(mode="after")
    def _one(self) -> MonitorInput:
        if self.command is None and self.ws is None:
            raise ValueError("give command: the shell command to watch")
        if self.command is not None and self.ws is not None:
            raise ValueError("give command or ws, not both")
        return self


class MonitorTool(Tool[MonitorInput]):
    name: ClassVar[str] = "Monitor"
    facts: ClassVar[ToolFacts] = ToolFacts(
        family="exec", command_field="command", runs_in_coordinator=True
    )
    input_model: ClassVar[type[ToolInput]] = MonitorInput
    description: ClassVar[str] = DESCRIPTION

    def __init__(self, tasks: TaskRegistry, runner: ToolRunner, bash: Tool[Any]) -> None:
        """`runner`: where the watch runs (the session's tool hosts, unrecorded: it cannot
        write); `bash`: the session's Bash tool, which runs it there."""
        self._tasks = tasks
        self._runner = runner
        self._bash = bash

    async def validate(self, input: MonitorInput, ctx: ToolContext) -> str | None:
        if input.ws is not None:
            return (
                "Monitor cannot open a WebSocket here: the sandboxes have no network. Watch "
                "with a command instead (for example `tail -n +1 -f FILE | grep "
                "--line-buffered PATTERN` on a background command's output file)."
            )
        return None

    async def call(
        self, input: MonitorInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        if input.command is None:  # validate refused ws
            raise ToolError("Monitor needs a command")
        timeout_ms = min(input.timeout_ms, MAX_TIMEOUT_MS)
        task_id = f"monitor-{uuid.uuid4().hex[:10]}"
        raw = {"command": input.command, "run_in_background": True, "timeout": timeout_ms}
        plan = CallPlan(
            ToolUseBlock(id=f"{task_id}-watch", name=self._bash.name, input=raw),
            self._bash,
            self._bash.parse_input(raw),
            None,
            # Run in the read-only sandbox whatever was decided: a watch never writes.
            Verdict(True, "a Monitor's watch command (the read-only sandbox)", False),
        )
        refusal = await self._runner.validate(plan, ctx)
        if refusal is not None:
            raise ToolError(refusal)

        async def body(task: Task) -> TaskEnd:
            return await self._watch(task, plan, ctx, timeout_ms)

        description = " ".join(input.description.split())[:80] or "watch"
        try:
            self._tasks.start("monitor", description, body, id=task_id)
        except TaskError as exc:
            raise ToolError(str(exc)) from None
        capped = (
            f" (timeout_ms capped to {MAX_TIMEOUT_MS})" if input.timeout_ms > MAX_TIMEOUT_MS else ""
        )
        yield ToolOutput(
            f"Monitor started with ID: {task_id}{capped}. Each line its command prints reaches "
            f"you at your next turn; the watch ends when the command exits or after "
            f"{timeout_ms / 1000:g} s. Stop it with TaskStop.",
            summary=f"{task_id}: watching",
        )

    async def _watch(self, task: Task, plan: CallPlan, ctx: ToolContext, limit_ms: int) -> TaskEnd:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        partial = ""
        lines = 0

        def take(data: bytes) -> None:
            nonlocal partial, lines
            task.output_bytes += len(data)
            *complete, partial = (partial + decoder.decode(data)).split("\n")
            for line in complete:
                lines += 1
                self._tasks.event(task, line)

        final = await stream_command(self._runner, plan, ctx, take)
        partial += decoder.decode(b"", final=True)
        if partial:
            lines += 1
            self._tasks.event(task, partial)
        what = f'Monitor "{task.description}"'
        seen = f"{lines} line{'' if lines == 1 else 's'}"
        if final is None:
            return TaskEnd("failed", f"{what} gave no result ({seen})")
        if final.summary and final.summary.startswith("timed out"):
            return TaskEnd(
                "completed",
                f"{what} reached its deadline ({limit_ms / 1000:g} s) after {seen}; start it "
                "again to keep watching",
            )
        if final.is_error:
            return TaskEnd("failed", f"{what} ended: its command {final.summary} ({seen})")
        return TaskEnd("completed", f"{what} ended: its command {final.summary} ({seen})")

    def render_use(self, input: MonitorInput) -> str:
        return f"Monitor({input.description})"
