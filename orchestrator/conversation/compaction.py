"""Keeping a long conversation inside the model's context window.

The loop asks `Compactor.before_request` before every request. It estimates the request's size
(`ContextAccount`: the input tokens the API reported for the last request, plus what was
appended since, converted at the characters-per-token ratio that request showed; near the
limit, the model's `count_tokens` endpoint gives the exact figure) and, when it
would pass `threshold` of the window (or leave no room for `max_tokens`), makes it smaller, the
cheap way first:

1. **Clearing old tool results** (`clear_old_results`): results beyond the most recent few,
   over a size, become a one-line note saying what they were and how to get them again. The
   tool_use/tool_result pairs stay; everything is cleared in one batch, so the prompt cache
   breaks once, not every turn.
2. **Summarising** when that is not enough: a summary request (the same system prompt and
   tools, the conversation, and a last user message asking for the summary in words), then
   the history becomes a compact boundary: one user message with the summary and the files
   read most recently (re-read now, through the tool pipeline: the sandbox and the deny rules
   apply), followed by the last turns verbatim. The read ledger keeps only those files (and
   the ones the kept turns touched): anything else must be read again before an edit.

A request refused as too long (`prompt_too_long`) teaches the window ("N tokens > M maximum")
and triggers one summary and one retry (`Compactor.recover`); the loop never loops on it.
The standing context (memory files, git snapshot) lives in the system prompt, which compaction
never touches.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.aio import closing_iter
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.conversation.repair import normalize_for_api
from orchestrator.errors import ModelError
from orchestrator.events import CompactBoundary, EventSink
from orchestrator.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from orchestrator.model.base import MessageComplete, ModelClient, ModelRequest, ToolSpec
from orchestrator.text import truncate_middle

__all__ = [
    "DEFAULT_THRESHOLD",
    "SUMMARY_PROMPT",
    "Compaction",
    "Compactor",
    "ContextAccount",
    "Trigger",
    "clear_old_results",
    "learn_window",
]

Trigger = Literal["auto", "manual", "reactive"]

DEFAULT_THRESHOLD = 0.8
"""Fraction of the window a request may fill before the conversation is compacted."""
LOW_WATER = 0.6
"""Clearing old results is enough when it brings the estimate under this fraction."""
NEAR = 0.1
"""Within this fraction of the limit, the estimate is checked with `count_tokens`."""
DEFAULT_CHARS_PER_TOKEN = 3.5
"""Characters of the request's JSON per token until a response tells the real ratio."""
KEEP_RECENT_RESULTS = 3
"""Tool results at the end that clearing never touches."""
CLEAR_MIN_CHARS = 1_000
"""Results shorter than this are not worth a note."""
SUMMARY_MAX_TOKENS = 8_192
TAIL_FRACTION = 0.15
"""Share of the window the turns kept verbatim after a summary may take."""
REREAD_FILES = 5
REREAD_CHARS = 20_000
"""Characters of one re-read file kept (head and tail), and about the whole re-read budget x2."""

SUMMARY_PROMPT = """\
The conversation so far is about to be compacted to free context. Write a summary of the work \
so far that lets you continue without the earlier messages. Do not call any tools; answer with \
text only. Cover, under these headings:
1. Goal: what the user asked for, in their words where it matters.
2. Decisions: what was decided and why, constraints discovered.
3. Files: every file read, created or changed, with its current state.
4. Done and left: what is finished, what remains.
5. Next step: exactly what you were about to do next (the next command or file).
"""

CONTINUATION = """\
This session continues from an earlier part of the conversation that was compacted to save \
context. The summary below covers it; the files you read most recently were re-read after the \
compaction and are included as they are now. Files not included here must be read again \
before you edit them. Continue the work from where it stopped, without asking the user.

Summary of the earlier conversation:
{summary}"""

_TOO_LONG = re.compile(r"(\d[\d,]*)\s*tokens?\s*>\s*(\d[\d,]*)\s*maximum", re.I)
_OVER_LIMIT = re.compile(r"(\d[\d,]*)\s*\+\s*(\d[\d,]*)\s*>\s*(\d[\d,]*)")


def learn_window(message: str) -> int | None:
    """The window a refusal names: "prompt is too long: N tokens > M maximum", or "input length
    and `max_tokens` exceed context limit: N + K > M"; None when it names none."""
    if found := _TOO_LONG.search(message):
        return int(found.group(2).replace(",", ""))
    if found := _OVER_LIMIT.search(message):
        return int(found.group(3).replace(",", ""))
    return None


