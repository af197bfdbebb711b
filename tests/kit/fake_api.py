"""A fake Anthropic Messages API on 127.0.0.1 that streams SSE the way the real one does.

The test suite drives the real SDK over a real socket against this server: in-process trio
tests and `warren` subprocesses (pointed here with `ANTHROPIC_BASE_URL`) alike. Each
`POST /v1/messages` takes the next scripted response, in order:

    with FakeMessagesAPI([HttpError(429), Reply.text("hi")]) as api:
        model = AnthropicModel("claude-sonnet-4-5", api_key="test", base_url=api.base_url)
        ...
        assert len(api.requests) == 2

Responses are typed values: `Reply` (a message streamed event by event), `HttpError` (a status
before the stream), `MidStreamError` (an SSE `error` event after some events), `DropConnection`
(the socket closes mid-body), `Stall` (the server goes quiet, for read timeouts),
`MalformedToolJson` (a `tool_use` whose `input_json_delta`s do not form JSON) and
`ScriptedEvents` (SSE events exactly as given, for streams that break the protocol). When the script
runs out the server answers 500 with a body that says so (and `x-should-retry: false`, so the
client gives up at once), and counts it in `api.unanswered`.

`Reply(hold_before_block=i)` / `Reply(hold_before_stop=True)` pause the stream until the test
calls `api.release()`: ordering is then proven without sleeping.

Concurrent clients (parallel subagents) arrive in no fixed order, so a script in arrival order
cannot say who gets what. `FakeMessagesAPI(route=fn)` answers each request with `fn(request)`
(a `RecordedRequest`: body, messages, system) when it returns a response, and falls back to the
script when it returns None.

Every request is recorded (`api.requests`): parsed body, headers, arrival and end times, and
the send time of every SSE event, all on `time.monotonic()` (system-wide on Linux, so times
from a subprocess client compare too), and the number of the TCP connection it came on (a
client that reuses its connection sends every request on connection 0). Delays are real
sleeps in the server thread, and each event is written to the socket as it is produced, so
timing seen by the client is honest.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import trio

from orchestrator.model.anthropic import AnthropicModel
from orchestrator.model.retry import RetryPolicy

__all__ = [
    "TEST_MODEL",
    "DropConnection",
    "FakeMessagesAPI",
    "FakeResponse",
    "HttpError",
    "MalformedToolJson",
    "MidStreamError",
    "RecordedRequest",
    "RecordingSleep",
    "Reply",
    "ScriptedEvents",
    "SentEvent",
    "Stall",
    "model_for",
]

_DEFAULT_USAGE: Mapping[str, int] = {"input_tokens": 100, "output_tokens": 20}

_ERROR_TYPE_BY_STATUS: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_DEFAULT_MESSAGE_BY_TYPE: Mapping[str, str] = {
    "invalid_request_error": "Invalid request",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "model: not found",
    "timeout_error": "Request timed out",
    "conflict_error": "Conflict",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit",
    "api_error": "Internal server error",
    "overloaded_error": "Overloaded",
}


# --- the scripted responses ------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One assistant message, streamed as the real API streams it.

    `content` holds API-shaped blocks as dicts: `{"type": "text", "text": ...}`,
    `{"type": "tool_use", "name": ..., "input": {...}, "id": optional}` (ids default to
    `toolu_fake_<n>`; `"partial_json": "..."` instead of `input` streams that text as the
    input, for a call cut by `stop_reason="max_tokens"`),
    `{"type": "thinking", "thinking": ..., "signature": ...}` and
    `{"type": "redacted_thinking", "data": ...}` (no deltas, as the API sends it).
    """

    content: Sequence[Mapping[str, Any]] = ()
    latency_s: float = 0.0
    """Wait before the response headers are sent (time to first byte), in seconds."""
    chunk_delay_s: float = 0.0
    """Wait before every SSE event after `message_start`, in seconds."""
    block_delay_s: float = 0.0
    """Extra wait before each `content_block_start` after the first, in seconds."""
    stop_reason: str | None = None
    """`None`: `tool_use` when the content has a `tool_use` block, else `end_turn`."""
    usage: Mapping[str, int] | None = None
    """Token counts; `None`: 100 input tokens, 20 output tokens, nothing cached."""
    text_chunk_chars: int = 12
    """Text is split into `text_delta`s of at most this many characters."""
    json_chunk_chars: int = 10
    """Tool input JSON is split into `input_json_delta`s of at most this many characters."""
    model: str | None = None
    """The model the response names; `None` echoes the request's model."""
    hold_before_block: int | None = None
    """Pause before `content_block_start` of this block until the test calls `api.release()`."""
    hold_before_stop: bool = False
    """Pause before `message_delta` (the end of the message) until `api.release()`."""

    @classmethod
    def text(cls, text: str, **options: Any) -> Reply:
        """A reply with one text block."""
        return cls(content=[{"type": "text", "text": text}], **options)

    @classmethod
    def tool_use(cls, name: str, input: Mapping[str, Any], **options: Any) -> Reply:
        """A reply with one `tool_use` block."""
        return cls(content=[{"type": "tool_use", "name": name, "input": dict(input)}], **options)

    @classmethod
    def from_turn(cls, turn: Mapping[str, Any] | Any, *, workspace: str | None = None) -> Reply:
        """A reply from a scripted-model turn, so one script drives both models.

        `turn` is the dict form (`latency_ms`, `content`, `block_latency_ms`, `stop_reason`,
        `usage`) or an object with `model_dump()` (orchestrator.model.scripted.ScriptedTurn).
        `{{workspace}}` in any string becomes `workspace` when given, as the scripted model does.
        """
        data: Any = turn.model_dump(exclude_none=True) if hasattr(turn, "model_dump") else turn
        if workspace is not None:
            data = _substitute(data, "{{workspace}}", workspace)
        usage = data.get("usage")
        return cls(
            content=[dict(block) for block in data.get("content", [])],
            latency_s=float(data.get("latency_ms", 0.0)) / 1000,
            block_delay_s=float(data.get("block_latency_ms", 0.0)) / 1000,
            stop_reason=data.get("stop_reason"),
            usage=None if usage is None else {k: int(v) for k, v in usage.items()},
        )


