"""Between Warren's types and the Messages API's wire shapes, in both directions, as pure code.

Out: `request_params` turns a `ModelRequest` into the body of `POST /v1/messages`, with the
prompt-cache breakpoints placed and the shapes the API rejects (empty text, empty assistant
turns) normalised away; `encode_request` is the same body as JSON bytes, built from cached
per-message JSON because every turn re-sends the whole conversation.

In: `SSEDecoder` splits the response body into server-sent events and `StreamAccumulator`
turns the API's stream events into `TextDelta`/`BlockComplete` events and the final
`AssistantMessage`.

The Anthropic client uses these around the SDK's transport; keeping them free of the SDK (and
of I/O) lets them be tested with plain values (tests/orchestrator/model/test_convert.py).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from orchestrator.messages import (
    AssistantMessage,
    ContentBlock,
    Message,
    RedactedThinkingBlock,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.model.base import BlockComplete, ModelRequest, TextDelta, ToolSpec
from orchestrator.model.catalog import cost_usd

__all__ = [
    "EMPTY_CONTENT_TEXT",
    "MAX_TOOL_INPUT_BYTES",
    "MAX_TOOL_INPUT_DEPTH",
    "MessageJsonCache",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamAccumulator",
    "StreamProtocolError",
    "encode_request",
    "message_param",
    "messages_param",
    "request_params",
    "system_param",
    "thinking_param",
    "tool_input_problem",
    "tools_param",
]

EMPTY_CONTENT_TEXT = "(no content)"
"""Stands in for a message whose content would be empty: the API rejects empty turns."""

_EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}
_UNCACHEABLE_TYPES = frozenset({"thinking", "redacted_thinking"})
_STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))
_PARSE_ERROR_SNIPPET = 300

MAX_TOOL_INPUT_BYTES = 10 * 1024 * 1024
"""A tool call's input larger than this (as JSON text) is refused before it is parsed."""
MAX_TOOL_INPUT_DEPTH = 64
"""A tool call's input nested deeper than this (objects and arrays) is refused: deeper
structures only serve to exhaust a recursive consumer (pydantic, the transcript, a tool)."""


# --- out: the request ----------------------------------------------------------------------------


def system_param(system: Sequence[str]) -> list[dict[str, Any]]:
    """System blocks as text blocks, with a cache breakpoint on the last (the stable prefix)."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text} for text in system if text]
    if blocks:
        blocks[-1]["cache_control"] = dict(_EPHEMERAL)
    return blocks


def tools_param(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool definitions, with a cache breakpoint on the last so the tool list is cached."""
    params = [tool.to_api() for tool in tools]
    if params:
        params[-1] = {**params[-1], "cache_control": dict(_EPHEMERAL)}
    return params


def thinking_param(budget_tokens: int) -> dict[str, Any]:
    """Extended thinking with a budget of `budget_tokens` (the request's `max_tokens` must be
    larger: `orchestrator.conversation.continuation.output_plan` sees to it)."""
    return {"type": "enabled", "budget_tokens": budget_tokens}


def message_param(message: Message, *, breakpoint: bool = False) -> dict[str, Any]:
    """One message in API form; with `breakpoint`, a cache breakpoint on its last block.

    The breakpoint sits on the last content block that can carry one (thinking blocks cannot).
    The message is not touched: `Message.to_api()` is cached, so a changed block is a copy.
    """
    api = message.to_api()
    content: list[dict[str, Any]] = [
        block
        for block in api["content"]
        if not (block.get("type") == "text" and not block.get("text"))
    ]
    if not content:
        content = [{"type": "text", "text": EMPTY_CONTENT_TEXT}]
    if breakpoint:
        for index in range(len(content) - 1, -1, -1):
            if content[index].get("type") not in _UNCACHEABLE_TYPES:
                content[index] = {**content[index], "cache_control": dict(_EPHEMERAL)}
                break
    return {"role": api["role"], "content": content}


def messages_param(
    messages: Sequence[Message], *, breakpoints: int = 2, at: frozenset[int] | None = None
) -> list[dict[str, Any]]:
    """The conversation in API form, with cache breakpoints on the last `breakpoints` messages
    (or on the positions `at`)."""
    if at is None:
        at = frozenset(range(max(0, len(messages) - breakpoints), len(messages)))
    return [
        message_param(message, breakpoint=position in at)
        for position, message in enumerate(messages)
    ]


