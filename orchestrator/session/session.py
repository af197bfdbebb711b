"""The Session: one conversation over the parts `open_session` built (orchestrator/session/
open.py), so every front end runs prompts the same way:

    async with open_session(config, parts) as session:
        result = await session.run("fix the build")
        result = await session.run("now add a test")   # the same conversation

A `Session` is made from one `SessionKit` (everything the builders made) and only uses it:
it builds nothing and nothing is set on it afterwards. `run` sends a prompt through the agent
loop; `interrupt`, `compact`, `shell` (`!command`), `call_tool` (`warren mcp serve`) and
`set_model` (an SDK host) act on the same conversation.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.calls.denials import DenialLog
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.policy import SessionPolicy
from orchestrator.changes.recorder import ChangeRecorder
from orchestrator.claude_code.output import OutputPrinter
from orchestrator.conversation.compaction import Compaction, Compactor
from orchestrator.conversation.loop import LoopConfig, ModelUsage, RunControl, RunResult, run_loop
from orchestrator.conversation.repair import normalize_for_api
from orchestrator.errors import SessionError
from orchestrator.events import EventSink
from orchestrator.limits import Limits
from orchestrator.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from orchestrator.model.base import ModelClient
from orchestrator.model.catalog import context_window
from orchestrator.records.transcripts import Transcript
from orchestrator.session import startup_gc
from orchestrator.session.config import SessionConfig
from orchestrator.session.later import FirstResponseStarts
from orchestrator.session.spend import spent, with_session_spend, with_subagent_models
from orchestrator.session.state import IoGuard
from orchestrator.tasks.registry import TaskRegistry
from orchestrator.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from orchestrator.mcp.deferred import DeferredMcp
    from orchestrator.mcp.servers import McpServers
    from orchestrator.model.switch import SwitchableModel
    from orchestrator.workflows.journal import RunRecord
    from orchestrator.workflows.runs import RunStart, WorkflowRuns

__all__ = ["Session", "SessionKit"]


@dataclass(frozen=True)
class SessionKit:
    """Everything an open session works with, made by `open_session`'s builders."""

    config: SessionConfig
    policy: SessionPolicy
    limits: Limits
    transcript: Transcript
    model: ModelClient
    """The model as requests go out (the broker over the fallback and switch, when wired)."""
    switch: SwitchableModel | None
    """Inside `model`: where `set_model` switches (sessions an SDK host drives)."""
    pipeline: ToolPipeline
    printer: OutputPrinter
    emit: EventSink
    system: list[str]
    history: list[Message]
    io_guard: IoGuard
    denials: DenialLog
    subagent_spend: dict[str, ModelUsage]
    """Filled by the subagents' sink while a run goes on; the session reads and clears it."""
    changes: ChangeRecorder | None
    mcp_source: DeferredMcp | None
    later: tuple[Callable[[], None], ...]
    tasks: TaskRegistry | None = None
    """The session's background tasks (orchestrator/tasks/)."""
    workflows: Callable[[], WorkflowRuns] | None = None
    """The session's workflow runs (orchestrator/workflows/), made when first asked for;
    None without subagents."""