@dataclass(frozen=True)
class HttpError:
    """An error status before any stream: the API's JSON error body and `headers`."""

    status: int
    error_type: str | None = None
    """`None`: the API's type for `status` (429 -> `rate_limit_error`, ...)."""
    message: str | None = None
    """`None`: a message like the API's for the error type."""
    headers: Mapping[str, str] = field(default_factory=lambda: {"retry-after": "0"})
    latency_s: float = 0.0


def _default_partial_reply() -> Reply:
    return Reply.text("This partial output must be discarded by the client.", text_chunk_chars=8)


@dataclass(frozen=True)
class MidStreamError:
    """`reply` streams for `after_events` events, then an SSE `error` event ends the stream."""

    after_events: int = 3
    error_type: str = "overloaded_error"
    message: str | None = None
    reply: Reply = field(default_factory=_default_partial_reply)


@dataclass(frozen=True)
class DropConnection:
    """`reply` streams for `after_events` events, then the socket closes mid-body."""

    after_events: int = 3
    reply: Reply = field(default_factory=_default_partial_reply)


@dataclass(frozen=True)
class Stall:
    """`reply` streams for `after_events` events, then nothing for `seconds` (then the rest)."""

    after_events: int = 2
    seconds: float = 30.0
    reply: Reply = field(default_factory=_default_partial_reply)


@dataclass(frozen=True)
class MalformedToolJson:
    """A `tool_use` block whose `input_json_delta`s concatenate to `raw_json` (not JSON)."""

    name: str = "Read"
    raw_json: str = '{"file_path": "/tmp/x", '
    id: str | None = None
    text: str | None = None
    """A text block streamed before the tool call, when given."""
    chunk_delay_s: float = 0.0


