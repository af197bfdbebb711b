"""Claude Code's SDK control protocol, so an application built on the official Claude Agent SDK
can drive Warren by pointing `cli_path` at it (issue 16, item 7).

The SDK starts its CLI with `--input-format stream-json --output-format stream-json
--permission-prompt-tool stdio` and then speaks JSON lines both ways: on stdin it sends user
messages (`{"type": "user", "message": {...}}`), `control_request`s (`initialize`,
`interrupt`, `set_permission_mode`, ...) and `control_response`s to Warren's own requests; on
stdout it reads the stream-json messages, Warren's `control_response`s, and Warren's
`control_request`s: `can_use_tool` when the policy asks about a call.

`SdkControl` is both ends: `serve` reads stdin and answers the host's requests, `prompts`
yields the user messages as they come, and `asker` is the session's `Asker`, which puts each
ask to the host instead of a terminal. The host decides only what the policy left open: a
deny rule or the floor has already decided before an ask is made, and an input the host
rewrites (`updatedInput`) is decided by the policy again (orchestrator/pipeline.py), so a host's
allow never widens past them. Its deny message is the tool result the model reads.

Requests Warren cannot honour are answered with an error that names them (the SDK raises it to
the application), never accepted and ignored: SDK hook callbacks, SDK-hosted MCP servers,
agents defined in `initialize`, `set_model`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO, Any

import trio

from orchestrator.permissions import Allow, Ask, Asker, Deny
from orchestrator.tools.base import CURRENT_TOOL_USE_ID, Tool, ToolInput
from policies.files import CLAUDE_CODE_MODE_NAMES, MODES, Mode

__all__ = ["ProtocolError", "SdkControl", "prompt_text"]

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A line from the host longer than this ends the session (the SDK's own cap is 1 MiB out)."""

_WARREN_MODE = {cc: warren for warren, cc in CLAUDE_CODE_MODE_NAMES.items()}


class ProtocolError(Exception):
    """The host sent something that is not the protocol (a malformed line, a bad message)."""


def prompt_text(message: dict[str, Any]) -> str:
    """The text of a user message from the host: a string, or its text blocks joined.

    **Errors:** `ProtocolError` for a message without text (images are not taken yet).
    """
    content = message.get("message", {}).get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text", "") for b in content if isinstance(b, dict)]
        kinds = {b.get("type") for b in content if isinstance(b, dict)}
        if kinds <= {"text"} and texts:
            return "\n\n".join(texts)
    raise ProtocolError(
        "a user message must carry text (a string, or text blocks); Warren takes no other "
        "content from the SDK yet"
    )


