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
rewrites (`updatedInput`) is decided by the policy again (orchestrator/calls/pipeline.py), so a
host's allow never widens past them. Its deny message is the tool result the model reads.

The host's `initialize` may carry hook callbacks and agent types. They come from the
application that runs the session, so they are trusted like the user's own files, and bound
like them: each hook callback joins the session's hooks (orchestrator/hooks/runner.py: the
event goes to the host as a `hook_callback` request, its answer read as a command hook's JSON,
so its allow answers only an ask and never a deny rule or the floor); each agent type joins
the session's (`orchestrator.agents.types.sdk_agent_types`). A session serving a host waits for
its first line before it opens (orchestrator/cli/stream_input.py), so both are in place before
`system/init`. The host's own MCP servers (`"type": "sdk"` in the `--mcp-config` it passes)
are reached through `mcp_message`: one control request per JSON-RPC message
(orchestrator/mcp/transport.py, `host_streams`), so their tools go through the same pipeline
as any MCP tool's. `set_model` switches the model from the next request
(orchestrator/model/switch.py).

Requests Warren cannot honour are answered with an error that names them (the SDK raises it to
the application), never accepted and ignored: a hook event Warren does not fire, an agent
field it has no meaning for, `rewind_files`, ...
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import pydantic
import trio

from orchestrator.agents.types import sdk_agent_types
from orchestrator.calls.permissions import Allow, Ask, Asker, Deny
from orchestrator.errors import ConfigError
from orchestrator.hooks.matchers import build_matcher
from orchestrator.hooks.runner import ConfiguredHook, HookCallback
from orchestrator.tools.base import CURRENT_TOOL_USE_ID, Tool, ToolInput
from policies.claude_names import CLAUDE_MODE_NAMES, warren_mode
from policies.files import MODES, Mode
from policies.hooks import HOOK_EVENTS, MATCHER_EVENTS, Hook

if TYPE_CHECKING:
    from orchestrator.mcp.servers import McpServers

__all__ = [
    "SDK_HOOKS",
    "HostParts",
    "ProtocolError",
    "SdkControl",
    "mcp_status_entries",
    "prompt_text",
]

