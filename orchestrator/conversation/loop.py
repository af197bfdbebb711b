"""The agent loop: ask the model, run the tools it asked for, repeat until it stops.

It knows nothing of individual tools and decides from the final message (never from the
envelope's `stop_reason` alone). Every tool_use gets exactly one tool_result, in order, whatever
happens; the run ends with one `TerminalReason`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.max_stop_hook_blocks < 0:
            raise ValueError("max_stop_hook_blocks must not be negative")


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
) -> RunResult:
    """Run turns until the model answers without tool calls, or a terminal reason occurs.

    `messages` is the history to continue (it must end with a user message); it is not mutated.

    **Cancellation:** `control.interrupt()` ends the run with `interrupted` and a consistent
    transcript; an outer cancellation propagates (nothing is left half-appended).
    `compactor` keeps the history inside the model's window
    (orchestrator/conversation/compaction.py): pass the session's to keep its learnt window and
    counts across runs.

    **Errors:** none for model or tool failures: they are terminal reasons or tool_results.
    """
    control = control or RunControl()
    compactor = compactor or Compactor(window=context_window(model.model))
    summaries_before = compactor.compactions
    reacted = False
    # Normalised once: from here on the loop only appends pairs that keep it valid, so a long
    # history is not re-checked every turn (tests/bench/bench_loop.py, benchmark c).
    history = normalize_for_api(list(messages))
    started = time.monotonic()
    usage = Usage()
    cost = 0.0
    limiter = trio.CapacityLimiter(config.max_concurrency)
    tool_specs = pipeline.tools.specs()
    tools_version = pipeline.tools.version
    last_text = ""
    # Replies cut at max_tokens: continued, retried higher, or the end (continuation.py).
    recovery = OutputRecovery(model.model, config.max_tokens, config.thinking_budget)
    stop_blocks = 0

    by_model: dict[str, ModelUsage] = {}
    api_s = 0.0

    def finish(reason: TerminalReason, result: str, turns: int) -> RunResult:
        return RunResult(
            reason,
            history,
            turns,
            usage,
            cost,
            result,
            time.monotonic() - started,
            by_model,
            context_tokens=compactor.account.last_reported,
            context_window=compactor.window,
            compactions=compactor.compactions - summaries_before,
            api_duration_s=api_s,
        )

    def take(compaction: Compaction) -> None:
        nonlocal history, usage, cost
        history = compaction.messages
        if (summary := compaction.summary) is not None:
            usage += summary.usage
            cost += summary.cost_usd
            by_model[summary.model] = by_model.get(summary.model, ModelUsage()).add(summary)

    for turn in range(1, config.max_turns + 1):
        if pipeline.tools.version != tools_version:  # an MCP server listed its tools
            tool_specs, tools_version = pipeline.tools.specs(), pipeline.tools.version
        output = recovery.plan()
        with trio.CancelScope() as scope:
            control._scope = scope
            if control.interrupted:
                scope.cancel()
            compaction = await compactor.before_request(
                history,
                model=model,
                system=config.system,
                tools=tool_specs,
                pipeline=pipeline,
                max_tokens=output.max_tokens,
                emit=emit,
            )
            if compaction is not None:
                take(compaction)
        control._scope = None
        if control.interrupted:
            _close_interrupted(history, None, {}, [], emit)
            return finish("interrupted", "The run was interrupted.", turn)
        request = ModelRequest(
            system=config.system,
            messages=list(history),
            tools=tool_specs,
            max_tokens=output.max_tokens,
            thinking_budget=output.thinking_budget,
        )
        final: AssistantMessage | None = None
        verdict: OutputVerdict = Keep()
        completed: dict[int, ContentBlock] = {}
        results: list[ToolResultBlock] = []
        error: ModelError | None = None
        with trio.CancelScope() as scope:
            control._scope = scope
            if control.interrupted:
                scope.cancel()
            async with trio.open_nursery() as nursery:
                executor = StreamingToolExecutor(pipeline, nursery, limiter)
                asked = time.monotonic()
                try:
                    final = await _stream_turn(model, request, executor, completed, emit)
                except ModelError as exc:
                    error = exc
                    nursery.cancel_scope.cancel()
                else:
                    api_s += time.monotonic() - asked
                    verdict = recovery.review(final)
                    if not verdict.keeps_reply:
                        executor.discard()  # a cut tool call: its reply is dropped
                    else:
                        executor.message_complete(final.message.tool_uses())
                        emit(AssistantTurn(final))
                        history.append(final.message if final.message.content else _EMPTY_TURN)
                        results = await executor.results()
        control._scope = None
        if control.interrupted:
            results = executor.settled_results()

        if final is not None:
            usage += final.usage
            cost += final.cost_usd
            by_model[final.model] = by_model.get(final.model, ModelUsage()).add(final)
            last_text = final.message.text() or last_text
        if control.interrupted:
            _close_interrupted(history, final, completed, results, emit)
            return finish("interrupted", "The run was interrupted.", turn)
        if error is not None:
            if error.reason != "prompt_too_long" or reacted:
                return finish(error.reason, error.message, turn)
            # Refused as too long: learn the window, summarise, retry once (never a loop).
            reacted = True
            compactor.learn(error.message)
            try:
                take(
                    await compactor.compact(
                        history,
                        trigger="reactive",
                        model=model,
                        system=config.system,
                        tools=tool_specs,
                        pipeline=pipeline,
                        emit=emit,
                    )
                )
            except ModelError as exc:
                return finish(error.reason, f"{error.message} Compacting failed: {exc}", turn)
            continue
        assert final is not None
        reacted = False
        compactor.observe(
            request.messages, final, compactor.account.fixed_chars(config.system, tool_specs)
        )
        match verdict:
            case RetryHigher(note=note):
                emit(RetryScheduled(2, 0.0, note, None))
                continue
            case Resume(prompt=prompt):
                history.append(prompt)
                emit(ToolResultsMessage(prompt))
                continue
            case Truncated(result=text):
                return finish("output_truncated", text, turn)
        hooks = pipeline.hooks
        if not final.message.tool_uses():
            stop_event: HookEvent = "SubagentStop" if config.agent_id else "Stop"
            if hooks is None or not hooks.has(stop_event):
                return finish("completed", recovery.answer(final.message.text()), turn)
            with trio.CancelScope() as scope:
                control._scope = scope
                if control.interrupted:
                    scope.cancel()
                outcome = await hooks.stop(active=stop_blocks > 0, agent_id=config.agent_id)
            control._scope = None
            if control.interrupted:
                return finish("interrupted", "The run was interrupted.", turn)
            if hooks.stop_requested is not None:
                return finish("hook_blocked", hooks.stop_requested, turn)
            if not outcome.blocked:
                return finish("completed", recovery.answer(final.message.text()), turn)
            if stop_blocks >= config.max_stop_hook_blocks:
                return finish(
                    "hook_blocked",
                    f"{stop_event} hooks kept the run going {stop_blocks} times and blocked it "
                    "again "
                    f"(limit: [limits] max_stop_hook_blocks = {config.max_stop_hook_blocks}): "
                    + outcome.reason_text,
                    turn,
                )
            stop_blocks += 1
            feedback = Message.user_text(f"{stop_event} hook feedback:\n" + outcome.reason_text)
            history.append(feedback)
            emit(ToolResultsMessage(feedback))
            continue
        tool_results = Message(role="user", content=list(results))
        history.append(tool_results)
        emit(ToolResultsMessage(tool_results))
        if hooks is not None and hooks.stop_requested is not None:
            return finish("hook_blocked", hooks.stop_requested, turn)
    return finish(
        "max_turns", last_text or f"Stopped after {config.max_turns} turns.", config.max_turns
    )


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
