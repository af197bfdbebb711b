"""The part of the wire protocol (`workers.protocol`, which tells the whole of it) that a tool
host speaks: its messages, `encode`, the decoding of a line, and `LineReader`.

A tool host imports this module, not `workers.protocol`: the agent worker's messages there
carry the coordinator's events, messages and model types (`orchestrator.events`,
`orchestrator.model.base`), whose models and modules cost each host 0.7 MB PSS
(tests/workers/test_worker_imports.py pins that a host does without them). Every name here is
also `workers.protocol`'s, the same object.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import pydantic
import trio
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.messages import ToolResultContent

__all__ = [
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "Cancel",
    "HookResult",
    "HostInbound",
    "HostMessage",
    "HostRole",
    "LedgerDelta",
    "LineReader",
    "Malformed",
    "Oversized",
    "ProtocolError",
    "Ready",
    "RunHook",
    "RunTool",
    "ShellState",
    "Shutdown",
    "ToolOutcome",
    "ToolProgress",
    "ToolResult",
    "ValidateTool",
    "Validated",
    "WireModel",
    "decode_host_line",
    "decode_with",
    "encode",
    "oversized_id",
]

PROTOCOL_VERSION = 3
"""Sent in `Ready`; raised whenever an existing message changes incompatibly."""

MAX_LINE_BYTES = 16 * 1024 * 1024
"""Longest line either side accepts (16 MiB): a capped Read of an image fits with room to spare;
anything longer is a bug or an attack, and is skipped and reported rather than buffered."""

HostRole = Literal["read_write", "read_only"]
"""A tool host's workspace mount: writable (calls that may write, the persistent shell) or
read-only (calls classified read-only, so a misclassified command cannot write)."""

ToolOutcome = Literal["output", "tool_error", "no_output", "cancelled"]
"""How a call ended in the worker: a `ToolOutput`; a `ToolError` (its message for the model);
the tool yielded no output; the call was cancelled by `Cancel` before it produced one."""


class WireModel(BaseModel):
    """The base of every message: frozen, and no field it does not declare."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class LedgerDelta(WireModel):
    """Changes to a `ReadLedger`: paths (resolved, absolute) recorded with their mtime in
    nanoseconds, and paths forgotten. Applying `recorded` then `forgotten` is the whole rule."""

    recorded: dict[str, int] = Field(default_factory=dict)
    forgotten: list[str] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.recorded or self.forgotten)


class ShellState(WireModel):
    """Where the persistent shell is and what it exported: the read-write host reports it after
    a call that changed it, and the read-only host's one-shot shells start from it, so `cd src`
    in one call holds for a read-only `ls` in the next."""

    cwd: str
    snapshot: str
    """The bash script that recreates the exported variables and functions."""


class Ready(WireModel):
    """The worker's first line: it runs, speaks `version`, and what it is."""

    type: Literal["ready"] = "ready"
    version: int
    pid: int
    """The worker's pid as it sees itself (inside a pid namespace this is not the host pid)."""
    role: HostRole
    workspace: str
    tools: list[str]
    """Names of the tools this worker can run."""


class ValidateTool(WireModel):
    """Run `tool.validate(input, ctx)` in the worker (it reads the workspace)."""

    type: Literal["validate_tool"] = "validate_tool"
    id: str
    tool: str
    input: dict[str, Any]
    ledger: LedgerDelta = LedgerDelta()


class Validated(WireModel):
    """The answer to `ValidateTool`: `refusal` (a message for the model) or None to proceed;
    `error` when validate itself failed (unknown tool, bad input, an exception)."""

    type: Literal["validated"] = "validated"
    id: str
    refusal: str | None = None
    error: str | None = None
    ledger: LedgerDelta = LedgerDelta()


