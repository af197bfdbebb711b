"""The conversation as typed values: content blocks, messages, usage.

Everything that crosses the loop (model output, tool results, transcripts, the wire protocol to
workers) is one of these models, so a malformed block is caught where it enters, not deep in the
loop. Field names follow the Anthropic Messages API so `to_api()` is a plain dump.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AssistantMessage",
    "ContentBlock",
    "ImageBlock",
    "ImageSource",
    "Message",
    "RedactedThinkingBlock",
    "StopReason",
    "TextBlock",
    "ThinkingBlock",
    "ToolResultBlock",
    "ToolResultContent",
    "ToolUseBlock",
    "Usage",
]


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(_Block):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(_Block):
    """Extended-thinking output; kept verbatim because the API wants it echoed back."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block):
    """Thinking the API's safety systems encrypted: opaque `data`, echoed back exactly like a
    `ThinkingBlock` (the model decrypts it to keep its reasoning)."""

    type: Literal["redacted_thinking"] = "redacted_thinking"
    data: str


class ImageSource(_Block):
    type: Literal["base64"] = "base64"
    media_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    data: str


class ImageBlock(_Block):
    type: Literal["image"] = "image"
    source: ImageSource


class ToolUseBlock(_Block):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]
    parse_error: str | None = Field(default=None, exclude=True)
    """Set when the model's input JSON did not parse; never sent to the API. The pipeline turns
    it into an error result that quotes the problem (tests/orchestrator/test_loop.py)."""


ToolResultContent = list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]]


class ToolResultBlock(_Block):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str | ToolResultContent
    is_error: bool = False

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


ContentBlock = Annotated[
    TextBlock | ThinkingBlock | RedactedThinkingBlock | ImageBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"]


class Message(BaseModel):
    """One turn of the conversation as the API sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["user", "assistant"]
    content: list[ContentBlock]

    @classmethod
    def user_text(cls, text: str) -> Message:
        return cls(role="user", content=[TextBlock(text=text)])

    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    def tool_results(self) -> list[ToolResultBlock]:
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def to_api(self) -> dict[str, Any]:
        """The API's JSON form. Cached: messages are frozen, and a long history is re-sent
        every turn (tests/bench/bench_loop.py measures the overhead with 1,000 messages)."""
        return self._api_form

    @cached_property
    def _api_form(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    @cached_property
    def api_size(self) -> int:
        """Characters of the API form as compact JSON: what context accounting counts
        (orchestrator/conversation/compaction.py). Cached like the form itself."""
        return len(json.dumps(self._api_form, separators=(",", ":"), ensure_ascii=False))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Message:
        """A copy without the cached API form (which `update` may have made stale)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("_api_form", None)
        copy.__dict__.pop("api_size", None)
        return copy


class Usage(BaseModel):
    """Token counts of one response, or a sum of them; `+` adds field by field."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
        )


class AssistantMessage(BaseModel):
    """A complete model response: the message plus what the envelope said about it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    message: Message
    model: str
    stop_reason: StopReason | None = None
    usage: Usage = Usage()
    cost_usd: float = 0.0
    request_id: str | None = None
