"""The one small interface every model client implements.

The loop talks to a `ModelClient`: the Anthropic client, the scripted client, and (later) the
broker that a sandboxed worker uses to ask the coordinator for model calls. A client streams
`ModelEvent`s for one request and ends with exactly one `MessageComplete`, or raises
`ModelError` once it has given up.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from orchestrator.messages import AssistantMessage, ContentBlock, Message

__all__ = [
    "BlockComplete",
    "MessageComplete",
    "ModelClient",
    "ModelEvent",
    "ModelRequest",
    "Retry",
    "TextDelta",
    "ToolSpec",
]


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about one tool."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def to_api(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    @cached_property
    def api_size(self) -> int:
        """Characters of the API form as JSON: what the broker's budget estimate counts for
        this tool on every request (cached: the schema is not changed once made)."""
        return len(json.dumps(self.to_api()))


@dataclass(frozen=True)
class ModelRequest:
    system: list[str]
    """System prompt blocks, most stable first (the client places cache breakpoints on them)."""
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 16_384
    """Upper bound of output tokens for this response (thinking included)."""
    thinking_budget: int | None = None
    """Extended thinking's budget in tokens (less than `max_tokens`); None: no thinking."""
    breakpoints_at: tuple[int, ...] | None = None
    """The messages (positions) that carry cache breakpoints, at most two; None: the last two.
    A fork's first request places them where its parent's last request had them, so its body
    starts with that request's bytes (orchestrator/agents/fork.py)."""

    def message_breakpoints(self) -> frozenset[int]:
        if self.breakpoints_at is not None:
            return frozenset(self.breakpoints_at)
        return frozenset(range(max(0, len(self.messages) - 2), len(self.messages)))


@dataclass(frozen=True)
class TextDelta:
    """A piece of text of content block `index`, as it streams."""

    index: int
    text: str


@dataclass(frozen=True)
class BlockComplete:
    """Content block `index` is complete (`content_block_stop`): a tool may start now."""

    index: int
    block: ContentBlock


@dataclass(frozen=True)
class Retry:
    """The attempt failed and will be retried after `delay_s`.

    Everything streamed since the last `Retry` (deltas, completed blocks) is void: consumers
    discard it. Tool calls started from discarded blocks were concurrency-safe (read-only), so
    their results are simply dropped.
    """

    attempt: int
    """The attempt that is about to start (2 for the first retry)."""
    delay_s: float
    error: str
    status: int | None = None
    max_retries: int | None = None
    """Retries the client makes at most (attempts less the first); None: not known."""


@dataclass(frozen=True)
class MessageComplete:
    message: AssistantMessage


ModelEvent = TextDelta | BlockComplete | Retry | MessageComplete


@runtime_checkable
class ModelClient(Protocol):
    """A source of assistant messages.

    `stream` is an async generator: iterate it inside `contextlib.aclosing`.

    **Cancellation:** cancelling the consumer stops the underlying request promptly.
    **Errors:** `ModelError` once the request failed for good; its `reason` is the run's
    terminal reason.
    """

    @property
    def model(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...

    async def aclose(self) -> None: ...
