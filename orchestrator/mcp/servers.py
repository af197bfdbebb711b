"""The session's MCP servers: started beside it, listed, called, restarted, stopped.

`open_mcp_servers` starts every configured server concurrently in the background and returns
at once: a server's start-up is never on the path of the first model request. Each server
lives in one task of its own (`_Server.run`), which holds its process (from the injected
`ServerLauncher`: the floor for stdio servers) and its `mcp.ClientSession` for as long as the
server stays up. Its tools join the session's registry when its listing arrives
(`McpServers.tools`); a call that names a server still starting waits for it, up to the
server's `startup_timeout_s`.

Faults never end the session: a server that fails to start, exits, hangs past `timeout_s` or
answers with something that is not MCP gives the call an error result for the model, one line
for the user (`McpServers.notices`), and is started again at its next call, at most
`MAX_RESTARTS` times a session. Leaving `open_mcp_servers` stops every server (stdin closed,
then the launcher's own SIGTERM/SIGKILL teardown), so no server process outlives the session.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import mcp_types
import structlog
import trio
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from orchestrator.mcp.transport import HostMessages, host_streams, process_streams
from policies.mcp import McpServer

__all__ = [
    "MAX_RESTARTS",
    "McpCallFailed",
    "McpServers",
    "ServerLauncher",
    "ServerProcess",
    "ServerStatus",
    "open_mcp_servers",
]

MAX_RESTARTS = 3
"""Times one server is started again after a failure, per session."""

_MAX_RESOURCES = 1_000
"""Resources of one server kept for completion (the first page's, at most this many)."""

_STDERR_TAIL = 2_000
"""Characters of a server's stderr kept to explain a failure."""

ServerStatus = Literal["starting", "ready", "failed", "stopped"]

T = TypeVar("T")


class ServerProcess(Protocol):
    """A started server process as the launcher gives it (a `SandboxProcess` or a
    `trio.Process`)."""

    pid: int
    stdin: trio.abc.SendStream | None
    stdout: trio.abc.ReceiveStream | None
    stderr: trio.abc.ReceiveStream | None

    async def wait(self) -> int: ...


ServerLauncher = Callable[[str, McpServer], AbstractAsyncContextManager[ServerProcess]]
"""Starts a stdio server (its name and configuration) and stops it when the block ends."""


class McpCallFailed(Exception):
    """A call could not be made or did not complete; the message is for the model."""


@dataclass(eq=False)
class _Server:
    name: str
    config: McpServer
    source: str
    launcher: ServerLauncher
    on_change: Callable[[], None]
    notice: Callable[[str], None]
    host: HostMessages | None = None
    """Where an `sdk` server is reached: the SDK host driving the session."""
    status: ServerStatus = "starting"
    error: str | None = None
    tools: dict[str, mcp_types.Tool] = field(default_factory=dict)
    prompts: dict[str, mcp_types.Prompt] = field(default_factory=dict)
    """The prompt templates the server offers (the REPL's `/mcp__server__prompt` commands)."""
    resources: dict[str, mcp_types.Resource] = field(default_factory=dict)
    """The resources the server lists, by uri (the REPL completes `@server:uri`)."""
    session: ClientSession | None = None
    pid: int | None = None
    starts: int = 0
    _change: trio.Event = field(default_factory=trio.Event)
    """Set (and replaced) at every change of `status`."""
    _restart: trio.Event = field(default_factory=trio.Event)
    _gone: trio.Event = field(default_factory=trio.Event)
    _stderr: str = ""
    _why: str | None = None
    """Why the server was stopped from our side (a call that timed out)."""

    async def run(self) -> None:
        """The server's life: start, serve until it fails, then wait for a call to ask for a
        restart (bounded). Cancelled when the session ends."""
        log = structlog.get_logger().bind(mcp_server=self.name)
        while True:
            self.starts += 1
            self.error, self._stderr, self._why = None, "", None
            self._set("starting")
            self._gone = trio.Event()
            try:
                await self._serve(log)
            except Exception as exc:  # any failure of one server is that server's state
                self._fail(_describe(exc))
            else:
                self._fail(self._why or "the server exited")
            self.session, self.pid = None, None
            log.warning("mcp server down", error=self.error, starts=self.starts)
            self.notice(f"warren: MCP server {self.name!r}: {self.error}")
            self.on_change()
            if self.starts > MAX_RESTARTS:
                return
            await self._restart.wait()
            self._restart = trio.Event()

    async def _serve(self, log: Any) -> None:
        async with self._streams() as (read, write), ClientSession(read, write) as session:
            with trio.fail_after(self.config.startup_timeout_s):
                started = await session.initialize()
                self.tools = await _list_tools(session)
                if started.capabilities.prompts is not None:
                    self.prompts = {p.name: p for p in (await session.list_prompts()).prompts}
                if started.capabilities.resources is not None:
                    try:  # only for completion: a server that cannot list them still serves
                        listed = (await session.list_resources()).resources
                    except MCPError:
                        listed = []
                    self.resources = {str(r.uri): r for r in listed[:_MAX_RESOURCES]}
            self.session = session
            self._set("ready")
            log.info("mcp server ready", tools=len(self.tools), pid=self.pid)
            self.on_change()
            await self._gone.wait()

    @asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        """The session's stream pair: a `url` server over streamable HTTP from here, a stdio
        server's process (from the launcher) over its pipes, watched for its exit; an `sdk`
        server over the SDK host's control channel."""
        if self.config.sdk:
            if self.host is None:
                raise RuntimeError("no SDK host drives this session to run it")
            async with host_streams(self.name, self.host) as streams:
                yield streams
            return
        if self.config.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            async with (
                httpx2.AsyncClient(headers=self.config.headers, timeout=30.0) as http,
                streamable_http_client(self.config.url, http_client=http) as (read, write),
            ):
                yield read, write
            return
        async with self.launcher(self.name, self.config) as process:
            assert process.stdin is not None and process.stdout is not None
            self.pid = process.pid
            async with trio.open_nursery() as nursery:
                if process.stderr is not None:
                    nursery.start_soon(self._keep_stderr, process.stderr)
                nursery.start_soon(self._watch_exit, process)
                async with process_streams(process.stdin, process.stdout) as streams:
                    yield streams
                nursery.cancel_scope.cancel()

    async def _watch_exit(self, process: ServerProcess) -> None:
        await process.wait()
        self._gone.set()

    async def _keep_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        while chunk := await stream.receive_some(1 << 14):
            text = self._stderr + chunk.decode(errors="replace")
            self._stderr = text[-_STDERR_TAIL:]

    def _fail(self, why: str) -> None:
        tail = self._stderr.strip().splitlines()
        self.error = f"{why} (its last stderr line: {tail[-1][:300]})" if tail else why
        self.session = None
        if self.starts > MAX_RESTARTS:
            self.tools = {}
        self._set("failed" if self.starts <= MAX_RESTARTS else "stopped")

    def _set(self, status: ServerStatus) -> None:
        self.status = status
        self._change.set()
        self._change = trio.Event()

    async def connected(self) -> ClientSession:
        """The live session, waiting for a start under way (up to `startup_timeout_s`) and
        asking a failed server to start again (once per call).

        **Errors:** `McpCallFailed` when the server is not up in time, fails again, or is out
        of restarts.
        """
        asked = False
        with trio.move_on_after(self.config.startup_timeout_s):
            while True:
                if self.status == "ready" and self.session and not self._gone.is_set():
                    return self.session
                if self.status == "stopped" or (self.status == "failed" and asked):
                    raise McpCallFailed(self._unavailable())
                if self.status == "failed":
                    self._restart.set()
                    asked = True
                await self._change.wait()
        raise McpCallFailed(
            f"MCP server {self.name!r} did not start within {self.config.startup_timeout_s:g} s"
        )

    def _unavailable(self) -> str:
        restarts = (
            " It is not started again in this session."
            if self.starts > MAX_RESTARTS
            else " It is started again at the next call."
        )
        return f"MCP server {self.name!r} is not available: {self.error}.{restarts}"

    async def call(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float
    ) -> mcp_types.CallToolResult:
        """Call `tool`; the whole call (a wait for a start included) is bounded.

        **Errors:** `McpCallFailed` (the model's message): no such tool, the server down, a
        timeout (the server is then stopped and started again at the next call), a result
        that is not MCP.
        """
        session = await self.connected()
        if tool not in self.tools:
            names = ", ".join(sorted(self.tools)) or "none"
            raise McpCallFailed(
                f"MCP server {self.name!r} has no tool {tool!r}; its tools: {names}"
            )
        gone = self._gone
        result: mcp_types.CallToolResult | None = None
        failure: str | None = None
        refused: str | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await gone.wait()
                nursery.cancel_scope.cancel()

            async def call() -> None:
                nonlocal result, failure, refused
                try:
                    with trio.move_on_after(timeout_s) as scope:
                        answer = await session.call_tool(tool, dict(arguments))
                    if scope.cancelled_caught:
                        failure = f"timed out after {timeout_s:g} s"
                        self._why = f"a call timed out after {timeout_s:g} s"
                        gone.set()  # stopped now, started again at the next call
                    elif isinstance(answer, mcp_types.CallToolResult):
                        result = answer
                    else:
                        failure = f"answered with a {type(answer).__name__}, not a tool result"
                except MCPError as exc:  # the server answered with an error: it is up
                    refused = f"MCP server {self.name!r} refused the call: {_describe(exc)}"
                except Exception as exc:  # a broken connection, a result that is not MCP
                    failure = _describe(exc)
                    self._why = f"a call failed ({failure})"
                    gone.set()  # stopped now, started again at the next call
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(call)
        if result is not None:
            return result
        if refused is not None:
            raise McpCallFailed(refused)
        if failure is None:  # the watcher fired: the process is gone
            failure = "the server exited during the call"
        raise McpCallFailed(
            f"MCP server {self.name!r} failed: {failure}. It is started again at the next call."
        )


async def _list_tools(session: ClientSession) -> dict[str, mcp_types.Tool]:
    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    for _ in range(100):  # pages; a server that never stops paging is cut off
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        listing = await session.list_tools(params=params)
        tools.update((tool.name, tool) for tool in listing.tools)
        cursor = listing.next_cursor
        if not cursor:
            break
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "it did not finish starting in time"
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return f"it could not be started ({exc})"
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    return text.splitlines()[0][:300]


class McpServers:
    """Every configured server of a session, by name."""

    def __init__(
        self,
        servers: Mapping[str, tuple[McpServer, str]],
        launcher: ServerLauncher,
        *,
        read_only_tools: bool = False,
        on_notice: Callable[[str], None] | None = None,
        host: HostMessages | None = None,
    ) -> None:
        self.read_only_tools = read_only_tools
        """`[mcp] allow_read_only_tools`."""
        self.version = 0
        """Bumped whenever a server's tools come or go (the loop re-reads the tool list)."""
        self.notices: list[str] = []
        self._on_notice = on_notice
        self._servers = {
            name: _Server(name, config, source, launcher, self._changed, self._notice, host)
            for name, (config, source) in servers.items()
        }

    def _changed(self) -> None:
        self.version += 1

    def _notice(self, line: str) -> None:
        self.notices.append(line)
        if self._on_notice is not None:
            self._on_notice(line)

    def names(self) -> list[str]:
        return list(self._servers)

    def config(self, server: str) -> McpServer | None:
        found = self._servers.get(server)
        return None if found is None else found.config

    def status(self, server: str) -> tuple[ServerStatus, str | None, int | None]:
        """(status, error, pid) of one server."""
        found = self._servers[server]
        return found.status, found.error, found.pid

    def tools(self) -> list[tuple[str, mcp_types.Tool]]:
        """(server, tool) of every tool listed by a server that is not out of restarts (a
        failed server keeps its tools: a call starts it again)."""
        return self._listed(lambda server: server.tools, ready_only=False)

    def prompts(self) -> list[tuple[str, mcp_types.Prompt]]:
        """(server, prompt) of every prompt template a server that is up offers."""
        return self._listed(lambda server: server.prompts, ready_only=True)

    def resources(self) -> list[tuple[str, mcp_types.Resource]]:
        """(server, resource) of every resource a server that is up lists."""
        return self._listed(lambda server: server.resources, ready_only=True)

    def _listed(
        self, listing: Callable[[_Server], dict[str, T]], *, ready_only: bool
    ) -> list[tuple[str, T]]:
        """(server, item) of every item in the `listing` of each server that is ready, or
        (not `ready_only`) of each that is not stopped."""
        return [
            (server.name, item)
            for server in self._servers.values()
            if (server.status == "ready" if ready_only else server.status != "stopped")
            for item in listing(server).values()
        ]

    async def get_prompt(self, server: str, name: str, arguments: Mapping[str, str]) -> str:
        """The text of prompt `name` of `server` filled with `arguments` (its messages'
        text, one after another), within the server's `timeout_s`.

        **Errors:** `McpCallFailed` (no such server, the server down, the prompt refused or
        not answered in time).
        """
        result = await self._request(
            server,
            lambda session: session.get_prompt(name, dict(arguments)),
            failed=f"could not give the prompt {name}",
            late=f"did not give the prompt {name}",
        )
        return "\n\n".join(
            message.content.text
            if isinstance(message.content, mcp_types.TextContent)
            else f"[{message.content.type} content]"
            for message in result.messages
        )

    def tool(self, server: str, name: str) -> mcp_types.Tool | None:
        found = self._servers.get(server)
        return None if found is None else found.tools.get(name)

    async def wait_started(
        self, timeout_s: float = math.inf, *, names: Collection[str] | None = None
    ) -> None:
        """Wait until no server (of `names`, when given) is starting (`warren doctor`, a
        subagent that names a server's tools, tests). Each start is bounded by the server's
        own `startup_timeout_s`."""
        with trio.move_on_after(timeout_s):
            for server in self._servers.values():
                if names is not None and server.name not in names:
                    continue
                while server.status == "starting":
                    await server._change.wait()

    async def read_resource(self, server: str, uri: str) -> str:
        """The text of resource `uri` of `server` (binary parts named, not included), within
        the server's `timeout_s`.

        **Errors:** `McpCallFailed` (no such server, the server down, the read refused or
        timed out).
        """
        result = await self._request(
            server,
            lambda session: session.read_resource(uri),
            failed=f"could not read {uri}",
            late=f"did not answer for {uri}",
        )
        parts = [
            item.text
            if isinstance(item, mcp_types.TextResourceContents)
            else f"[binary content of {item.uri}]"
            for item in result.contents
        ]
        return "\n".join(parts)

    async def call(
        self, server: str, tool: str, arguments: Mapping[str, Any]
    ) -> mcp_types.CallToolResult:
        """See `_Server.call`; an unknown server is `McpCallFailed` too."""
        found = self._named(server)
        return await found.call(tool, arguments, found.config.timeout_s)

    def _named(self, server: str) -> _Server:
        """**Errors:** `McpCallFailed` when there is no such server."""
        found = self._servers.get(server)
        if found is None:
            raise McpCallFailed(f"there is no MCP server {server!r}")
        return found

    async def _request(
        self,
        server: str,
        request: Callable[[ClientSession], Awaitable[T]],
        *,
        failed: str,
        late: str,
    ) -> T:
        """What `request` gets of `server`'s session, within the server's `timeout_s`.

        **Errors:** `McpCallFailed`: no such server, the server down, `MCP server NAME
        {failed}: why` when the request fails, `MCP server NAME {late} in time`.
        """
        found = self._named(server)
        session = await found.connected()
        with trio.move_on_after(found.config.timeout_s):
            try:
                return await request(session)
            except Exception as exc:  # an MCP error or a broken connection
                raise McpCallFailed(f"MCP server {server!r} {failed}: {_describe(exc)}") from None
        raise McpCallFailed(f"MCP server {server!r} {late} in time")


@asynccontextmanager
async def open_mcp_servers(
    servers: Mapping[str, tuple[McpServer, str]],
    launcher: ServerLauncher,
    *,
    read_only_tools: bool = False,
    on_notice: Callable[[str], None] | None = None,
    host: HostMessages | None = None,
) -> AsyncIterator[McpServers]:
    """Start every stdio server in the background; stop them all when the block ends.

    A `url` server is reached from the coordinator, outside the floor, and a sandboxed
    server with `network = true` has the host's network: one line each says so (the second
    with the file that granted it). An `sdk` server is the SDK host's (`host`), reached over
    its control channel.
    """
    for name, (config, source) in servers.items():
        if on_notice is None:
            break
        if config.url is not None:
            on_notice(f"warren: MCP server {name!r} is reached over HTTP, outside the sandbox")
        elif config.network and config.sandbox:
            on_notice(
                f"warren: MCP server {name!r} runs in the sandbox with the host's network "
                f"(network = true in {source})"
            )
    started = McpServers(
        servers,
        launcher,
        read_only_tools=read_only_tools,
        on_notice=on_notice,
        host=host,
    )
    async with trio.open_nursery() as nursery:
        for server in started._servers.values():
            nursery.start_soon(server.run, name=f"mcp server {server.name}")
        try:
            yield started
        finally:
            nursery.cancel_scope.cancel()