SDK_HOOKS = "SDK host (initialize hooks)"
"""The source a host's hook callbacks are listed under (audit log, hook events)."""
DEFAULT_HOOK_TIMEOUT_S = 60.0
"""A host's hook callback without its own `timeout` (Claude Code's default, seconds)."""

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A line from the host longer than this ends the session (the SDK's own cap is 1 MiB out)."""


class ProtocolError(Exception):
    """The host sent something that is not the protocol (a malformed line, a bad message)."""


@dataclass(frozen=True)
class HostParts:
    """What a host's `initialize` adds to the session it drives (`SessionParts.host`)."""

    hooks: tuple[ConfiguredHook, ...] = ()
    """Its hook callbacks, in the order it listed them, after the policy's hooks."""
    agents: dict[str, Any] = field(default_factory=dict)
    """Its agent definitions by name, as sent (parsed again against the session's tools)."""


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


_CONNECTION = {"ready": "connected", "starting": "pending", "failed": "failed"}
"""Warren's server states as Claude Code's `mcp_status` spells them (`stopped`, out of
restarts, is `failed`)."""


def mcp_status_entries(
    servers: McpServers | None, configured: Collection[str]
) -> list[dict[str, Any]]:
    """Each configured MCP server as Claude Code's `mcp_status` answers (`name`, `status`,
    `error`, `tools`). `servers` is None until they start (after the first response): then
    each of the `configured` names is `pending`; asking does not start them."""
    if servers is None:
        return [{"name": name, "status": "pending"} for name in sorted(configured)]
    listed = servers.tools()
    entries: list[dict[str, Any]] = []
    for name in servers.names():
        status, error, _ = servers.status(name)
        entry: dict[str, Any] = {"name": name, "status": _CONNECTION.get(status, "failed")}
        if error:
            entry["error"] = error
        entry["tools"] = [
            {"name": tool.name, **({"description": tool.description} if tool.description else {})}
            for server, tool in listed
            if server == name
        ]
        entries.append(entry)
    return entries


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
    set_model: Callable[[str | None], object] | None = None
    """`set_model` (None: the session's own model); raises `ValueError` for a name it does
    not know."""
    mcp_status: Callable[[], list[dict[str, Any]]] | None = None
    """The `mcpServers` entries of `mcp_status` (Claude Code's `McpServerStatus` shape:
    `mcp_status_entries`)."""
    host: HostParts = field(default_factory=HostParts)
    """What the host's `initialize` added (empty until it came)."""
    ready: trio.Event = field(default_factory=trio.Event)
    """Set once the host's first line was handled, or stdin closed: a session opened after
    this has the host's hooks and agent types (`initialize` comes first)."""
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
                    self.ready.set()
        finally:
            self._closed = True
            self.ready.set()
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
                if self.ready.is_set():
                    raise ValueError(
                        "initialize must be the host's first message; this session is "
                        "already open, so its hooks and agents could not be applied"
                    )
                agents = request.get("agents") or {}
                if not isinstance(agents, dict):
                    raise ValueError("initialize: agents must be an object of definitions")
                try:
                    # Checked now, so a mistake reaches the application as the initialize
                    # error; the session parses them again against its own tools.
                    sdk_agent_types(agents, all_tools=_builtin_tools())
                except ConfigError as exc:
                    raise ValueError(str(exc)) from exc
                self.host = HostParts(hooks=self._hooks(request.get("hooks")), agents=agents)
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
                mode = warren_mode(wanted) or wanted
                if mode not in MODES:
                    names = ", ".join(CLAUDE_MODE_NAMES.values())
                    raise ValueError(f"no permission mode {wanted!r}; the modes are {names}")
                if self.set_mode is None:
                    raise ValueError("no session is running yet")
                self.set_mode(mode)
                return {}
            case "set_model":
                model = request.get("model")
                if model is not None and not isinstance(model, str):
                    raise ValueError("set_model: model must be a string or null")
                if self.set_model is None:
                    raise ValueError("no session is running yet")
                self.set_model(model)
                return {}
            case "mcp_status":
                return {"mcpServers": [] if self.mcp_status is None else self.mcp_status()}
            case other:
                raise ValueError(f"Warren does not support the control request {other!r}")

    def _hooks(self, config: object) -> tuple[ConfiguredHook, ...]:
        """The hook callbacks of `initialize` (`{event: [{matcher, hookCallbackIds,
        timeout}]}`) as the session's hooks.

        **Errors:** `ValueError` naming an event Warren does not fire, or a bad matcher.
        """
        if not config:
            return ()
        if not isinstance(config, dict):
            raise ValueError("initialize: hooks must be an object of events")
        unknown = sorted(set(config) - set(HOOK_EVENTS))
        if unknown:
            raise ValueError(
                f"Warren does not fire the hook event {', '.join(unknown)}; its events are "
                f"{', '.join(HOOK_EVENTS)}"
            )
        hooks: list[ConfiguredHook] = []
        for event, matchers in config.items():
            for entry in matchers or ():
                if not isinstance(entry, dict):
                    raise ValueError(f"initialize: a {event} hook matcher must be an object")
                if entry.get("onFailure") not in (None, "continue"):
                    raise ValueError(
                        f"{event}: Warren does not support onFailure={entry['onFailure']!r}; "
                        "a hook callback that fails never blocks"
                    )
                matcher = entry.get("matcher") if event in MATCHER_EVENTS else None
                timeout = entry.get("timeout") or DEFAULT_HOOK_TIMEOUT_S
                for callback_id in entry.get("hookCallbackIds") or ():
                    try:
                        hook = Hook(
                            event=event,
                            command=f"SDK hook callback {callback_id}",
                            matcher=matcher,
                            matcher_kind="regex",
                            timeout_s=timeout,
                        )
                    except pydantic.ValidationError as exc:
                        detail = exc.errors(include_url=False)[0]["msg"]
                        raise ValueError(f"{event} hook {callback_id}: {detail}") from exc
                    hooks.append(
                        ConfiguredHook(
                            hook,
                            SDK_HOOKS,
                            build_matcher(matcher, kind="regex"),
                            callback=self._hook_callback(str(callback_id)),
                        )
                    )
        return tuple(hooks)

    def _hook_callback(self, callback_id: str) -> HookCallback:
        async def call(input: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]:
            request: dict[str, Any] = {
                "subtype": "hook_callback",
                "callback_id": callback_id,
                "input": input,
            }
            if tool_use_id is not None:
                request["tool_use_id"] = tool_use_id
            return await self.request(request)

        return call

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
        return await self.send(request).answer()

    def send(self, request: dict[str, Any]) -> PendingRequest:
        """Write a control request now; its answer is awaited apart (`PendingRequest.answer`),
        so requests reach the host in the order they were made."""
        if self._closed:
            return PendingRequest(self, "", None)
        request_id = f"warren_{next(self._ids)}"
        event, slot = trio.Event(), list[dict[str, Any]]()
        self._waiting[request_id] = (event, slot)
        self._write({"type": "control_request", "request_id": request_id, "request": request})
        return PendingRequest(self, request_id, (event, slot))

    def mcp_message(self, server: str, message: dict[str, Any]) -> PendingRequest:
        """One JSON-RPC message for the host's MCP server `server` (`mcp_message`), sent now;
        the answer's `mcp_response` is the server's JSON-RPC reply."""
        return self.send({"subtype": "mcp_message", "server_name": server, "message": message})

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


def _builtin_tools() -> tuple[str, ...]:
    from orchestrator.tools.registry import builtin_facts

    return tuple(builtin_facts())


@dataclass
class PendingRequest:
    """A control request Warren sent, its answer still to come."""

    control: SdkControl
    request_id: str
    waiting: tuple[trio.Event, list[dict[str, Any]]] | None

    async def answer(self) -> dict[str, Any]:
        """The host's answer (`response` of its success).

        **Errors:** `ProtocolError` with the host's error, or when stdin has closed.
        **Cancellation:** the host is told (`control_cancel_request`) and the answer, if it
        comes, is dropped.
        """
        if self.waiting is None:
            raise ProtocolError("the SDK host closed stdin")
        event, slot = self.waiting
        try:
            await event.wait()
        except trio.Cancelled:
            self.control._waiting.pop(self.request_id, None)
            self.control._write({"type": "control_cancel_request", "request_id": self.request_id})
            raise
        [response] = slot
        if response.get("subtype") == "error":
            raise ProtocolError(str(response.get("error", "the host answered with an error")))
        answer = response.get("response")
        return answer if isinstance(answer, dict) else {}


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