class RunTool(WireModel):
    """Run `tool.call(input, ctx)` in the worker; answered by progress and one `ToolResult`.

    With `check`, `tool.validate` runs first and is answered by a `Validated`, as a
    `ValidateTool` would be (one trip instead of two); a refusal or an error ends the call
    there: nothing runs and no `ToolResult` follows."""

    type: Literal["run_tool"] = "run_tool"
    id: str
    tool: str
    input: dict[str, Any]
    ledger: LedgerDelta = LedgerDelta()
    shell: ShellState | None = None
    """The persistent shell's state, when it changed since this host last got it."""
    check: bool = False
    """Validate first (above)."""


class ToolProgress(WireModel):
    """A progress note of a running call (for humans), or output it streams (`data`)."""

    type: Literal["tool_progress"] = "tool_progress"
    id: str
    text: str
    data: str = ""
    """A streaming call's output bytes, one character per byte (latin-1): JSON carries any
    byte sequence that way, and ASCII output as it is."""


class ToolResult(WireModel):
    """The one answer that ends a `RunTool`, whatever happened in the worker."""

    type: Literal["tool_result"] = "tool_result"
    id: str
    outcome: ToolOutcome
    content: str | ToolResultContent = ""
    """The output's content (`output`), or the `ToolError` message (`tool_error`)."""
    is_error: bool = False
    summary: str | None = None
    ledger: LedgerDelta = LedgerDelta()
    """What the call recorded or forgot in the read ledger."""
    shell: ShellState | None = None
    """The persistent shell's state, when the call changed it."""


class RunHook(WireModel):
    """Run a hook's command in the tool host, inside the sandbox the host sits in; answered by
    one `HookResult` (`orchestrator.hooks.process`). `Cancel` with its id kills it."""

    type: Literal["run_hook"] = "run_hook"
    id: str
    command: str
    stdin: str
    """The hook's JSON input."""
    env: dict[str, str]
    """Added to the host's (scrubbed) environment."""
    cwd: str
    timeout_s: float
    output_bytes: int
    """stdout plus stderr the hook may print before it is killed."""


class HookResult(WireModel):
    """The one answer that ends a `RunHook`."""

    type: Literal["hook_result"] = "hook_result"
    id: str
    exit_code: int | None
    """None when the hook never finished (timeout, flood, cancelled, could not start)."""
    stdout: str = ""
    stderr: str = ""
    problem: str | None = None
    """Why the run is an error whatever it printed."""


class Cancel(WireModel):
    """Cancel a running call (or agent run); the worker still answers it with one `ToolResult`
    (or `AgentResult`)."""

    type: Literal["cancel"] = "cancel"
    id: str


class Shutdown(WireModel):
    """Stop: cancel what runs, close session resources, exit 0. Closing stdin means the same."""

    type: Literal["shutdown"] = "shutdown"


class Malformed(WireModel):
    """The receiver could not use a line it was sent; `id` names the call if it could tell."""

    type: Literal["malformed"] = "malformed"
    detail: str
    id: str | None = None


@dataclass(frozen=True)
class ProtocolError:
    """A line that is not a valid message: a value to report, never raised.

    `call_id` is the line's `id` when the line was at least a JSON object with a string `id`,
    so the receiver can fail that one call instead of leaving it waiting.
    """

    detail: str
    call_id: str | None = None
    line_prefix: str = ""
    """The first 200 characters of the line, for the log."""


@dataclass(frozen=True)
class Oversized:
    """A line longer than the reader's cap; its bytes were skipped, `size` counts them."""

    size: int
    head: bytes = b""
    """The line's first bytes (up to 200), enough to find the call id with `oversized_id`."""


_ID_IN_HEAD = re.compile(rb'"id":"([^"\\]{1,200})"')


def oversized_id(line: Oversized) -> str | None:
    """The call id near the start of an oversized line (`encode` puts `type`, then `id`)."""
    found = _ID_IN_HEAD.search(line.head)
    return found.group(1).decode("utf-8", errors="replace") if found else None


def encode(message: BaseModel) -> bytes:
    """One message as one line (compact JSON; a newline cannot occur inside it)."""
    return message.model_dump_json().encode() + b"\n"


