"""What the loop does with a reply cut at `max_tokens`, so a cut answer is never a clean
`completed`.

The loop asks `OutputRecovery.review` about every complete reply (one call, in one place) and
acts on the verdict:

- `Keep`: not cut (or cut right after complete tool calls, which run as usual).
- `Resume`: text was cut. The partial reply stays in the history, followed by `prompt` (a user
  message asking the model to go on exactly where it stopped, without repeating itself); the
  run's answer is the concatenation of the pieces (`answer`). At most `max_continuations`
  (default 3) in a row.
- `RetryHigher`: a tool call was cut (its input JSON is incomplete), or nothing usable came
  before the cut. The reply is dropped, not kept, and the request is sent again once with
  `max_tokens` raised to the model's output limit.
- `Truncated`: still cut after those attempts. The run ends `output_truncated` with what was
  written (`keeps_reply`: whether the last reply stays in the history: a text does, a cut tool call
  never does).

`output_plan` also fits extended thinking into a request: the API wants `max_tokens` above the
thinking budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from orchestrator.messages import AssistantMessage, Message
from orchestrator.model.catalog import default_max_tokens, output_limit

__all__ = [
    "CONTINUE_PROMPT",
    "MAX_CONTINUATIONS",
    "THINKING_ANSWER_TOKENS",
    "Keep",
    "OutputPlan",
    "OutputRecovery",
    "OutputVerdict",
    "Resume",
    "RetryHigher",
    "Truncated",
    "output_plan",
]

MAX_CONTINUATIONS = 3
"""Continuations of a cut text in a row before the run ends `output_truncated`."""

CONTINUE_PROMPT = (
    "Your previous reply was cut off because it reached the output token limit. Continue "
    "exactly where it stopped, mid-word or mid-sentence if need be. Do not repeat anything you "
    "already wrote, do not apologise and do not recap: your next words are appended directly "
    "to the cut reply."
)
"""The user message that asks for the rest of a cut text."""

THINKING_ANSWER_TOKENS = 4_096
"""Tokens left for the answer when `max_tokens` must be raised above a thinking budget."""


@dataclass(frozen=True)
class OutputPlan:
    """The output side of a request."""

    max_tokens: int
    thinking_budget: int | None


def output_plan(max_tokens: int, thinking_budget: int | None, limit: int) -> OutputPlan:
    """`max_tokens` clamped to `limit`, raised above `thinking_budget` (by
    `THINKING_ANSWER_TOKENS`, still within `limit`); a budget `limit` cannot hold is lowered to
    leave room for an answer."""
    max_tokens = min(max_tokens, limit)
    if thinking_budget is None:
        return OutputPlan(max_tokens, None)
    if max_tokens <= thinking_budget:
        max_tokens = min(limit, thinking_budget + THINKING_ANSWER_TOKENS)
    budget = min(thinking_budget, max(1, max_tokens - THINKING_ANSWER_TOKENS), max_tokens - 1)
    return OutputPlan(max_tokens, budget)


@dataclass(frozen=True)
class Keep:
    """Not cut: the loop goes on as usual."""

    keeps_reply: ClassVar[bool] = True


@dataclass(frozen=True)
class Resume:
    """Keep the cut text; append `prompt` and ask again."""

    prompt: Message
    keeps_reply: ClassVar[bool] = True


@dataclass(frozen=True)
class RetryHigher:
    """Drop the cut reply; send the request again with `max_tokens`."""

    max_tokens: int
    note: str
    """Why, for the retry event."""
    keeps_reply: ClassVar[bool] = False


@dataclass(frozen=True)
class Truncated:
    """End the run `output_truncated` with `result`."""

    result: str
    keeps_reply: bool
    """The last reply stays in the history (a text does; a cut tool call does not)."""


OutputVerdict = Keep | Resume | RetryHigher | Truncated


@dataclass
class OutputRecovery:
    """One run's state of cut replies: continuations so far, the pieces of the answer, and
    whether the next request is a retry with a higher limit."""

    model: str
    """The model the run talks to (its output limit bounds every request)."""
    max_tokens: int | None = None
    """Configured `max_tokens`; None: the model's default (`catalog.default_max_tokens`)."""
    thinking_budget: int | None = None
    max_continuations: int = MAX_CONTINUATIONS
    _continuations: int = 0
    _pieces: list[str] = field(default_factory=list)
    _raised: int | None = None

    @property
    def limit(self) -> int:
        return output_limit(self.model)

    def plan(self) -> OutputPlan:
        """The output side of the next request."""
        wanted = self._raised or self.max_tokens or default_max_tokens(self.model)
        return output_plan(wanted, self.thinking_budget, self.limit)

    def review(self, final: AssistantMessage) -> OutputVerdict:
        """The verdict on a complete reply (see the module docstring); updates the state."""
        asked = self.plan().max_tokens
        retried, self._raised = self._raised is not None, None
        message = final.message
        tool_uses = message.tool_uses()
        if final.stop_reason != "max_tokens" or (
            tool_uses and all(block.parse_error is None for block in tool_uses)
        ):
            if tool_uses:
                self._pieces.clear()
            self._continuations = 0
            return Keep()
        text = message.text()
        if text and not tool_uses:
            if self._continuations >= self.max_continuations:
                return Truncated(self.answer(text), keeps_reply=True)
            self._continuations += 1
            self._pieces.append(text)
            return Resume(Message.user_text(CONTINUE_PROMPT))
        where = f"inside a {tool_uses[-1].name} call" if tool_uses else "before any answer"
        if not retried and asked < self.limit:
            self._raised = self.limit
            return RetryHigher(
                self.limit,
                f"The reply was cut at max_tokens={asked} {where}; it is sent again with "
                f"max_tokens={self.limit}.",
            )
        return Truncated(
            f"The model's reply was cut at its output token limit (max_tokens={asked}) {where}"
            + (", after a retry with the higher limit." if retried else ".")
            + " Ask for the work in smaller steps (for example, a large file in several edits).",
            keeps_reply=False,
        )

    def answer(self, text: str) -> str:
        """The whole answer that `text` ends: the pieces of a continued text, then `text`."""
        whole = "".join(self._pieces) + text
        self._pieces.clear()
        return whole