@dataclass(frozen=True)
class ScriptedEvents:
    """A 200 SSE response made of exactly these `(event name, data)` pairs, in order; each
    data is any JSON value (written with `json.dumps`), so an event can break the protocol
    (a delta for a block never started, a field of the wrong type) while staying valid JSON."""

    events: Sequence[tuple[str, Any]]


FakeResponse = (
    Reply | HttpError | MidStreamError | DropConnection | Stall | MalformedToolJson | ScriptedEvents
)


# --- what the server saw -----------------------------------------------------------------------


@dataclass(frozen=True)
class SentEvent:
    """One SSE event as written to the socket."""

    at: float
    """`time.monotonic()` just before the write (an event not yet listed was not sent)."""
    name: str
    index: int | None = None
    """The content block index, for `content_block_*` events."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it (a snapshot; `api.requests` takes a fresh one)."""

    number: int
    """0 for the first request the server received."""
    method: str
    path: str
    headers: Mapping[str, str]
    """Header names in lower case."""
    body: Mapping[str, Any]
    """The parsed JSON body (empty when the body was not a JSON object)."""
    started_at: float
    """`time.monotonic()` when the request line arrived."""
    ended_at: float | None
    """`time.monotonic()` when the server finished answering; `None` while in flight."""
    response: str
    """What answered: `Reply`, `HttpError(429)`, `MidStreamError`, ..., or `unanswered`."""
    events: tuple[SentEvent, ...]
    client_disconnected: bool
    """The client went away before the server finished writing."""
    connection: int = 0
    """The TCP connection it came on: 0 for the first the server accepted, 1 for the next..."""
    raw: bytes = b""
    """The body's bytes as they came (a fork's first request starts with its parent's)."""

    @property
    def system(self) -> Any:
        return self.body.get("system")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def tools(self) -> list[dict[str, Any]]:
        return list(self.body.get("tools", []))

    def event_time(self, name: str, index: int | None = None) -> float:
        """Send time of the first event called `name` (for block `index`, when given)."""
        for event in self.events:
            if event.name == name and (index is None or event.index == index):
                return event.at
        raise LookupError(f"request {self.number} sent no {name} event for index {index}")


@dataclass
class _Record:
    number: int
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    started_at: float
    ended_at: float | None = None
    response: str = ""
    events: list[SentEvent] = field(default_factory=list)
    client_disconnected: bool = False
    connection: int = 0
    raw: bytes = b""

    def snapshot(self) -> RecordedRequest:
        return RecordedRequest(
            number=self.number,
            method=self.method,
            path=self.path,
            headers=dict(self.headers),
            body=self.body,
            started_at=self.started_at,
            ended_at=self.ended_at,
            response=self.response,
            events=tuple(self.events),
            client_disconnected=self.client_disconnected,
            connection=self.connection,
            raw=self.raw,
        )


# --- turning a reply into SSE events ------------------------------------------------------------


@dataclass(frozen=True)
class _Event:
    name: str
    data: Mapping[str, Any]
    delay_s: float = 0.0
    hold: bool = False
    """Wait for `api.release()` before sending."""

    @property
    def index(self) -> int | None:
        value = self.data.get("index") if isinstance(self.data, Mapping) else None
        return value if isinstance(value, int) else None

    def encode(self) -> bytes:
        return f"event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def _substitute(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_substitute(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, old, new) for k, v in value.items()}
    return value