class Session:
    """One conversation: send prompts with `run`, stop the current one with `interrupt`.

    Made by `open_session`, which owns the parts; a `Session` only uses them.
    """

    def __init__(self, kit: SessionKit) -> None:
        self.config = kit.config
        self.policy = kit.policy
        """The policy in force (the REPL shows its rules and switches its mode)."""
        self.limits = kit.limits
        self.transcript = kit.transcript
        self.model = kit.model
        self.history = list(kit.history)
        """The conversation so far (a resumed session starts with its transcript's)."""
        self._pipeline = kit.pipeline
        self._printer = kit.printer
        self._emit = kit.emit
        self._system = kit.system
        self._io = kit.io_guard
        self._denials = kit.denials
        self._control: RunControl | None = None
        self._start_context: list[str] = []
        """SessionStart hooks' context, added to the next prompt."""
        self.subagent_spend = kit.subagent_spend
        """Subagents' model turns in the current run, by model (the result's `modelUsage`)."""
        self.switch = kit.switch
        """Where `set_model` switches the model (sessions an SDK host drives)."""
        self.mcp_source = kit.mcp_source
        """The session's MCP servers, started once the first model request is answered
        (orchestrator/mcp/deferred.py); None without servers."""
        self.changes = kit.changes
        """The per-turn change sets (orchestrator/changes/recorder.py) behind `/undo`."""
        self.tasks = kit.tasks
        """Background agents, shells and monitors (`/tasks`)."""
        self._workflows = kit.workflows
        self.later = kit.later
        """Starts the parts the first request does not need (tool hosts, pool, change scan:
        orchestrator/session/later.py), called when that request is on its way
        (`start_parts`)."""
        self._later_started = False
        self.compactor = Compactor(
            window=kit.limits.context_window or context_window(kit.model.model),
            threshold=kit.limits.compact_threshold,
        )
        """Context accounting and compaction, kept across runs
        (orchestrator/conversation/compaction.py)."""

    @property
    def session_id(self) -> str:
        return self.transcript.session_id

    def set_model(self, name: str | None) -> str:
        """Answer the next requests with model `name` (an alias or id; None: the session's
        own), an SDK host's `set_model`; the model id chosen.

        **Errors:** `ValueError` for a model Warren does not know, or a session that no host
        drives.
        """
        if self.switch is None:
            raise ValueError("only a session an SDK host drives can switch its model")
        return self.switch.select(name)

    def interrupt(self) -> None:
        """Stop the current run: it ends `interrupted`, its transcript resumable. No effect
        between runs."""
        if self._control is not None:
            self._control.interrupt()

    async def run(self, prompt: str) -> RunResult:
        """Send `prompt` and run the agent loop until it ends; the result is printed in the
        config's output format and recorded in the transcript.

        **Cancellation:** `interrupt()` ends the run `interrupted`; an outer cancellation
        propagates (the transcript keeps every complete message).
        **Errors:** none for model, tool or state-writing failures: those are terminal
        reasons (`model_error`, `budget_exceeded`, `io_error`, ...).
        """
        control = RunControl()
        self._control = control
        self._io.control = control
        self._denials.take()  # a run reports its own denials only
        self.subagent_spend.clear()
        if self._io.failure is not None:  # an earlier run could not write: nor can this one
            control.interrupt()
        hooks = self._pipeline.hooks
        started = time.monotonic()
        context = list(self._start_context)
        self._start_context = []
        if hooks is not None:
            hooks.stop_requested = None
            submitted = None
            with control.scoped():
                submitted = await hooks.user_prompt_submit(prompt)
            # None: interrupted while the hooks ran (the loop then ends `interrupted` at once).
            if submitted is not None:
                if submitted.blocked or hooks.stop_requested is not None:
                    why = hooks.stop_requested or submitted.reason_text
                    return self._finish(
                        self._rejected(f"The prompt was blocked by a hook: {why}", started)
                    )
                context.extend(submitted.context)
        if self.mcp_source is not None and "@" in prompt:
            from orchestrator.mcp.resources import resolve_mentions

            servers = await self.mcp_servers()
            if servers is not None:
                context.extend(await resolve_mentions(prompt, servers))
        message = Message(
            role="user",
            content=[TextBlock(text=prompt), *(TextBlock(text=text) for text in context)],
        )
        self._io.write(lambda: self.transcript.message(message))
        self._io.write(lambda: self.transcript.note_prompt(prompt))
        before = spent(self.model)
        model: ModelClient = self.model
        starts = [] if self._later_started else [self.start_parts]
        if self.mcp_source is not None and not self.mcp_source.requested:
            starts.append(self.mcp_source.start)
        if starts:
            model = FirstResponseStarts(self.model, starts)
        try:
            result = await run_loop(
                model=model,
                messages=[*self.history, message],
                pipeline=self._pipeline,
                config=LoopConfig(
                    system=self._system,
                    max_turns=self.limits.max_turns,
                    max_concurrency=self.limits.max_concurrency,
                    max_tokens=self.limits.max_output_tokens,
                    thinking_budget=self.limits.max_thinking_tokens,
                    max_stop_hook_blocks=self.limits.max_stop_hook_blocks,
                    wait_for_tasks=self.config.wait_for_tasks,
                ),
                emit=self._emit,
                control=control,
                compactor=self.compactor,
                tasks=self.tasks,
            )
        finally:
            self._control = None
            self._io.control = None
            # What the run's last steps wrote (its Stop hooks) is its last turn's, not the
            # next run's.
            self._end_turn()
        result = with_session_spend(result, self.model, before)
        result = with_subagent_models(result, self.subagent_spend)
        if self._io.failure is not None:
            result = dataclasses.replace(result, reason="io_error", result=self._io.failure)
        self.history = result.messages
        return self._finish(result)

    def _rejected(self, why: str, started: float) -> RunResult:
        """A run that never reached the model: a hook rejected its prompt."""
        return RunResult(
            "hook_blocked", list(self.history), 0, Usage(), 0.0, why,
            time.monotonic() - started,
        )  # fmt: skip

    @property
    def mcp(self) -> McpServers | None:
        """The session's MCP servers once they have been started (`start_mcp`,
        `mcp_servers`), else None."""
        return None if self.mcp_source is None else self.mcp_source.servers

    def start_mcp(self) -> None:
        """Start the MCP servers now, not after the first model request (the REPL: the user
        is typing)."""
        if self.mcp_source is not None:
            self.mcp_source.start()

    def start_parts(self) -> None:
        """Start the tool hosts, the worker pool and the change scan now, not once the first
        request is on its way (the REPL: the user is typing). Idempotent."""
        self._later_started = True
        startup_gc.resume()  # the start-up is over (orchestrator/session/startup_gc.py)
        for start in self.later:
            start()

    async def mcp_servers(self) -> McpServers | None:
        """The session's MCP servers, started now if they were not yet (each may still be
        starting); None when it has none."""
        return None if self.mcp_source is None else await self.mcp_source.ready()

    async def start(self) -> None:
        """Fire SessionStart (`startup`, or `resume` for a resumed conversation): what the
        hooks print joins the first prompt as context; `continue: false` makes the first run
        end `hook_blocked`."""
        hooks = self._pipeline.hooks
        if hooks is None:
            return
        try:
            outcome = await hooks.session_start("resume" if self.history else "startup")
        finally:
            self._end_turn()  # what its hooks wrote is a turn of its own
        self._start_context.extend(outcome.context)

    def _finish(self, result: RunResult) -> RunResult:
        denials = self._denials.take()
        if denials:
            result = dataclasses.replace(result, permission_denials=denials)
            if self.config.fail_on_denial and result.reason == "completed":
                result = dataclasses.replace(result, reason="permission_denied")
        self._io.write(
            lambda: self.transcript.write(
                {
                    "type": "result",
                    "reason": result.reason,
                    "num_turns": result.num_turns,
                    "usage": result.usage.model_dump(),
                    "total_cost_usd": result.cost_usd,
                    "permission_denials": len(result.permission_denials),
                }
            )
        )
        self._io.write(lambda: self.transcript.note_run(result.num_turns, result.cost_usd))
        structlog.get_logger().info(
            "run finished", reason=result.reason, turns=result.num_turns, cost=result.cost_usd
        )
        # Last: stdout may be a terminal that is gone (SIGHUP); the transcript has it all.
        self._printer.finish(result)
        return result

    @property
    def tools(self) -> ToolRegistry:
        """The tools this session offers (built-in, `dispatch_agent`, MCP servers')."""
        return self._pipeline.tools

    async def call_tool(self, name: str, input: dict[str, Any]) -> ToolResultBlock:
        """Run one tool call from outside the conversation (`warren mcp serve`): the same
        pipeline as the model's calls (schema, hooks, policy, audit log, output cap, the
        floor); an ask is answered by the session's asker (a denial when headless).
        Never raises for a bad call: the result says what went wrong."""
        block = ToolUseBlock(id=f"toolu_ext_{uuid.uuid4().hex[:20]}", name=name, input=input)
        try:
            return await self._pipeline.execute(self._pipeline.prepare(block))
        finally:
            self._end_turn()

    def _end_turn(self) -> None:
        """The end of a turn in the change log: a call from outside the loop, a run's end
        and the session's start each end one."""
        if self.changes is not None:
            self.changes.end_turn()

    def context_usage(self) -> tuple[int, int]:
        """Tokens the next request would hold (the last reported count plus what was added
        since, estimated) and the model's window: how full the context is (`/context`)."""
        account = self.compactor.account
        fixed = account.fixed_chars(self._system, self._pipeline.tools.specs())
        return account.estimate(self.history, fixed), self.compactor.window

    async def shell(self, command: str) -> ToolResultBlock:
        """Run a command the user typed (the REPL's `!command`) with the Bash tool in the
        read-write tool host: deny rules apply, nothing asks. The command and its output join
        the conversation as a user message, so the model sees them with the next prompt.

        **Cancellation:** propagates; the command is stopped and nothing is added.
        """
        block = ToolUseBlock(id=f"user_{uuid.uuid4().hex[:12]}", name="Bash", input={
            "command": command, "description": "typed by the user"
        })  # fmt: skip
        try:
            result = await self._pipeline.run_typed(block)
        finally:
            self._end_turn()
        output = result.content if isinstance(result.content, str) else "\n".join(
            b.text for b in result.content if isinstance(b, TextBlock)
        )  # fmt: skip
        self.add_user_note(
            f"<bash-input>{command}</bash-input>\n"
            f"<bash-{'stderr' if result.is_error else 'stdout'}>{output}"
            f"</bash-{'stderr' if result.is_error else 'stdout'}>"
        )
        return result

    @property
    def workflows(self) -> WorkflowRuns | None:
        """Workflow runs (`/workflows`, `warren workflow`), made on first use; None without
        subagents."""
        return None if self._workflows is None else self._workflows()

    async def run_workflow(self, start: RunStart) -> RunRecord:
        """Run a workflow in the foreground to its end (`warren workflow run` and `resume`):
        its agents are the session's subagents, decided by its policy; its record, with the
        result, is saved.

        **Cancellation:** its agents and script are stopped, the record says `stopped` (the
        run can be resumed from its journal).
        **Errors:** `SessionError` when the session runs no subagents; `WorkflowError` for a
        script that cannot run (its META, an unknown run to resume).
        """
        runs = self.workflows
        if runs is None:
            raise SessionError(
                "workflows need subagents, and this session runs none (the sandbox is off, "
                "[limits] max_subagents is 0, or --tools leaves dispatch_agent out)"
            )
        self.start_parts()
        live, _ = runs.prepare(start)
        try:
            return await runs.run(live, start.source)
        finally:
            self._end_turn()

    def add_user_note(self, text: str) -> None:
        """Add a user message to the conversation (and the transcript) without running the
        loop: the next prompt follows it (consecutive user messages are merged for the API)."""
        message = Message.user_text(text)
        self._io.write(lambda: self.transcript.message(message))
        self.history = [*self.history, message]

    async def compact(self, instructions: str | None = None) -> Compaction:
        """Summarise the conversation now (the REPL's `/compact [instructions]`), between runs:
        the history becomes the compact boundary, recorded in the transcript.

        **Errors:** `ModelError` when the summary request fails (nothing changed);
        `SessionError` when there is nothing to compact yet.
        """
        if not self.history:
            raise SessionError("there is nothing to compact yet")
        compaction = await self.compactor.compact(
            normalize_for_api(list(self.history)),
            trigger="manual",
            model=self.model,
            system=self._system,
            tools=self._pipeline.tools.specs(),
            pipeline=self._pipeline,
            emit=self._emit,
            instructions=instructions,
        )
        self.history = compaction.messages
        return compaction
