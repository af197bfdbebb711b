"""The pipes of a server process as the MCP SDK's stream pair.

The SDK's own `stdio_client` spawns its process itself; Warren's servers are spawned by the
floor (`sandbox.open_sandboxed_process`), so this bridges any process with trio stdin/stdout
streams to the `(read, write)` pair `mcp.ClientSession` takes: newline-delimited JSON-RPC, one
message a line. A line that is not JSON-RPC reaches the session as an exception value (the SDK
surfaces it, the call in flight fails); a line longer than `MAX_LINE_BYTES` (a server flooding
its stdout) ends the connection instead of the coordinator's memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types
import trio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = [
    "MAX_LINE_BYTES",
    "HostMessages",
    "LineTooLong",
    "SessionStreams",
    "host_streams",
    "process_streams",
]

MAX_LINE_BYTES = 16 * 1024 * 1024
"""One JSON-RPC message from a server, at most (a tool result included)."""


class PendingReply(Protocol):
    async def answer(self) -> dict[str, Any]: ...


class HostMessages(Protocol):
    """Where an SDK host's server is reached (`SdkControl.mcp_message`): one JSON-RPC message
    sent at once, its control answer (`{"mcp_response": ...}`) awaited apart."""

    def __call__(self, server: str, message: dict[str, Any]) -> PendingReply: ...


class LineTooLong(ValueError):
    """The server wrote a line past `MAX_LINE_BYTES`: the connection is closed."""


SessionStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception],
    MemoryObjectSendStream[SessionMessage],
]
"""What `mcp.ClientSession` takes: the messages from the server, and where to write its own."""


@dataclass(frozen=True)
class _Channels:
    """The memory streams between a session and the pumps that carry its messages to a server
    and back: the session reads `from_server` and writes `to_server`; the pumps write
    `to_session` and read `from_session`."""

    to_session: MemoryObjectSendStream[SessionMessage | Exception]
    from_server: MemoryObjectReceiveStream[SessionMessage | Exception]
    to_server: MemoryObjectSendStream[SessionMessage]
    from_session: MemoryObjectReceiveStream[SessionMessage]

    @classmethod
    def open(cls) -> _Channels:
        to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        to_server, from_session = anyio.create_memory_object_stream[SessionMessage](16)
        return cls(to_session, from_server, to_server, from_session)

    @asynccontextmanager
    async def pumped(self, *pumps: Callable[[], Awaitable[None]]) -> AsyncIterator[SessionStreams]:
        """The session's pair while `pumps` run; leaving the block stops them and closes the
        memory streams."""
        async with trio.open_nursery() as nursery:
            for pump in pumps:
                nursery.start_soon(pump)
            try:
                yield self.from_server, self.to_server
            finally:
                nursery.cancel_scope.cancel()
                await self.to_server.aclose()
                await self.from_server.aclose()
                await self.to_session.aclose()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return ValueError(f"the server wrote something that is not JSON-RPC ({exc})")


@asynccontextmanager
async def process_streams(
    stdin: trio.abc.SendStream, stdout: trio.abc.ReceiveStream
) -> AsyncIterator[SessionStreams]:
    """The session's stream pair over a process's pipes, for the block's duration.

    Leaving the block stops both pumps and closes the memory streams; the process itself is
    its owner's to stop (closing its stdin is the MCP way to ask it to exit).
    """
    channels = _Channels.open()
    to_session, from_session = channels.to_session, channels.from_session

    async def read() -> None:
        buffer = bytearray()
        async with to_session:
            while True:
                try:
                    chunk = await stdout.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not chunk:
                    return
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        await to_session.send(_parse(line))
                if len(buffer) > MAX_LINE_BYTES:
                    await to_session.send(
                        LineTooLong(f"the server wrote a line over {MAX_LINE_BYTES} bytes")
                    )
                    return

    async def write() -> None:
        async with from_session:
            async for message in from_session:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    await stdin.send_all(data.encode() + b"\n")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await to_session.aclose()  # the server is gone: the session sees the end
                    return

    async with channels.pumped(read, write) as streams:
        yield streams


@asynccontextmanager
async def host_streams(server: str, host: HostMessages) -> AsyncIterator[SessionStreams]:
    """The session's stream pair for a server an SDK host runs: each message the session
    writes goes to the host as an `mcp_message` control request, in order; a request's
    answer (the server's JSON-RPC reply) comes back to the session, a notification's ack is
    dropped. A host that cannot answer a request gives it a JSON-RPC error, so that one call
    fails and the connection stays."""
    channels = _Channels.open()
    to_session, from_session = channels.to_session, channels.from_session

    async def reply(request_id: Any, pending: Awaitable[dict[str, Any]]) -> None:
        try:
            answer = (await pending).get("mcp_response")
        except Exception as exc:  # the host answered with an error, or is gone
            error = {"code": -32603, "message": str(exc)}
            answer = {"jsonrpc": "2.0", "id": request_id, "error": error}
        try:
            parsed: SessionMessage | Exception = SessionMessage(
                mcp_types.jsonrpc_message_adapter.validate_python(answer, by_name=False)
            )
        except ValueError as exc:
            parsed = ValueError(f"the SDK host answered with something not JSON-RPC ({exc})")
        await to_session.send(parsed)

    async def write() -> None:
        async with from_session, trio.open_nursery() as replies:
            async for message in from_session:
                data = message.message.model_dump(mode="json", by_alias=True, exclude_unset=True)
                pending = host(server, data)
                if "id" in data and "method" in data:
                    replies.start_soon(reply, data["id"], pending.answer())

    async with channels.pumped(write) as streams:
        yield streams