def request_params(model: str, request: ModelRequest) -> dict[str, Any]:
    """Keyword arguments for `messages.create`: model, max_tokens, messages, thinking, system,
    tools.

    At most four cache breakpoints, the API's limit: system, tools, and two messages (the last
    two, or `ModelRequest.breakpoints_at`).
    """
    return _with_options(
        request,
        model=model,
        max_tokens=request.max_tokens,
        messages=messages_param(request.messages, at=request.message_breakpoints()),
    )


def _with_options(request: ModelRequest, **first: Any) -> dict[str, Any]:
    """`first`, then the request's thinking, system and tools, each only when it has one (in
    this order: `encode_request` writes the body's keys as `request_params` has them)."""
    params = dict(first)
    if request.thinking_budget is not None:
        params["thinking"] = thinking_param(request.thinking_budget)
    system = system_param(request.system)
    if system:
        params["system"] = system
    if request.tools:
        params["tools"] = tools_param(request.tools)
    return params


@dataclass
class MessageJsonCache:
    """The JSON of messages already sent, so a long history is not re-encoded every turn.

    Every turn re-sends the whole conversation; only its last two messages change form (they
    carry the cache breakpoints). Entries hold their message, so an id is never reused while
    cached; the cache is emptied when it reaches `limit` entries.
    """

    limit: int = 50_000
    _entries: dict[int, tuple[Message, str]] = field(default_factory=dict)
    _prefix: tuple[list[Message], str] | None = None
    """The messages of the last prefix `joined` made, and their JSON joined."""

    def joined(self, messages: Sequence[Message], upto: int) -> str:
        """The JSON of `messages[:upto]`, comma-joined. A conversation that only grew since
        the last call (the same message objects in front: checked one by one, a compaction
        rewrites some) reuses that call's text, so a turn costs what was appended plus one
        string copy, not a re-encoding pass (tests/bench/bench_long_session.py)."""
        if upto <= 0:
            return ""
        head = list(messages[:upto])
        last = self._prefix
        n = len(last[0]) if last is not None else 0
        if last is not None and 0 < n <= upto and all(map(operator.is_, head[:n], last[0])):
            text = ", ".join([last[1], *(self.json(m) for m in head[n:])])
        else:
            text = ", ".join(self.json(m) for m in head)
        self._prefix = (head, text)
        return text

    def json(self, message: Message) -> str:
        entry = self._entries.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1]
        text = json.dumps(message_param(message))
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[id(message)] = (message, text)
        return text


def encode_request(
    model: str, request: ModelRequest, cache: MessageJsonCache, *, stream: bool = True
) -> bytes:
    """The JSON body of `POST /v1/messages`: `request_params` plus `stream`, encoded.

    Built from per-message JSON (cached for all but the last two messages), which keeps a turn
    of a 1,000-message conversation well under a millisecond
    (tests/orchestrator/model/test_convert.py checks that the result equals `request_params`).
    """
    head = _with_options(request, model=model, max_tokens=request.max_tokens, stream=stream)
    messages = request.messages
    at = request.message_breakpoints()
    first_breakpoint = min(at, default=len(messages))
    parts = [cache.joined(messages, first_breakpoint)] if first_breakpoint else []
    rest = enumerate(messages[first_breakpoint:], start=first_breakpoint)
    parts += [
        json.dumps(message_param(m, breakpoint=True)) if i in at else cache.json(m)
        for i, m in rest
    ]
    return f'{json.dumps(head)[:-1]}, "messages": [{", ".join(parts)}]}}'.encode()


# --- in: server-sent events ---------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSentEvent:
    event: str
    """The `event:` field; `message` when the event named none."""
    data: str
    """The `data:` lines joined with newlines."""

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SSEDecoder:
    """An incremental decoder of a `text/event-stream` body (lines end with LF or CRLF).

    Fed raw chunks as they arrive, it returns the events each chunk completes, so no event
    waits for the next chunk. A plain object rather than an async generator: nothing is left
    half-consumed when the stream fails mid-way.
    """

    _buffer: bytearray = field(default_factory=bytearray)
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            line = bytes(self._buffer[start:end]).rstrip(b"\r").decode("utf-8", errors="replace")
            start = end + 1
            event = self._line(line)
            if event is not None:
                events.append(event)
        del self._buffer[:start]
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            if not self._data and not self._event:
                return None
            event = ServerSentEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