def _chars(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


class ContextAccount:
    """How many tokens the next request will hold, from what the API last reported.

    `observe` takes each response's usage with the request it answered; `estimate` adds what
    was appended since at the ratio that request showed (characters of JSON per token)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.last_reported = 0
        """Input tokens (cached included) of the last request the API answered."""
        self._ratio = DEFAULT_CHARS_PER_TOKEN
        self._anchor: Message | None = None
        self._anchor_len = 0
        self._anchor_chars = 0
        self._fixed: tuple[tuple[int, int], int] | None = None

    @property
    def chars_per_token(self) -> float:
        """The ratio the last answered request showed (or the default before one)."""
        return self._ratio

    def fixed_chars(self, system: Sequence[str], tools: Sequence[ToolSpec]) -> int:
        """Characters of the system prompt and tool definitions (cached per pair of lists)."""
        key = (id(system), id(tools))
        if self._fixed is None or self._fixed[0] != key:
            self._fixed = (key, _chars(list(system)) + _chars([t.to_api() for t in tools]))
        return self._fixed[1]

    def observe(self, sent: Sequence[Message], fixed_chars: int, usage_tokens: int) -> None:
        """The request of `sent` messages (plus `fixed_chars` of system and tools) was answered
        with `usage_tokens` input tokens."""
        if usage_tokens <= 0 or not sent:
            return
        if self._anchored(sent):  # only what was appended since the last report is new
            chars = self._anchor_chars + sum(m.api_size for m in sent[self._anchor_len :])
        else:
            chars = fixed_chars + sum(m.api_size for m in sent)
        self._ratio = min(8.0, max(2.0, chars / usage_tokens))
        self.last_reported = usage_tokens
        self._anchor, self._anchor_len, self._anchor_chars = sent[-1], len(sent), chars

    def forget(self) -> None:
        """The history was rewritten: estimate from characters until the next response."""
        self._anchor = None

    def _anchored(self, history: Sequence[Message]) -> bool:
        """`history` continues the request last reported on (nothing before it changed)."""
        return (
            self._anchor is not None
            and len(history) >= self._anchor_len
            and history[self._anchor_len - 1] is self._anchor
        )

    def estimate(self, history: Sequence[Message], fixed_chars: int) -> int:
        """Input tokens of a request of `history` (plus `fixed_chars`)."""
        if self._anchored(history):
            added = sum(m.api_size for m in history[self._anchor_len :])
            return self.last_reported + int(added / self._ratio)
        return int((fixed_chars + sum(m.api_size for m in history)) / self._ratio)


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: the new history, the summary response (None when clearing
    results was enough), and the size before and after."""

    messages: list[Message]
    trigger: Trigger
    pre_tokens: int
    post_tokens: int
    summary: AssistantMessage | None


def clear_old_results(
    history: Sequence[Message],
    *,
    keep_recent: int = KEEP_RECENT_RESULTS,
    min_chars: int = CLEAR_MIN_CHARS,
) -> tuple[list[Message], int]:
    """`history` with every tool result but the last `keep_recent` that is at least
    `min_chars` long replaced by a note; returns it and the characters removed. Messages
    without a change are the same objects."""
    uses: dict[str, ToolUseBlock] = {
        b.id: b for m in history if m.role == "assistant" for b in m.tool_uses()
    }
    positions = [
        (i, j)
        for i, m in enumerate(history)
        if m.role == "user"
        for j, b in enumerate(m.content)
        if isinstance(b, ToolResultBlock)
    ]
    old = positions[: max(0, len(positions) - keep_recent)]
    out = list(history)
    removed = 0
    for i, j in old:
        block = out[i].content[j]
        assert isinstance(block, ToolResultBlock)
        size = _chars(block.model_dump(mode="json")["content"])
        if size < min_chars or _is_note(block):
            continue
        note = TextBlock(text=_note(uses.get(block.tool_use_id), len(block.text())))
        content = list(out[i].content)
        content[j] = block.model_copy(update={"content": [note]})
        out[i] = Message(role="user", content=content)
        removed += size - _chars(note.text)
    return out, removed


_NOTE_PREFIX = "[Earlier tool result cleared to save context"


def _is_note(block: ToolResultBlock) -> bool:
    return block.text().startswith(_NOTE_PREFIX)


def _note(use: ToolUseBlock | None, size: int) -> str:
    what = ""
    if use is not None:
        target = next(
            (
                str(use.input[k])
                for k in ("file_path", "path", "pattern", "command")
                if k in use.input
            ),
            "",
        )
        what = f": {use.name}({truncate_middle(target, 200)})" if target else f": {use.name}"
    return f"{_NOTE_PREFIX}{what}, {size:,} characters. Call the tool again if you need it.]"


class Compactor:
    """One agent's context accounting and compaction, kept across its runs (learnt window,
    count of compactions)."""

    def __init__(self, *, window: int, threshold: float = DEFAULT_THRESHOLD) -> None:
        if not 0.5 <= threshold <= 0.95:
            raise ValueError("the compaction threshold must be between 0.5 and 0.95")
        self.account = ContextAccount(window)
        self.threshold = threshold
        self.compactions = 0
        """Summaries made (clearing results alone does not count)."""
        self.cleared = 0
        """Times old tool results were cleared."""
        self.counted = 0
        """Times the estimate was checked with the model's `count_tokens`."""

    @property
    def window(self) -> int:
        return self.account.window

    def learn(self, message: str) -> bool:
        """Take the window a refusal names, when it is smaller than the one assumed."""
        window = learn_window(message)
        if window is None or window >= self.account.window:
            return False
        self.account.window = window
        return True

    def observe(self, sent: Sequence[Message], turn: AssistantMessage, fixed_chars: int) -> None:
        usage = turn.usage
        total = usage.input_tokens + usage.cache_read_input_tokens
        self.account.observe(sent, fixed_chars, total + usage.cache_creation_input_tokens)

    def _limit(self, max_tokens: int) -> int:
        """Input tokens a request may hold before it is compacted."""
        window = self.account.window
        return min(int(window * self.threshold), window - min(max_tokens, window // 4))

    async def before_request(
        self,
        history: list[Message],
        *,
        model: ModelClient,
        system: list[str],
        tools: list[ToolSpec],
        pipeline: ToolPipeline,
        max_tokens: int,
        emit: EventSink,
    ) -> Compaction | None:
        """Compact `history` when the next request would pass the threshold; None otherwise.
        A failed summary leaves the history as it is (the request may still fit).

        **Cancellation:** propagates (the history is unchanged)."""
        fixed = self.account.fixed_chars(system, tools)
        estimate = self.account.estimate(history, fixed)
        limit = self._limit(max_tokens)
        if estimate <= limit * (1 - NEAR):
            return None
        count = getattr(model, "count_tokens", None)
        if estimate <= limit * (1 + NEAR) and count is not None:
            # Near the limit an estimate can be wrong either way: ask the API (no output).
            counted = await count(ModelRequest(system, history, tools, max_tokens))
            if isinstance(counted, int) and counted > 0:
                self.account.observe(history, fixed, counted)
                self.counted += 1
                estimate = counted
        if estimate <= limit:
            return None
        try:
            return await self.compact(
                history, trigger="auto", model=model, system=system, tools=tools,
                pipeline=pipeline, emit=emit, estimate=estimate,
            )  # fmt: skip
        except ModelError:
            return None

    async def compact(
        self,
        history: list[Message],
        *,
        trigger: Trigger,
        model: ModelClient,
        system: list[str],
        tools: list[ToolSpec],
        pipeline: ToolPipeline,
        emit: EventSink,
        instructions: str | None = None,
        estimate: int | None = None,
    ) -> Compaction:
        """Make `history` smaller: clear old results, and summarise when that is not enough
        (always, for a `manual` or `reactive` trigger).

        **Errors:** `ModelError` when the summary request fails (the history is unchanged)."""
        fixed = self.account.fixed_chars(system, tools)
        pre = estimate if estimate is not None else self.account.estimate(history, fixed)
        cleared, removed = clear_old_results(history)
        if trigger == "auto" and removed:
            after = pre - int(removed / self.account.chars_per_token)
            if after <= self.account.window * LOW_WATER:
                self.cleared += 1
                self.account.forget()
                done = Compaction(cleared, trigger, pre, after, None)
                emit(CompactBoundary(trigger, pre, after, cleared, summarised=False))
                return done
        hooks = pipeline.hooks
        if hooks is not None:
            await hooks.pre_compact(trigger, instructions)
        summary = await self._summarise(cleared, model, system, tools, fixed, instructions)
        text = summary.message.text().strip()
        if not text:
            raise ModelError("The summary request answered without text; nothing was compacted.")
        tail = self._tail(history)
        restarted = () if hooks is None else (await hooks.session_start("compact")).context
        head = Message(
            role="user",
            content=[
                TextBlock(text=CONTINUATION.format(summary=text)),
                *await self._reread(history, tail, pipeline),
                *(TextBlock(text=context) for context in restarted),
            ],
        )
        messages = normalize_for_api([head, *tail])
        self.compactions += 1
        self.account.forget()
        post = self.account.estimate(messages, fixed)
        emit(CompactBoundary(trigger, pre, post, messages, summarised=True))
        return Compaction(messages, trigger, pre, post, summary)

    async def _summarise(
        self,
        history: list[Message],
        model: ModelClient,
        system: list[str],
        tools: list[ToolSpec],
        fixed: int,
        instructions: str | None,
    ) -> AssistantMessage:
        """One summary request of `history` (its oldest turns dropped when it would not fit)."""
        prompt = SUMMARY_PROMPT
        if instructions:
            prompt += f"\nFocus the summary on: {instructions}\n"
        room = self.account.window - SUMMARY_MAX_TOKENS - 1_000
        source = _fit(history, room, fixed, self.account.chars_per_token)
        request = ModelRequest(
            system=system,
            messages=normalize_for_api([*source, Message.user_text(prompt)]),
            tools=tools,
            max_tokens=SUMMARY_MAX_TOKENS,
        )
        async with closing_iter(model.stream(request)) as events:
            async for event in events:
                if isinstance(event, MessageComplete):
                    return event.message
        raise ModelError("The summary stream ended without a complete message.")

    def _tail(self, history: list[Message]) -> list[Message]:
        """The last turns kept verbatim: from an assistant message, within the tail budget."""
        budget = self.account.window * TAIL_FRACTION * self.account.chars_per_token
        return list(history[_tail_start(history, budget) :])

    async def _reread(
        self, history: list[Message], tail: list[Message], pipeline: ToolPipeline
    ) -> list[TextBlock]:
        """The files read most recently (not in the kept turns), read again now through the
        pipeline; the read ledger keeps only them and the files the kept turns touched."""
        wanted, kept = _reread_candidates(history, tail, pipeline.ctx.is_inside_roots)
        pipeline.ctx.read_ledger.retain(kept)
        blocks: list[TextBlock] = []
        budget = 2 * REREAD_CHARS
        for n, path in enumerate(wanted):
            if budget <= 0:
                break
            use = ToolUseBlock(id=f"toolu_reread_{n}", name="Read", input={"file_path": path})
            result = await pipeline.execute(pipeline.prepare(use))
            if result.is_error:
                continue
            text = truncate_middle(result.text(), min(REREAD_CHARS, budget))
            budget -= len(text)
            header = f"Contents of {path}, re-read after the compaction:"
            blocks.append(TextBlock(text=f"{header}\n{text}"))
        return blocks


def _reread_candidates(
    history: list[Message], tail: list[Message], inside: Callable[[Path], bool]
) -> tuple[list[str], set[Path]]:
    """(the newest distinct absolute paths Read outside the kept `tail`, inside the roots, at
    most `REREAD_FILES`; the paths the tail's calls touched, which stay in the ledger)."""
    in_tail = {
        os.path.normpath(p)
        for m in tail
        for b in m.tool_uses()
        for p in (b.input.get("file_path"), b.input.get("notebook_path"))
        if isinstance(p, str)
    }
    wanted: list[str] = []
    for message in reversed(history):
        for block in reversed(message.tool_uses()):
            path = block.input.get("file_path")
            if block.name != "Read" or not isinstance(path, str) or not os.path.isabs(path):
                continue
            path = os.path.normpath(path)
            if path not in in_tail and path not in wanted and inside(Path(path)):
                wanted.append(path)
        if len(wanted) >= REREAD_FILES:
            break
    kept = {Path(p) for p in in_tail} | {Path(p) for p in wanted[:REREAD_FILES]}
    return wanted[:REREAD_FILES], kept


def _fit(history: list[Message], room: int, fixed: int, ratio: float) -> list[Message]:
    """`history` without its oldest turns, so it fits in `room` tokens: the first user message
    stays (the task), then the newest turns that fit, from an assistant message on."""
    total = fixed + sum(m.api_size for m in history)
    if total / ratio <= room or len(history) < 3:
        return history
    first = history[0]
    start = _tail_start(history, room * ratio - fixed - first.api_size - 200)
    omitted = Message.user_text("[Part of the conversation was omitted here to fit the window.]")
    return normalize_for_api([first, omitted, *history[start:]])


def _tail_start(history: Sequence[Message], budget: float) -> int:
    """Where the newest turns that fit in `budget` characters begin: an assistant message's
    index (never 0), or `len(history)` when not even the last turn fits."""
    size, start = 0.0, len(history)
    for i in range(len(history) - 1, 0, -1):
        size += history[i].api_size
        if size > budget:
            break
        if history[i].role == "assistant":
            start = i
    return start