def _plan_reply(
    reply: Reply,
    *,
    model: str,
    message_id: str,
    tool_ids: Iterator[str],
    raw_json_by_index: Mapping[int, str] | None = None,
) -> list[_Event]:
    """The SSE events of `reply`, in the order and shape of the real API."""
    usage = {**_DEFAULT_USAGE, **(reply.usage or {})}
    has_tool_use = any(block.get("type") == "tool_use" for block in reply.content)
    stop_reason = reply.stop_reason or ("tool_use" if has_tool_use else "end_turn")
    delay = reply.chunk_delay_s
    events = [
        _Event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": reply.model or model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": usage.get("input_tokens", 0),
                        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
                        "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
                        "output_tokens": 1,
                    },
                },
            },
        )
    ]
    for index, block in enumerate(reply.content):
        start_delay = delay + (reply.block_delay_s if index > 0 else 0.0)
        kind = block.get("type")
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": piece}
                for piece in _chunks(str(block.get("text", "")), reply.text_chunk_chars)
            ]
        elif kind == "tool_use":
            tool_id = str(block.get("id") or next(tool_ids))
            start = {"type": "tool_use", "id": tool_id, "name": block["name"], "input": {}}
            if raw_json_by_index is not None and index in raw_json_by_index:
                raw = raw_json_by_index[index]
            elif "partial_json" in block:
                raw = str(block["partial_json"])
            else:
                raw = json.dumps(block.get("input", {}))
            # The real API opens every tool input with an empty partial.
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in _chunks(raw, reply.json_chunk_chars)
            ]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": piece}
                for piece in _chunks(str(block.get("thinking", "")), reply.text_chunk_chars)
            ]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        elif kind == "redacted_thinking":
            start = {"type": "redacted_thinking", "data": str(block.get("data", ""))}
            deltas = []
        else:
            raise ValueError(f"Reply block type {kind!r} is not supported by the fake API")
        events.append(
            _Event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
                start_delay,
                hold=reply.hold_before_block == index,
            )
        )
        if index == 0:
            events.append(_Event("ping", {"type": "ping"}, delay))
        events.extend(
            _Event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
                delay,
            )
            for delta in deltas
        )
        events.append(
            _Event("content_block_stop", {"type": "content_block_stop", "index": index}, delay)
        )
    events.append(
        _Event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
            delay,
            hold=reply.hold_before_stop,
        )
    )
    events.append(_Event("message_stop", {"type": "message_stop"}, delay))
    return events


