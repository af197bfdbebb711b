"""The session's MCP servers before they start: kept off the first model request's path.

Starting a server costs the coordinator the MCP SDK's import (a large share of Warren's own
start-up), a sandbox spawn per server and, on a small machine, the cores the servers' own
interpreters take while they start. None of it may delay the first model request
(tests/bench/bench_mcp.py, b), so a session holds a `DeferredMcp` in its tool registry: a
`ToolSource` with no tools, which imports nothing of the SDK, until `start()`. The session
starts it once its first model request is answered
(`orchestrator.session.later.FirstResponseStarts`: the first event of the first response, or its
failure), the REPL as soon as it opens (the user is typing), and anything that needs a server now
(`@server:resource` in a prompt, a subagent whose type names MCP tools, `/mcp`) through
`servers()`. The servers' tools then join the registry as each server lists them, and the loop
offers them from the next request on (it re-reads the tool list whenever the registry's version
changes), as Claude Code lists a server's tools once it is ready.

A call of `mcp__<server>__<tool>` for a configured server that arrives before then (the first
response names a tool from an earlier session) is not refused: `get` gives a stand-in that
starts the servers, waits for them and runs the call through the real tool.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import structlog
import trio
from pydantic import ConfigDict

from orchestrator.aio import closing_iter
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts

if TYPE_CHECKING:
    from orchestrator.mcp.servers import McpServers
    from orchestrator.mcp.tool import McpTools

__all__ = ["DeferredMcp"]

PREFIX = "mcp__"


class DeferredMcp:
    """The session's MCP servers, started on `start()` (see the module docstring)."""

    def __init__(
        self, open: Callable[[], AbstractAsyncContextManager[McpServers]], names: Collection[str]
    ) -> None:
        """`open`: starts the servers (the session's `McpFactory`); `names`: the configured
        servers (a call naming one of them waits for the start)."""
        self._open = open
        self._names = frozenset(names)
        self._gate = trio.Event()
        self._started = trio.Event()
        self._tools: McpTools | None = None
        self.servers: McpServers | None = None
        """The servers once started (None before, or when they could not be started)."""

    @property
    def names(self) -> frozenset[str]:
        """The configured servers, started or not."""
        return self._names

    # -- the ToolSource ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        return 0 if self._tools is None else 1 + self._tools.version

    def listed(self) -> Sequence[Tool[Any]]:
        return [] if self._tools is None else self._tools.listed()

    def get(self, name: str) -> Tool[Any] | None:
        if self._tools is not None:
            return self._tools.get(name)
        server, sep, tool = name.removeprefix(PREFIX).partition("__")
        if name.startswith(PREFIX) and sep and tool and server in self._names:
            return _Pending(self, name)
        return None

    # -- starting ---------------------------------------------------------------------------

    @property
    def requested(self) -> bool:
        return self._gate.is_set()

    def start(self) -> None:
        """Start the servers (in the background; at once if already asked)."""
        self._gate.set()

    async def ready(self) -> McpServers | None:
        """Start the servers if not yet asked, and wait until they are being started (not
        until each is up: `McpServers.wait_started` waits for that). None when they could not
        be started at all."""
        self.start()
        await self._started.wait()
        return self.servers

    async def _run(self) -> None:
        await self._gate.wait()
        try:
            from orchestrator.mcp.tool import McpTools

            async with self._open() as servers:
                self.servers = servers
                self._tools = McpTools(servers)
                self._started.set()
                await trio.sleep_forever()
        except Exception as exc:  # the session goes on without its servers
            structlog.get_logger().error("mcp servers could not be started", error=str(exc))
        finally:
            self._started.set()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[DeferredMcp]:
        """The block during which the servers may run; leaving it stops them."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run, name="mcp servers")
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()


class _Arguments(ToolInput):
    model_config = ConfigDict(extra="allow", frozen=True)


class _Pending(Tool[_Arguments]):
    """A configured server's tool named before the servers started: starts them, then runs
    the call through the real tool (its schema check included)."""

    name: ClassVar[str] = "mcp"
    input_model: ClassVar[type[ToolInput]] = _Arguments
    description: ClassVar[str] = "A tool of an MCP server that is starting."
    facts: ClassVar[ToolFacts] = ToolFacts(family="external", runs_in_coordinator=True)

    def __init__(self, source: DeferredMcp, name: str) -> None:
        self._source = source
        self.name = name  # type: ignore[misc]

    def timeout_s(self, input: _Arguments) -> float | None:
        return math.inf  # the real tool's server bounds its start and its call

    async def call(
        self, input: _Arguments, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        await self._source.ready()
        real = self._source.get(self.name)
        if real is None or isinstance(real, _Pending):
            yield ToolOutput(content=f"No such tool: {self.name}.", is_error=True)
            return
        arguments = input.model_dump(mode="json", by_alias=True)
        parsed = real.parse_input(arguments)
        refusal = await real.validate(parsed, ctx)
        if refusal is not None:
            yield ToolOutput(content=refusal, is_error=True)
            return
        async with closing_iter(real.call(parsed, ctx)) as events:
            async for event in events:
                yield event
