"""Background shells: a Bash call with `run_in_background` becomes a task of the session.

The call is planned, hooked, decided and validated like any Bash call (the policy's verdict
picks the sandbox: the read-only tool host for a read-only command, the read-write one
otherwise); then, instead of waiting for it, `BackgroundShells` starts it as a task and the
call's result is at once its task id and the path of its output file. The command runs in the
tool host as a call that lasts as long as it does (`BashTool._background`: a one-shot bash
from the persistent shell's state, so later calls do not wait for it), its bytes streamed
back and written by the coordinator to the task's bounded output file
(orchestrator/tasks/outputs.py), which every sandbox of the session sees read-only. Its end is
its notification: status, the summary (`completed (exit code 0)`), its last output.

A writing background command (one the policy did not find read-only) is a writer of its own
to the change recorder (`ChangeRecorder.open_background`): what it writes is recorded as its
own change set, which `warren undo` names, and the turns it outlives keep theirs.

`TaskStop`, `[limits] task_time_s`, the command's own `timeout` and the session's end all
stop it the same way: the host call is cancelled, and the host kills the command with
everything it started (`PersistentShell.streaming`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.pipeline import RunnerLayer, ToolRunner
from orchestrator.calls.plan import CallPlan
from orchestrator.changes.recorder import ChangeRecorder
from orchestrator.changes.writers import Writer
from orchestrator.errors import ToolError
from orchestrator.tasks.outputs import OutputFile, TaskOutputs
from orchestrator.tasks.registry import Task, TaskEnd, TaskError, TaskRegistry, TaskStatus
from orchestrator.tools.base import Checked, ToolContext, ToolOutput, ToolProgress

__all__ = ["BackgroundShells", "is_background_shell", "stream_command"]

_DESCRIPTION_CHARS = 60


def is_background_shell(plan: CallPlan) -> bool:
    """Whether `plan` is a Bash call to run in the background."""
    tool, input = plan.tool, plan.input
    return (
        tool is not None
        and tool.name == "Bash"
        and getattr(input, "run_in_background", False) is True
    )


class BackgroundShells(RunnerLayer):
    """A `ToolRunner`: every call goes to `runner` (its `inner`: the session's, which records
    writing calls) but a background Bash call, which starts as a task and returns at once; the
    task runs it on `direct` (the same hosts, unrecorded: the task records itself)."""

    def __init__(
        self,
        runner: ToolRunner,
        *,
        direct: ToolRunner,
        tasks: TaskRegistry,
        outputs: TaskOutputs | None,
        recorder: ChangeRecorder | None = None,
        unavailable: str = "",
    ) -> None:
        """`outputs` None: background commands are refused, saying `unavailable`."""
        super().__init__(runner)
        self._direct = direct
        self._tasks = tasks
        self._outputs = outputs
        self._recorder = recorder
        self._unavailable = unavailable

    async def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        if not is_background_shell(plan):
            async with closing_iter(self.inner_call(plan, ctx, validate)) as items:
                async for item in items:
                    yield item
            return
        if validate:
            refusal = await self._direct.validate(plan, ctx)
            yield Checked(refusal)
            if refusal is not None:
                return
        yield self._start(plan, ctx)

    def _start(self, plan: CallPlan, ctx: ToolContext) -> ToolOutput:
        """The command started as a task; the call's result, which says where it went."""
        if self._outputs is None:
            raise ToolError(
                "Background commands are not available in this session"
                + (f": {self._unavailable}" if self._unavailable else "")
                + ". Run the command in the foreground."
            )
        input: Any = plan.input
        task_id = f"bash-{uuid.uuid4().hex[:10]}"
        description = _description(input.description, input.command)
        writes = plan.sandbox != "ro"
        try:
            output = self._outputs.create(task_id)
        except OSError as exc:
            raise ToolError(f"The command was not started: its output file: {exc}") from None

        async def body(task: Task) -> TaskEnd:
            return await self._run(task, plan, ctx, output, writes)

        try:
            self._tasks.start(
                "shell",
                description,
                body,
                id=task_id,
                tool_use_id=plan.block.id,
                output_file=output.path,
            )
        except TaskError as exc:
            output.close()
            output.path.unlink(missing_ok=True)
            raise ToolError(str(exc)) from None
        lines = [
            f"Command running in background with ID: {task_id}. Output is being written to: "
            f"{output.path}",
            "You will get a <task-notification> when it exits. Go on with other work; read its "
            "output with Read, wait for a line with Monitor, stop it with TaskStop.",
        ]
        if writes:
            lines.append(
                "It may write to the workspace: do not edit files it writes (its changes are "
                "recorded as its own change set)."
            )
        if getattr(input, "dangerouslyDisableSandbox", False):
            from orchestrator.tools.bash import UNSANDBOXED_REFUSED

            lines.append(f"Note: {UNSANDBOXED_REFUSED}")
        return ToolOutput("\n".join(lines), summary=f"{task_id}: started in the background")

    async def _run(
        self, task: Task, plan: CallPlan, ctx: ToolContext, output: OutputFile, writes: bool
    ) -> TaskEnd:
        """The command, to its end, its bytes into `output`; how it ended."""
        recorder = self._recorder if writes else None
        final: ToolOutput | None = None
        try:
            if recorder is not None:
                await recorder.open_background(
                    Writer(task.id, "Bash (background)", task.description)
                )

            def take(data: bytes) -> None:
                output.write(data)
                task.output_bytes = output.total

            final = await stream_command(self._direct, plan, ctx, take)
        finally:
            output.close()
            if recorder is not None:
                with trio.CancelScope(shield=True):
                    await recorder.close_background(task.id)
        what = f'Background command "{task.description}"'
        if final is None:
            return TaskEnd("failed", f"{what} gave no result")
        status: TaskStatus = "failed" if final.is_error else "completed"
        return TaskEnd(status, f"{what} {final.summary or status}", final.as_text())


async def stream_command(
    runner: ToolRunner, plan: CallPlan, ctx: ToolContext, take: Callable[[bytes], None]
) -> ToolOutput | None:
    """Run a background Bash `plan` on `runner` to its end, each chunk of its output to
    `take`; how it ended (a call that could not run: an error output), or None when the host
    gave no end (also a background monitor's, orchestrator/tasks/monitor.py)."""
    try:
        async with closing_iter(runner.call(plan, ctx)) as items:
            async for item in items:
                if isinstance(item, ToolProgress):
                    if item.data:
                        take(item.data)
                elif isinstance(item, ToolOutput):
                    return item
    except ToolError as exc:
        return ToolOutput(exc.message, is_error=True, summary="could not run")
    return None


def _description(given: str | None, command: str) -> str:
    text = " ".join((given or "").split()) or " ".join(command.split())
    if len(text) > _DESCRIPTION_CHARS:
        text = text[: _DESCRIPTION_CHARS - 1] + "…"
    return text