def _error_body(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


# --- the server -------------------------------------------------------------------------------


class _ClientGone(Exception):
    """The client closed its end while the server was writing."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    api: FakeMessagesAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (the point of several tests) are not errors worth a traceback."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _record: _Record | None = None
    _connection = 0

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `api.requests`, not the server's stderr."""

    def setup(self) -> None:
        super().setup()
        # One small write per event: without this, Nagle's algorithm can hold an event back
        # until the client acknowledges the previous one, which skews timing measurements.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connection = self.server.api._track(self.connection, threading.current_thread())

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._untrack(self.connection)

    def do_GET(self) -> None:
        self._send_json(404, _error_body("not_found_error", f"Not found: {self.path}", "req_0"))

    def do_POST(self) -> None:
        api = self.server.api
        started = time.monotonic()
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {}
        if self.path.split("?")[0] == "/v1/messages/count_tokens":
            self._count_tokens(api, parsed if isinstance(parsed, dict) else {})
            return
        record = api._begin(
            method="POST",
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=parsed if isinstance(parsed, dict) else {},
            started_at=started,
            connection=self._connection,
            raw=raw,
        )
        self._record = record
        try:
            self._answer(api, record)
        except _ClientGone:
            record.client_disconnected = True
            self.close_connection = True
        finally:
            self._record = None
            api._end(record)

    def _count_tokens(self, api: FakeMessagesAPI, body: dict[str, Any]) -> None:
        """`count_tokens`: compact JSON of system, messages and tools / 4 (the peer server's
        estimate, which `long_session` also enforces). Counted in `api.token_counts`, not
        recorded as a request."""
        part = {k: body.get(k) for k in ("system", "messages", "tools")}
        tokens = max(1, len(json.dumps(part, separators=(",", ":"))) // 4)
        with api._lock:
            api.token_counts.append(tokens)
        data = json.dumps({"input_tokens": tokens}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # -- answering ------------------------------------------------------------------------------

    def _answer(self, api: FakeMessagesAPI, record: _Record) -> None:
        request_id = f"req_fake_{record.number:04d}"
        if self.path.split("?")[0] != "/v1/messages":
            record.response = "not_found"
            self._send_json(
                404, _error_body("not_found_error", f"Not found: {self.path}", request_id)
            )
            return
        response = api._next_response(record)
        model = str(record.body.get("model", "claude-fake"))
        message_id = f"msg_fake_{record.number:04d}"
        match response:
            case None:
                record.response = "unanswered"
                message = (
                    f"FakeMessagesAPI has no scripted response left for request #{record.number} "
                    f"(the script had {api._scripted} responses)"
                )
                # x-should-retry: false (a real API header) makes clients fail at once, quoting
                # this message, instead of backing off ten times.
                self._send_json(
                    500,
                    _error_body("api_error", message, request_id),
                    request_id,
                    {"x-should-retry": "false"},
                )
            case HttpError():
                record.response = f"HttpError({response.status})"
                api._wait(response.latency_s)
                error_type = response.error_type or _ERROR_TYPE_BY_STATUS.get(
                    response.status, "api_error"
                )
                message = response.message or _DEFAULT_MESSAGE_BY_TYPE.get(error_type, error_type)
                self._send_json(
                    response.status,
                    _error_body(error_type, message, request_id),
                    request_id,
                    response.headers,
                )
            case Reply():
                record.response = "Reply"
                events = _plan_reply(
                    response, model=model, message_id=message_id, tool_ids=api._tool_ids
                )
                if record.body.get("stream") is not True:
                    api._wait(response.latency_s)
                    self._send_json(200, _whole_message(events), request_id)
                    return
                self._stream(api, record, events, request_id, latency_s=response.latency_s)
            case MalformedToolJson():
                record.response = "MalformedToolJson"
                content: list[Mapping[str, Any]] = []
                if response.text is not None:
                    content.append({"type": "text", "text": response.text})
                tool: dict[str, Any] = {"type": "tool_use", "name": response.name, "input": {}}
                if response.id is not None:
                    tool["id"] = response.id
                content.append(tool)
                reply = Reply(content=content, chunk_delay_s=response.chunk_delay_s)
                events = _plan_reply(
                    reply,
                    model=model,
                    message_id=message_id,
                    tool_ids=api._tool_ids,
                    raw_json_by_index={len(content) - 1: response.raw_json},
                )
                self._stream(api, record, events, request_id, latency_s=0.0)
            case ScriptedEvents():
                record.response = "ScriptedEvents"
                scripted = [_Event(name, data) for name, data in response.events]
                self._stream(api, record, scripted, request_id, latency_s=0.0)
            case MidStreamError():
                record.response = "MidStreamError"
                events = _plan_reply(
                    response.reply, model=model, message_id=message_id, tool_ids=api._tool_ids
                )[: response.after_events]
                message = response.message or _DEFAULT_MESSAGE_BY_TYPE.get(
                    response.error_type, response.error_type
                )
                events.append(
                    _Event("error", _error_body(response.error_type, message, request_id))
                )
                self._stream(api, record, events, request_id, latency_s=response.reply.latency_s)
            case DropConnection():
                record.response = "DropConnection"
                events = _plan_reply(
                    response.reply, model=model, message_id=message_id, tool_ids=api._tool_ids
                )[: response.after_events]
                self._stream(
                    api, record, events, request_id, latency_s=response.reply.latency_s, end=False
                )
                self._drop()
            case Stall():
                record.response = "Stall"
                events = _plan_reply(
                    response.reply, model=model, message_id=message_id, tool_ids=api._tool_ids
                )
                head, tail = events[: response.after_events], events[response.after_events :]
                if tail:
                    tail[0] = _Event(tail[0].name, tail[0].data, tail[0].delay_s + response.seconds)
                self._stream(
                    api, record, head + tail, request_id, latency_s=response.reply.latency_s
                )

    def _send_json(
        self,
        status: int,
        body: Mapping[str, Any],
        request_id: str = "req_fake",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        payload = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("request-id", request_id)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self._ending()
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError as exc:
            raise _ClientGone from exc

    def _stream(
        self,
        api: FakeMessagesAPI,
        record: _Record,
        events: Sequence[_Event],
        request_id: str,
        *,
        latency_s: float,
        end: bool = True,
    ) -> None:
        """Write `events` as a chunked SSE body, each flushed as soon as it is due."""
        api._wait(latency_s)
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("request-id", request_id)
            self.end_headers()
            self.wfile.flush()
            for event in events:
                if event.hold and not api._hold():
                    raise _ClientGone("the fake API is shutting down")
                if event.delay_s > 0 and api._wait(event.delay_s):
                    raise _ClientGone("the fake API is shutting down")
                payload = event.encode()
                # Recorded before the write, so a client that has seen an event always finds
                # it in the log (tests read the log from the client side).
                record.events.append(SentEvent(time.monotonic(), event.name, event.index))
                self.wfile.write(b"%X\r\n%s\r\n" % (len(payload), payload))
                self.wfile.flush()
            if end:
                self._ending()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError as exc:
            raise _ClientGone from exc

    def _ending(self) -> None:
        """Stamp the end just before the last write: a client that saw the end of a response
        and sent the next request must never find the two overlapping in the log."""
        if self._record is not None and self._record.ended_at is None:
            self._record.ended_at = time.monotonic()

    def _drop(self) -> None:
        """Close the socket without finishing the chunked body: the client sees a broken read."""
        self.close_connection = True
        self._ending()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _whole_message(events: Sequence[_Event]) -> dict[str, Any]:
    """The non-streaming form of a reply, rebuilt from its events."""
    message: dict[str, Any] = dict(events[0].data["message"])
    content: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in events[1:]:
        data = event.data
        if event.name == "content_block_start":
            content.append(dict(data["content_block"]))
        elif event.name == "content_block_delta":
            delta, block = data["delta"], content[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
        elif event.name == "message_delta":
            message["stop_reason"] = data["delta"]["stop_reason"]
            message["usage"] = {**message["usage"], **data["usage"]}
    for index, raw in partial.items():
        try:
            content[index]["input"] = json.loads(raw) if raw else {}
        except ValueError:  # a call cut by max_tokens: the API sends what it has
            content[index]["input"] = {}
    message["content"] = content
    return message


class FakeMessagesAPI:
    """A Messages API server in a background thread; use it as a context manager.

    Thread-safe: the server thread answers while the test (or a subprocess) sends requests.
    Leaving the `with` block wakes every stalled response, closes every connection and joins the
    server's threads, so nothing writes after the test ends.
    """

    def __init__(
        self,
        responses: Iterable[FakeResponse] = (),
        *,
        host: str = "127.0.0.1",
        route: Callable[[RecordedRequest], FakeResponse | None] | None = None,
        keep_bodies: bool = True,
        on_answered: Callable[[RecordedRequest], None] | None = None,
    ) -> None:
        """`route`: chooses the response to a request from its content (None: the script's
        next); called in the server's threads, so it must be thread-safe.

        `keep_bodies=False`: a request's body is dropped once it is answered (`route` still
        sees it; `api.requests` then show `{}`). For long sessions: a 1,000-turn session's
        bodies parsed and kept are over 1 GB in the test process, whose full garbage
        collections (seconds each, a minute in all) compete with the client being measured
        (tests/bench/bench_long_session.py).

        `on_answered`: called with each request once its answer is written (in the server's
        threads, as `route`): a benchmark samples the client's CPU time there
        (tests/bench/bench_repl.py)."""
        self._host = host
        self._route = route
        self._on_answered = on_answered
        self._keep_bodies = keep_bodies
        self._lock = threading.Condition()
        self._holds = threading.Semaphore(0)
        self._responses: deque[FakeResponse] = deque(responses)
        self._scripted = len(self._responses)
        self._records: list[_Record] = []
        self._unanswered = 0
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._accepted = 0
        self._tool_counter = itertools.count(1)
        self.token_counts: list[int] = []
        """What each `POST /v1/messages/count_tokens` answered, in order."""
        self._server: _Server | None = None
        self._serve_thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> FakeMessagesAPI:
        server = _Server((self._host, 0), _Handler)
        server.api = self
        self._server = server
        self._serve_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fake-messages-api",
        )
        self._serve_thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
            threads = list(self._threads)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:
            thread.join(timeout=5)
        if self._serve_thread is not None:
            self._serve_thread.join(timeout=5)

    # -- public view ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>`: give it to the SDK or to `ANTHROPIC_BASE_URL`."""
        if self._server is None:
            raise RuntimeError("FakeMessagesAPI is not running: use it in a `with` block")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far, in arrival order."""
        with self._lock:
            return [record.snapshot() for record in self._records]

    @property
    def remaining(self) -> int:
        """Scripted responses not yet served."""
        with self._lock:
            return len(self._responses)

    @property
    def unanswered(self) -> int:
        """Requests that arrived after the script ran out (each got a 500)."""
        with self._lock:
            return self._unanswered

    def add(self, *responses: FakeResponse) -> None:
        """Append responses to the script."""
        with self._lock:
            self._responses.extend(responses)
            self._scripted += len(responses)

    def release(self, count: int = 1) -> None:
        """Let `count` held responses (`hold_before_block`, `hold_before_stop`) go on."""
        self._holds.release(count)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until no request is being answered; False if `timeout_s` passed first.

        From trio: `await trio.to_thread.run_sync(api.wait_idle)`.
        """
        with self._lock:
            return self._lock.wait_for(
                lambda: all(record.ended_at is not None for record in self._records), timeout_s
            )

    def max_in_flight(self) -> int:
        """The largest number of requests that were being answered at the same moment."""
        spans = [(r.started_at, r.ended_at or float("inf")) for r in self.requests]
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        best = current = 0
        for _, step in edges:
            current += step
            best = max(best, current)
        return best

    # -- used by the handler --------------------------------------------------------------------

    def _begin(self, **fields: Any) -> _Record:
        with self._lock:
            record = _Record(number=len(self._records), **fields)
            self._records.append(record)
            return record

    def _end(self, record: _Record) -> None:
        with self._lock:
            if record.ended_at is None:
                record.ended_at = time.monotonic()
            if not self._keep_bodies:
                record.body = {}
                record.raw = b""
            self._lock.notify_all()
        if self._on_answered is not None:
            self._on_answered(record.snapshot())

    def _hold(self) -> bool:
        """Wait for `release()`; False when woken because the server is closing."""
        while not self._holds.acquire(timeout=0.05):
            if self._closing.is_set():
                return False
        return True

    def _next_response(self, record: _Record) -> FakeResponse | None:
        if self._route is not None:
            routed = self._route(record.snapshot())
            if routed is not None:
                return routed
        with self._lock:
            if self._responses:
                return self._responses.popleft()
            self._unanswered += 1
            return None

    @property
    def _tool_ids(self) -> Iterator[str]:
        return (f"toolu_fake_{next(self._tool_counter):04d}" for _ in itertools.count())

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds` in the server thread; True when woken early because we are closing."""
        if seconds <= 0:
            return self._closing.is_set()
        return self._closing.wait(seconds)

    def _track(self, conn: socket.socket, thread: threading.Thread) -> int:
        """Note a new connection and its thread; returns the connection's number."""
        with self._lock:
            self._connections.add(conn)
            self._threads.add(thread)
            self._accepted += 1
            return self._accepted - 1

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)


# --- the client side ---------------------------------------------------------------------------

TEST_MODEL = "claude-sonnet-4-6"
"""A current model id: the SDK warns (an error under pytest) about deprecated ones."""


class RecordingSleep:
    """A stand-in for `trio.sleep` between retries: records each delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await trio.lowlevel.checkpoint()


def model_for(
    api: FakeMessagesAPI,
    *,
    model: str = TEST_MODEL,
    sleep: RecordingSleep | None = None,
    retry: RetryPolicy | None = None,
    read_timeout_s: float = 5.0,
) -> AnthropicModel:
    """An `AnthropicModel` talking to `api`, with a test key and no real backoff waits."""
    return AnthropicModel(
        model,
        api_key="sk-ant-test",
        base_url=api.base_url,
        retry=retry,
        read_timeout_s=read_timeout_s,
        sleep=sleep or RecordingSleep(),
    )