# --- in: the stream's events -------------------------------------------------------------------


@dataclass
class _BlockBuilder:
    kind: str
    start: Mapping[str, Any]
    text: list[str] = field(default_factory=list)
    partial_json: list[str] = field(default_factory=list)
    signature: str = ""

    def build(self) -> ContentBlock | None:
        if self.kind == "text":
            return TextBlock(text="".join(self.text))
        if self.kind == "thinking":
            return ThinkingBlock(
                thinking="".join(self.text),
                signature=self.signature or self.start.get("signature", ""),
            )
        if self.kind == "redacted_thinking":
            return RedactedThinkingBlock(data=str(self.start.get("data", "")))
        if self.kind == "tool_use":
            return _tool_use(self.start, "".join(self.partial_json))
        return None


def _tool_use(start: Mapping[str, Any], raw: str) -> ToolUseBlock:
    """The tool call with its input parsed, or with `parse_error` saying why it did not parse
    (not JSON, not an object, too large, nested too deep: `tool_input_problem`)."""
    tool_id, name = str(start.get("id", "")), str(start.get("name", ""))
    if not raw.strip():
        initial = start.get("input")
        value: object = initial if isinstance(initial, dict) else {}
        problem = tool_input_problem(value, name=name)
        if problem is not None:
            return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=problem)
        assert isinstance(value, dict)
        return ToolUseBlock(id=tool_id, name=name, input=value)
    if _too_large(raw):
        problem = (
            f"The input of this {name} call is larger than {MAX_TOOL_INPUT_BYTES} bytes "
            f"({len(raw)} characters); pass large content in smaller calls"
        )
        return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=problem)
    snippet = raw if len(raw) <= _PARSE_ERROR_SNIPPET else raw[:_PARSE_ERROR_SNIPPET] + "..."
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        problem = (
            f"The input of this {name} call is not valid JSON ({exc.msg} at character {exc.pos}); "
            f"it was: {snippet}"
        )
        return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=problem)
    except RecursionError:  # nested beyond the decoder's own limit (about 1000 levels)
        return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=_too_deep(name))
    if not isinstance(value, dict):
        problem = f"The input of this {name} call is JSON but not an object; it was: {snippet}"
        return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=problem)
    # Fewer openers than the limit cannot nest deeper than it: most inputs skip the walk.
    if raw.count("{") + raw.count("[") > MAX_TOOL_INPUT_DEPTH:
        problem = tool_input_problem(value, name=name)
        if problem is not None:
            return ToolUseBlock(id=tool_id, name=name, input={}, parse_error=problem)
    return ToolUseBlock(id=tool_id, name=name, input=value)


def tool_input_problem(value: object, *, name: str = "tool") -> str | None:
    """Why a decoded tool input is refused (nested deeper than `MAX_TOOL_INPUT_DEPTH`), or
    None. Iterative and stops at the first offending level, so it never recurses and costs
    at most one pass over the input (tests/orchestrator/model/test_convert.py times it)."""
    level: list[object] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:  # one pass per level, containers only
        depth += 1
        if depth > MAX_TOOL_INPUT_DEPTH:
            return _too_deep(name)
        below: list[object] = []
        for item in level:
            values = item.values() if isinstance(item, dict) else item
            assert isinstance(values, Iterable)
            below += [v for v in values if v.__class__ is dict or v.__class__ is list]
        level = below
    return None


def _too_deep(name: str) -> str:
    return (
        f"The input of this {name} call is nested deeper than {MAX_TOOL_INPUT_DEPTH} levels; "
        "send a flatter object"
    )


def _too_large(raw: str) -> bool:
    # Characters first (cheap); UTF-8 bytes only when it could matter.
    if len(raw) > MAX_TOOL_INPUT_BYTES:
        return True
    return len(raw) * 4 > MAX_TOOL_INPUT_BYTES and len(raw.encode("utf-8")) > MAX_TOOL_INPUT_BYTES