@dataclass
class SdkControl:
    """Both ends of the control protocol over one stdin and one stdout.

    `on_interrupt` stops the current run; `set_mode` switches the session's permission mode
    (Warren's spelling; it raises `ValueError` with a reason to refuse, as `bypass` without a
    proven floor). Both are set once the session exists; until then those requests are
    answered with an error.
    """

    out: IO[str]
    on_interrupt: Callable[[], None] | None = None
    set_mode: Callable[[Mode], None] | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _waiting: dict[str, tuple[trio.Event, list[dict[str, Any]]]] = field(default_factory=dict)
    _prompts: tuple[trio.MemorySendChannel[str], trio.MemoryReceiveChannel[str]] = field(
        default_factory=lambda: trio.open_memory_channel[str](math.inf)
    )
    _closed: bool = False

    # -- stdin ---------------------------------------------------------------------------------

    async def serve(self, stdin: trio.abc.ReceiveStream) -> None:
        """Read the host's lines until stdin closes: user messages become prompts, requests
        are answered, responses wake the ask that waits for them. At the end every waiting
        ask is answered with a denial (the host is gone) and `prompts` ends.

        **Errors:** `ProtocolError` for a line that is not a JSON object or is too long.
        """
        send, _ = self._prompts
        try:
            async with send:
                async for line in _lines(stdin):
                    try:
                        message = json.loads(line)
                    except ValueError as exc:
                        raise ProtocolError(f"a line on stdin is not JSON: {exc}") from exc
                    if not isinstance(message, dict):
                        raise ProtocolError("a line on stdin is not a JSON object")
                    match message.get("type"):
                        case "user":
                            send.send_nowait(prompt_text(message))
                        case "control_request":
                            self._answer(message)
                        case "control_response":
                            self._resolve(message.get("response") or {})
                        case "control_cancel_request" | "keep_alive":
                            pass
                        case other:
                            raise ProtocolError(f"unknown message type on stdin: {other!r}")
        finally:
            self._closed = True
            for event, slot in self._waiting.values():
                slot.append({"subtype": "error", "error": "the SDK host closed stdin"})
                event.set()

    async def prompts(self) -> AsyncIterator[str]:
        """The user messages, in order, until stdin closes."""
        _, receive = self._prompts
        async with receive:
            async for prompt in receive:
                yield prompt

    def _write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()

    def _answer(self, message: dict[str, Any]) -> None:
        request_id = message.get("request_id")
        request = message.get("request") or {}
        try:
            response = self._handle(request)
        except (ValueError, ProtocolError) as exc:
            self._write(
                {
                    "type": "control_response",
                    "response": {"subtype": "error", "request_id": request_id, "error": str(exc)},
                }
            )
            return
        self._write(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": request_id, "response": response},
            }
        )

    def _handle(self, request: dict[str, Any]) -> dict[str, Any]:
        match request.get("subtype"):
            case "initialize":
                refused = [
                    what
                    for key, what in (
                        ("hooks", "SDK hook callbacks"),
                        ("agents", "agents defined by the SDK"),
                    )
                    if request.get(key)
                ]
                if refused:
                    raise ValueError(
                        f"Warren does not run {' or '.join(refused)} yet; define hooks and "
                        "agent types in Warren's policy and .warren/agents instead"
                    )
                return {
                    "commands": [],
                    "output_style": "default",
                    "available_output_styles": ["default"],
                    "models": [],
                    "account": {},
                }
            case "interrupt":
                if self.on_interrupt is None:
                    raise ValueError("no session is running yet")
                self.on_interrupt()
                return {}
            case "set_permission_mode":
                wanted = str(request.get("mode"))
                mode = _WARREN_MODE.get(wanted, wanted)
                if mode not in MODES:
                    names = ", ".join(CLAUDE_CODE_MODE_NAMES.values())
                    raise ValueError(f"no permission mode {wanted!r}; the modes are {names}")
                if self.set_mode is None:
                    raise ValueError("no session is running yet")
                self.set_mode(mode)
                return {}
            case "mcp_status":
                return {"mcpServers": []}
            case other:
                raise ValueError(f"Warren does not support the control request {other!r}")

    def _resolve(self, response: dict[str, Any]) -> None:
        waiting = self._waiting.pop(str(response.get("request_id")), None)
        if waiting is not None:
            event, slot = waiting
            slot.append(response)
            event.set()

    # -- Warren's requests -----------------------------------------------------------------

    async def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a control request to the host and wait for its answer.

        **Errors:** `ProtocolError` with the host's error, or when stdin has closed.
        **Cancellation:** the host is told (`control_cancel_request`) and the answer, if it
        comes, is dropped.
        """
        if self._closed:
            raise ProtocolError("the SDK host closed stdin")
        request_id = f"warren_{next(self._ids)}"
        event, slot = trio.Event(), list[dict[str, Any]]()
        self._waiting[request_id] = (event, slot)
        self._write({"type": "control_request", "request_id": request_id, "request": request})
        try:
            await event.wait()
        except trio.Cancelled:
            self._waiting.pop(request_id, None)
            self._write({"type": "control_cancel_request", "request_id": request_id})
            raise
        [response] = slot
        if response.get("subtype") == "error":
            raise ProtocolError(str(response.get("error", "the host answered with an error")))
        answer = response.get("response")
        return answer if isinstance(answer, dict) else {}

    def asker(self) -> Asker:
        """The session's `Asker`: each ask is the host's `can_use_tool` callback."""

        async def ask(tool: Tool[Any], input: ToolInput, why: Ask) -> Allow | Deny:
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            request: dict[str, Any] = {
                "subtype": "can_use_tool",
                "tool_name": tool.name,
                "input": raw,
                "permission_suggestions": None,
                "blocked_path": None,
                "decision_reason": why.reason,
            }
            if (tool_use_id := CURRENT_TOOL_USE_ID.get()) is not None:
                request["tool_use_id"] = tool_use_id
            try:
                answer = await self.request(request)
            except ProtocolError as exc:
                return Deny(
                    f"Permission to use {tool.name} was not granted: the application could "
                    f"not be asked ({exc}).",
                    rule="SDK host (can_use_tool)",
                )
            match answer.get("behavior"):
                case "allow":
                    updated = answer.get("updatedInput")
                    return Allow(
                        updated_input=updated if isinstance(updated, dict) else None,
                        rule="SDK host (can_use_tool)",
                    )
                case _:
                    if answer.get("interrupt") and self.on_interrupt is not None:
                        self.on_interrupt()
                    message = str(answer.get("message") or "")
                    return Deny(
                        message or f"The application denied this {tool.name} call.",
                        rule="SDK host (can_use_tool)",
                    )

        return ask


async def _lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[str]:
    """The stream's lines (without their newline), the last one even if unterminated."""
    buffer = bytearray()
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end]).decode("utf-8", errors="replace").strip()
            del buffer[: end + 1]
            if line:
                yield line
        if len(buffer) > MAX_LINE_BYTES:
            raise ProtocolError(f"a line on stdin is longer than {MAX_LINE_BYTES} bytes")
    tail = bytes(buffer).decode("utf-8", errors="replace").strip()
    if tail:
        yield tail