HostMessage = (
    Ready
    | ValidateTool
    | Validated
    | RunTool
    | ToolProgress
    | ToolResult
    | RunHook
    | HookResult
    | Cancel
    | Shutdown
    | Malformed
)
"""The messages of this module, undiscriminated (`workers.protocol.Message` adds the agent
worker's to them)."""

HostInbound = Annotated[HostMessage, Field(discriminator="type")]
"""The messages of this module: what a tool host decodes (`decode_host_line`)."""


_T = TypeVar("_T")


@functools.cache
def _host_adapter() -> pydantic.TypeAdapter[HostInbound]:
    """Built on first use, not at import (start-up time of every worker counts)."""
    return pydantic.TypeAdapter(HostInbound)


def decode_host_line(
    line: bytes | bytearray, *, max_bytes: int = MAX_LINE_BYTES
) -> HostInbound | ProtocolError:
    """`workers.protocol.decode_line` for a tool host: the messages of this module only, so a
    host never builds the agent worker's (a line of one is a `ProtocolError`, its tag unknown)."""
    return decode_with(_host_adapter(), line, max_bytes=max_bytes)


def decode_with(
    adapter: pydantic.TypeAdapter[_T], line: bytes | bytearray, *, max_bytes: int
) -> _T | ProtocolError:
    """Parse one line (with or without its trailing newline) into a message.

    Never raises on bad input: malformed JSON, an unknown `type`, missing or extra fields, and
    lines over `max_bytes` all come back as a `ProtocolError` saying what was wrong.
    """
    prefix = bytes(line[:200]).decode("utf-8", errors="replace")
    if len(line) > max_bytes:
        return ProtocolError(
            f"line of {len(line)} bytes exceeds the {max_bytes}-byte cap", None, prefix
        )
    try:
        return adapter.validate_json(line)
    except pydantic.ValidationError as exc:
        return ProtocolError(_describe(exc), _recover_id(line), prefix)
    except Exception as exc:  # validate_json rejects some inputs (bad UTF-8) with other errors
        return ProtocolError(f"undecodable line: {exc}", None, prefix)


def _describe(exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "(line)"
        problems.append(f"{where}: {err['msg']}")
    return "invalid message: " + "; ".join(problems)


def _recover_id(line: bytes | bytearray) -> str | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


class LineReader:
    """Splits a byte stream into lines, holding at most `max_bytes` of any one line.

    `next()` returns a line (without its newline), `Oversized` for a line that ran past the cap
    (its bytes are dropped as they arrive, so memory stays bounded), or None at end of stream.
    A last line without a newline is still returned.
    """

    def __init__(self, stream: trio.abc.ReceiveStream, *, max_bytes: int = MAX_LINE_BYTES) -> None:
        self._stream = stream
        self._max = max_bytes
        self._buffer = bytearray()
        self._scanned = 0
        """Bytes of `_buffer` already known to hold no newline."""
        self._skipped = 0
        """Bytes dropped so far of an oversized line still being skipped."""
        self._head = b""
        """The first bytes of the oversized line being skipped."""
        self._eof = False

    async def next(self) -> bytes | Oversized | None:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                if self._skipped or len(line) > self._max:
                    return self._oversized(line)
                return line
            if self._skipped or len(self._buffer) > self._max:
                self._skip(self._buffer)
                self._buffer.clear()
            self._scanned = len(self._buffer)
            if self._eof:
                if self._skipped:
                    return self._oversized(b"")
                if self._buffer:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    self._scanned = 0
                    return line
                return None
            data = await self._stream.receive_some(1 << 16)
            if data:
                self._buffer += data
            else:
                self._eof = True

    def _skip(self, data: bytes | bytearray) -> None:
        # The head fills up across chunks: how the stream was cut must not change it
        # (tests/workers/test_protocol.py, the hypothesis test of LineReader).
        if len(self._head) < 200:
            self._head += bytes(data[: 200 - len(self._head)])
        self._skipped += len(data)

    def _oversized(self, rest: bytes) -> Oversized:
        self._skip(rest)
        result = Oversized(self._skipped, self._head)
        self._skipped, self._head = 0, b""
        return result