class StreamProtocolError(ValueError):
    """A stream event that is valid JSON but breaks the Messages API's event protocol.

    A delta or stop for a block that was never started (or already stopped), a block started
    twice, a field of the wrong type, a `message_delta` without usage, `message_stop` while a
    block is still open. The Anthropic client turns it into a retryable stream failure: the
    response cannot be trusted, and the next attempt usually comes back whole.
    """


_DELTA_VALUE: Mapping[str, tuple[str, str]] = {
    "text_delta": ("text", "text"),
    "input_json_delta": ("partial_json", "tool_use"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("signature", "thinking"),
}
"""Delta type -> (the string field it carries, the block type it belongs to)."""
_START_STRINGS: Mapping[str, tuple[str, ...]] = {
    "text": (),
    "tool_use": ("id", "name"),
    "thinking": (),
    "redacted_thinking": ("data",),
}
"""Block type -> string fields its `content_block_start` must carry."""


def _is_int(value: Any) -> bool:
    return type(value) is int


def _object(data: Mapping[str, Any], name: str, kind: str) -> Mapping[str, Any]:
    value = data.get(name)
    if not isinstance(value, Mapping):
        raise StreamProtocolError(f"{kind} has no {name!r} object (got {value!r:.80})")
    return value


def _index(data: Mapping[str, Any], kind: str) -> int:
    value = data.get("index")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise StreamProtocolError(f"{kind} has no valid block index (got {value!r:.80})")


def _check_usage(usage: Mapping[str, Any], kind: str) -> None:
    for name in Usage.model_fields:
        value = usage.get(name)
        if value is not None and (not _is_int(value) or value < 0):
            raise StreamProtocolError(f"{kind} has a usage count {name}={value!r:.80}")


@dataclass
class StreamAccumulator:
    """Folds one attempt's stream events (as decoded JSON) into Warren's model events.

    `feed` returns the events to pass on: a `TextDelta` per text delta, a `BlockComplete` at
    each `content_block_stop` (a tool may start then). `finish` builds the `AssistantMessage`
    once `message_stop` was seen. Thinking and redacted thinking are kept whole (signature,
    data): the API wants them echoed back exactly. Block types Warren does not model (server
    tools) are skipped; `BlockComplete.index` is always the API's index. Event types Warren
    does not know are ignored (the API may add some); a known event that breaks the protocol
    raises `StreamProtocolError` (tests/orchestrator/model/test_convert.py lists the cases).
    """

    model: str
    """The requested model, used when the stream does not name one."""
    _blocks: dict[int, _BlockBuilder] = field(default_factory=dict)
    _complete: dict[int, ContentBlock] = field(default_factory=dict)
    _stopped_blocks: set[int] = field(default_factory=set)
    _usage: dict[str, int] = field(default_factory=dict)
    _stop_reason: StopReason | None = None
    stopped: bool = False
    """`message_stop` arrived: the message is whole."""

    def feed(self, data: Mapping[str, Any]) -> list[TextDelta | BlockComplete]:
        """The events one stream event produces.

        **Errors:** `StreamProtocolError` for an event that breaks the protocol.
        """
        if not isinstance(data, Mapping):
            raise StreamProtocolError(f"an event is not a JSON object: {data!r:.80}")
        kind = data.get("type")
        if not isinstance(kind, str):
            raise StreamProtocolError(f"an event has no type: {dict(data)!r:.120}")
        if kind == "message_start":
            message = _object(data, "message", kind)
            model = message.get("model")
            if model is not None and not isinstance(model, str):
                raise StreamProtocolError(f"message_start names a model {model!r:.80}")
            self.model = model or self.model
            usage = message.get("usage")
            if usage is not None:
                if not isinstance(usage, Mapping):
                    raise StreamProtocolError(f"message_start has usage {usage!r:.80}")
                _check_usage(usage, kind)
                self._merge_usage(usage)
        elif kind == "content_block_start":
            self._start(_index(data, kind), _object(data, "content_block", kind))
        elif kind == "content_block_delta":
            return self._delta(_index(data, kind), _object(data, "delta", kind))
        elif kind == "content_block_stop":
            index = self._open_block(_index(data, kind), kind)
            builder = self._blocks.pop(index)
            self._stopped_blocks.add(index)
            built = builder.build()
            if built is not None:
                self._complete[index] = built
                return [BlockComplete(index=index, block=built)]
        elif kind == "message_delta":
            reason = _object(data, "delta", kind).get("stop_reason")
            if reason is not None and not isinstance(reason, str):
                raise StreamProtocolError(f"message_delta has a stop_reason {reason!r:.80}")
            usage = _object(data, "usage", kind)
            _check_usage(usage, kind)
            if not _is_int(usage.get("output_tokens")):
                raise StreamProtocolError("message_delta has no output_tokens in its usage")
            # A reason newer than Warren's closed set is dropped: the loop decides from the
            # message itself, never from the envelope alone.
            self._stop_reason = reason if reason in _STOP_REASONS else None  # type: ignore[assignment]
            self._merge_usage(usage)
        elif kind == "message_stop":
            if self._blocks:
                still = ", ".join(str(i) for i in sorted(self._blocks))
                raise StreamProtocolError(f"message_stop arrived while block {still} was open")
            self.stopped = True
        return []

    def _start(self, index: int, block: Mapping[str, Any]) -> None:
        if index in self._blocks or index in self._stopped_blocks:
            raise StreamProtocolError(f"content_block_start for block {index} came twice")
        block_type = block.get("type")
        if not isinstance(block_type, str):
            raise StreamProtocolError(f"content_block_start {index} has a type {block_type!r:.80}")
        for name in _START_STRINGS.get(block_type, ()):
            if not isinstance(block.get(name), str):
                raise StreamProtocolError(
                    f"content_block_start {index} ({block_type}) has no string {name!r}"
                )
        if block_type == "tool_use" and not isinstance(block.get("input", {}), Mapping):
            raise StreamProtocolError(f"content_block_start {index} has a non-object input")
        if block_type == "thinking" and not isinstance(block.get("signature", ""), str):
            raise StreamProtocolError(f"content_block_start {index} has a non-string signature")
        self._blocks[index] = _BlockBuilder(block_type, block)

    def _open_block(self, index: int, kind: str) -> int:
        if index in self._blocks:
            return index
        if index in self._stopped_blocks:
            raise StreamProtocolError(f"{kind} for block {index}, which was already stopped")
        raise StreamProtocolError(f"{kind} for block {index}, which was never started")

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[TextDelta | BlockComplete]:
        builder = self._blocks[self._open_block(index, "content_block_delta")]
        kind = delta.get("type")
        if not isinstance(kind, str):
            raise StreamProtocolError(f"content_block_delta {index} has a type {kind!r:.80}")
        if kind not in _DELTA_VALUE:
            return []  # a delta type Warren does not model (citations, ...)
        name, belongs_to = _DELTA_VALUE[kind]
        value = delta.get(name)
        if not isinstance(value, str):
            raise StreamProtocolError(f"{kind} for block {index} has {name}={value!r:.80}")
        if builder.kind in _START_STRINGS and builder.kind != belongs_to:
            raise StreamProtocolError(f"{kind} for block {index}, a {builder.kind} block")
        if kind == "text_delta":
            builder.text.append(value)
            return [TextDelta(index=index, text=value)] if value else []
        if kind == "input_json_delta":
            builder.partial_json.append(value)
        elif kind == "thinking_delta":
            builder.text.append(value)
        else:
            builder.signature = value
        return []

    def _merge_usage(self, usage: Mapping[str, Any]) -> None:
        # Counts on message_delta are cumulative totals: they replace, never add, and a count
        # the delta leaves out keeps its message_start value (as the SDK's own accumulator).
        for name in Usage.model_fields:
            value = usage.get(name)
            if isinstance(value, int):
                self._usage[name] = value

    @property
    def usage(self) -> Usage:
        return Usage(**self._usage)

    def finish(self, *, request_id: str | None = None) -> AssistantMessage:
        content = [self._complete[index] for index in sorted(self._complete)]
        usage = self.usage
        return AssistantMessage(
            message=Message(role="assistant", content=content),
            model=self.model,
            stop_reason=self._stop_reason,
            usage=usage,
            cost_usd=cost_usd(self.model, usage),
            request_id=request_id,
        )
