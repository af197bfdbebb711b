"""The agent loop: ask the model, run the tools it asked for, repeat until it stops.

It knows nothing of individual tools and decides from the final message (never from the
envelope's `stop_reason` alone). Every tool_use gets exactly one tool_result, in order, whatever
happens; the run ends with one `TerminalReason`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.conversation.compaction import Compaction, Compactor
from orchestrator.conversation.continuation import (
    Keep,
    OutputRecovery,
    OutputVerdict,
    Resume,
    RetryHigher,
    Truncated,
)
from orchestrator.conversation.executor import StreamingToolExecutor
from orchestrator.conversation.repair import INTERRUPTED_BY_USER, NO_CONTENT, normalize_for_api
from orchestrator.errors import ModelError
from orchestrator.events import (
    AssistantTurn,
    EventSink,
    RetryScheduled,
    TextStreamed,
    ToolResultsMessage,
)
from orchestrator.messages import (
    AssistantMessage,
    ContentBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    Usage,
)
from orchestrator.model.base import (
    BlockComplete,
    MessageComplete,
    ModelClient,
    ModelRequest,
    Retry,
    TextDelta,
)
from orchestrator.model.catalog import context_window
from orchestrator.outcome import TerminalReason
from orchestrator.tools.base import CURRENT_TURN, TurnSoFar

if TYPE_CHECKING:  # the worker's loop does not import the policy files layer
    from orchestrator.calls.denials import PermissionDenial
    from policies.files import HookEvent

__all__ = ["LoopConfig", "ModelUsage", "RunControl", "RunResult", "run_loop"]

_EMPTY_TURN = Message(role="assistant", content=[TextBlock(text=NO_CONTENT)])
"""Stands in for an empty assistant message, which the API would refuse in a later request."""


@dataclass(frozen=True)
class LoopConfig:
    system: list[str] = field(default_factory=list)
    """System prompt blocks, most stable first."""
    max_turns: int = 100
    """Model requests per run; the run ends with `max_turns` when reached."""
    max_concurrency: int = 10
    """Concurrency-safe tool calls that may run at once."""
    max_tokens: int | None = None
    """Output tokens per model response (clamped to the model's output limit). Default None:
    the model's default (`orchestrator.model.catalog.default_max_tokens`)."""
    thinking_budget: int | None = None
    """Extended thinking's budget per response in tokens. Default None: no thinking."""
    max_stop_hook_blocks: int = 5
    """Times Stop hooks may keep the run going; one more block ends it `hook_blocked`."""
    agent_id: str | None = None
    """A subagent's id: its end fires SubagentStop instead of Stop."""
    wait_for_tasks: bool = True
    """When the model ends its turn while background agents or monitors still run (`tasks`),
    wait for their notifications and go on (a headless run); False ends the run, and the
    notifications join the next prompt (the interactive session)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.max_stop_hook_blocks < 0:
            raise ValueError("max_stop_hook_blocks must not be negative")


class TaskInbox(Protocol):
    """The session's background tasks as the loop sees them (orchestrator/tasks/registry.py):
    their notifications, added at a turn boundary, never inside a turn."""

    def take_notes(self) -> list[str]: ...

    def pending(self) -> bool: ...

    def waits(self) -> bool: ...

    async def wait(self) -> None: ...


class RunControl:
    """The handle a caller uses to interrupt a run (Ctrl-C, Esc, a deadline).

    `interrupt()` stops the model stream and running tools; the run then returns
    `interrupted` with a transcript that can be resumed.
    """

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None
        self.interrupted = False

    def interrupt(self) -> None:
        self.interrupted = True
        if self._scope is not None:
            self._scope.cancel()

    @contextmanager
    def scoped(self) -> Iterator[None]:
        """A step that `interrupt()` cancels (at once, if the run was interrupted already)."""
        with trio.CancelScope() as scope:
            self._scope = scope
            if self.interrupted:
                scope.cancel()
            try:
                yield
            finally:
                self._scope = None


@dataclass(frozen=True)
class ModelUsage:
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    requests: int = 0

    def add(self, turn: AssistantMessage) -> ModelUsage:
        return ModelUsage(self.usage + turn.usage, self.cost_usd + turn.cost_usd, self.requests + 1)


@dataclass(frozen=True)
class RunResult:
    reason: TerminalReason
    messages: list[Message]
    """The whole conversation, including what this run appended."""
    num_turns: int
    usage: Usage
    cost_usd: float
    result: str
    """The final assistant text, or the error sentence when the run failed."""
    duration_s: float
    model_usage: dict[str, ModelUsage] = field(default_factory=dict)
    """Usage and cost per model name (subagents may use other models)."""
    context_tokens: int = 0
    """Input tokens of the last request (the API's count): how full the context is."""
    context_window: int = 0
    """The window those tokens are out of (learnt from a refusal when smaller)."""
    compactions: int = 0
    """Summaries made in this run (orchestrator/conversation/compaction.py)."""
    permission_denials: tuple[PermissionDenial, ...] = ()
    """Calls denied in this run, subagents' included (the session fills it in:
    orchestrator/calls/denials.py)."""
    api_duration_s: float = 0.0
    """Seconds the main agent spent streaming model replies, retries included (Claude Code's
    `duration_api_ms`)."""


async def run_loop(
    *,
    model: ModelClient,
    messages: list[Message],
    pipeline: ToolPipeline,
    config: LoopConfig,
    emit: EventSink,
    control: RunControl | None = None,
    compactor: Compactor | None = None,
    tasks: TaskInbox | None = None,
) -> RunResult:
    """Run turns until the model answers without tool calls, or a terminal reason occurs.

    `messages` is the history to continue (it must end with a user message); it is not mutated.

    **Cancellation:** `control.interrupt()` ends the run with `interrupted` and a consistent
    transcript; an outer cancellation propagates (nothing is left half-appended).
    `compactor` keeps the history inside the model's window
    (orchestrator/conversation/compaction.py): pass the session's to keep its learnt window and
    counts across runs.

    `tasks`: the session's background tasks, whose notifications join the conversation at
    each turn boundary (and, with `config.wait_for_tasks`, keep the run going while agents
    or monitors still run).

    **Errors:** none for model or tool failures: they are terminal reasons or tool_results.
    """
    run = _Run(
        model,
        pipeline,
        config,
        emit,
        control or RunControl(),
        compactor or Compactor(window=context_window(model.model)),
        messages,
        tasks,
    )
    for turn in range(1, config.max_turns + 1):
        ended = await run.turn(turn)
        if ended is not None:
            return ended
    return run.finish(
        "max_turns", run.last_text or f"Stopped after {config.max_turns} turns.", config.max_turns
    )


@dataclass
class _Reply:
    """One model request's outcome: the reply (None when the stream failed or the run was
    interrupted before it completed), what to do with it, the blocks that completed, the
    tool results, and the model's error."""

    final: AssistantMessage | None = None
    verdict: OutputVerdict = field(default_factory=Keep)
    completed: dict[int, ContentBlock] = field(default_factory=dict)
    results: list[ToolResultBlock] = field(default_factory=list)
    error: ModelError | None = None


class _Run:
    """One run's state across its turns: the history it appends to, what it spent, and the
    recoveries in progress (a compaction retried once, a reply cut at max_tokens, Stop hooks
    that kept it going)."""

    def __init__(
        self,
        model: ModelClient,
        pipeline: ToolPipeline,
        config: LoopConfig,
        emit: EventSink,
        control: RunControl,
        compactor: Compactor,
        messages: list[Message],
        tasks: TaskInbox | None = None,
    ) -> None:
        self.model, self.pipeline, self.config, self.emit = model, pipeline, config, emit
        self.tasks = tasks
        self.control, self.compactor = control, compactor
        self.summaries_before = compactor.compactions
        self.reacted = False
        # Normalised once: from here on the loop only appends pairs that keep it valid, so a
        # long history is not re-checked every turn (tests/bench/bench_loop.py, benchmark c).
        self.history = normalize_for_api(list(messages))
        self.started = time.monotonic()
        self.usage = Usage()
        self.cost = 0.0
        self.limiter = trio.CapacityLimiter(config.max_concurrency)
        self.tool_specs = pipeline.tools.specs()
        self.tools_version = pipeline.tools.version
        self.last_text = ""
        # Replies cut at max_tokens: continued, retried higher, or the end (continuation.py).
        self.recovery = OutputRecovery(model.model, config.max_tokens, config.thinking_budget)
        self.stop_blocks = 0
        self.by_model: dict[str, ModelUsage] = {}
        self.api_s = 0.0

    def finish(self, reason: TerminalReason, result: str, turns: int) -> RunResult:
        return RunResult(
            reason,
            self.history,
            turns,
            self.usage,
            self.cost,
            result,
            time.monotonic() - self.started,
            self.by_model,
            context_tokens=self.compactor.account.last_reported,
            context_window=self.compactor.window,
            compactions=self.compactor.compactions - self.summaries_before,
            api_duration_s=self.api_s,
        )

    def interrupted(self, turn: int, reply: _Reply | None = None) -> RunResult:
        """The end of an interrupted turn: a resumable transcript (`_close_interrupted`)."""
        if reply is None:
            _close_interrupted(self.history, None, {}, [], self.emit)
        else:
            _close_interrupted(self.history, reply.final, reply.completed, reply.results, self.emit)
        return self.finish("interrupted", "The run was interrupted.", turn)

    def take(self, compaction: Compaction) -> None:
        self.history = compaction.messages
        if (summary := compaction.summary) is not None:
            self.count(summary)

    def count(self, reply: AssistantMessage) -> None:
        self.usage += reply.usage
        self.cost += reply.cost_usd
        self.by_model[reply.model] = self.by_model.get(reply.model, ModelUsage()).add(reply)

    async def turn(self, turn: int) -> RunResult | None:
        """One request and the tools it asks for; a result when the run ends here."""
        pipeline, config, control = self.pipeline, self.config, self.control
        if pipeline.tools.version != self.tools_version:  # an MCP server listed its tools
            self.tool_specs, self.tools_version = pipeline.tools.specs(), pipeline.tools.version
        if self.tasks is not None:
            self.deliver(self.tasks.take_notes())
        output = self.recovery.plan()
        with control.scoped():
            compaction = await self.compactor.before_request(
                self.history,
                model=self.model,
                system=config.system,
                tools=self.tool_specs,
                pipeline=pipeline,
                max_tokens=output.max_tokens,
                emit=self.emit,
            )
            if compaction is not None:
                self.take(compaction)
        if control.interrupted:
            return self.interrupted(turn)
        request = ModelRequest(
            system=config.system,
            messages=list(self.history),
            tools=self.tool_specs,
            max_tokens=output.max_tokens,
            thinking_budget=output.thinking_budget,
        )
        reply = await self.exchange(request)
        final = reply.final
        if final is not None:
            self.count(final)
            self.last_text = final.message.text() or self.last_text
        if control.interrupted:
            return self.interrupted(turn, reply)
        if reply.error is not None:
            return await self.refused(reply.error, turn)
        assert final is not None
        self.reacted = False
        self.compactor.observe(
            request.messages,
            final,
            self.compactor.account.fixed_chars(config.system, self.tool_specs),
        )
        match reply.verdict:
            case RetryHigher(note=note):
                self.emit(RetryScheduled(2, 0.0, note, None))
                return None
            case Resume(prompt=prompt):
                self.history.append(prompt)
                self.emit(ToolResultsMessage(prompt))
                return None
            case Truncated(result=text):
                return self.finish("output_truncated", text, turn)
        if not final.message.tool_uses():
            return await self.stop(final, turn)
        tool_results = Message(role="user", content=list(reply.results))
        self.history.append(tool_results)
        self.emit(ToolResultsMessage(tool_results))
        hooks = pipeline.hooks
        if hooks is not None and hooks.stop_requested is not None:
            return self.finish("hook_blocked", hooks.stop_requested, turn)
        return None

    async def exchange(self, request: ModelRequest) -> _Reply:
        """Stream the reply, starting each safe tool call as its block completes, and run
        the rest once the reply is complete (orchestrator/conversation/executor.py)."""
        reply = _Reply()
        control = self.control
        turn = CURRENT_TURN.set(TurnSoFar(request, reply.completed))
        try:
            return await self._exchange(request, reply, control)
        finally:
            CURRENT_TURN.reset(turn)

    async def _exchange(self, request: ModelRequest, reply: _Reply, control: RunControl) -> _Reply:
        with control.scoped():
            async with trio.open_nursery() as nursery:
                executor = StreamingToolExecutor(self.pipeline, nursery, self.limiter)
                asked = time.monotonic()
                try:
                    final = await _stream_turn(
                        self.model, request, executor, reply.completed, self.emit
                    )
                except ModelError as exc:
                    reply.error = exc
                    nursery.cancel_scope.cancel()
                else:
                    reply.final = final
                    self.api_s += time.monotonic() - asked
                    reply.verdict = self.recovery.review(final)
                    if not reply.verdict.keeps_reply:
                        executor.discard()  # a cut tool call: its reply is dropped
                    else:
                        executor.message_complete(final.message.tool_uses())
                        self.emit(AssistantTurn(final))
                        self.history.append(final.message if final.message.content else _EMPTY_TURN)
                        reply.results = await executor.results()
        if control.interrupted:
            reply.results = executor.settled_results()
        return reply

    async def refused(self, error: ModelError, turn: int) -> RunResult | None:
        """The model's error ends the run, except a first `prompt_too_long`: the window is
        learnt, the history summarised and the request retried once (never a loop)."""
        if error.reason != "prompt_too_long" or self.reacted:
            return self.finish(error.reason, error.message, turn)
        self.reacted = True
        self.compactor.learn(error.message)
        try:
            self.take(
                await self.compactor.compact(
                    self.history,
                    trigger="reactive",
                    model=self.model,
                    system=self.config.system,
                    tools=self.tool_specs,
                    pipeline=self.pipeline,
                    emit=self.emit,
                )
            )
        except ModelError as exc:
            return self.finish(error.reason, f"{error.message} Compacting failed: {exc}", turn)
        return None

    def deliver(self, notes: list[str]) -> None:
        """Background tasks' notifications, at a turn boundary: added to the last user
        message of the history (which a turn boundary always ends with), and to the
        transcript as a message of their own (merged with it again on load)."""
        if not notes:
            return
        text = "\n\n".join(notes)
        last = self.history[-1]
        if last.role != "user":  # not at a turn boundary: keep them for the next one
            return
        content = last.content if isinstance(last.content, list) else [TextBlock(text=last.content)]
        self.history[-1] = Message(role="user", content=[*content, TextBlock(text=text)])
        self.emit(ToolResultsMessage(Message.user_text(text)))

    async def stop(self, final: AssistantMessage, turn: int) -> RunResult | None:
        """A reply without tool calls ends the run, unless background agents or monitors
        still run and the run waits for them (their notifications are the next turn's), or
        a Stop (SubagentStop) hook blocks the end: its feedback is sent and the run goes on,
        at most `max_stop_hook_blocks` times."""
        config, hooks = self.config, self.pipeline.hooks
        tasks = self.tasks
        if tasks is not None and config.wait_for_tasks and (tasks.pending() or tasks.waits()):
            with self.control.scoped():
                await tasks.wait()
            if self.control.interrupted:
                return self.finish("interrupted", "The run was interrupted.", turn)
            # The wait ends at a notification: it joins the conversation as the next turn's
            # prompt (the model's reply is a turn of its own, so the history ends with it).
            notes = tasks.take_notes()
            if notes:
                message = Message.user_text("\n\n".join(notes))
                self.history.append(message)
                self.emit(ToolResultsMessage(message))
                return None
        stop_event: HookEvent = "SubagentStop" if config.agent_id else "Stop"
        if hooks is None or not hooks.has(stop_event):
            return self.finish("completed", self.recovery.answer(final.message.text()), turn)
        with self.control.scoped():
            outcome = await hooks.stop(active=self.stop_blocks > 0, agent_id=config.agent_id)
        if self.control.interrupted:
            return self.finish("interrupted", "The run was interrupted.", turn)
        if hooks.stop_requested is not None:
            return self.finish("hook_blocked", hooks.stop_requested, turn)
        if not outcome.blocked:
            return self.finish("completed", self.recovery.answer(final.message.text()), turn)
        if self.stop_blocks >= config.max_stop_hook_blocks:
            return self.finish(
                "hook_blocked",
                f"{stop_event} hooks kept the run going {self.stop_blocks} times and blocked it "
                "again "
                f"(limit: [limits] max_stop_hook_blocks = {config.max_stop_hook_blocks}): "
                + outcome.reason_text,
                turn,
            )
        self.stop_blocks += 1
        feedback = Message.user_text(f"{stop_event} hook feedback:\n" + outcome.reason_text)
        self.history.append(feedback)
        self.emit(ToolResultsMessage(feedback))
        return None


async def _stream_turn(
    model: ModelClient,
    request: ModelRequest,
    executor: StreamingToolExecutor,
    completed: dict[int, ContentBlock],
    emit: EventSink,
) -> AssistantMessage:
    async with closing_iter(model.stream(request)) as events:
        async for event in events:
            match event:
                case TextDelta(text=text):
                    emit(TextStreamed(text))
                case BlockComplete(index=index, block=block):
                    completed[index] = block
                    if block.type == "tool_use":
                        executor.add(block)
                case Retry():
                    completed.clear()
                    executor.discard()
                    retry = RetryScheduled(
                        event.attempt, event.delay_s, event.error, event.status, event.max_retries
                    )
                    emit(retry)
                case MessageComplete(message=message):
                    return message
    raise ModelError("The model stream ended without a complete message.")


def _close_interrupted(
    history: list[Message],
    final: AssistantMessage | None,
    completed: dict[int, ContentBlock],
    results: list[ToolResultBlock],
    emit: EventSink,
) -> None:
    """Leave a resumable transcript: what streamed, a result per tool_use, a note.

    `results` are the executor's: one per scheduled call (every completed tool_use block was
    scheduled), with interruption texts for the unfinished ones. Two user messages in a row
    are merged by `normalize_for_api` when the conversation is next loaded or continued.
    """
    if final is None and completed:
        partial = Message(role="assistant", content=[completed[i] for i in sorted(completed)])
        history.append(partial)
        emit(AssistantTurn(AssistantMessage(message=partial, model="(interrupted)")))
    note = Message(role="user", content=[*results, TextBlock(text=INTERRUPTED_BY_USER)])
    history.append(note)
    emit(ToolResultsMessage(note))
