"""`warren mcp serve`: Warren's tools as an MCP server (stdio, or streamable HTTP on 127.0.0.1),
with the floor and the policy.

Another client (Claude Desktop, an IDE, another agent) gets sandboxed tools: each call goes
through a `Session`'s pipeline exactly as a model's call does (schema, hooks, the repository's
policy, the audit log, the output cap), and runs in the session's sandboxed tool hosts. There is
no one to ask, so a call the policy would ask about is denied, and says so; `--permission-mode`
and `--allowed-tools` widen what runs, as for `warren -p`.

The served tools are the file and shell tools (`SERVED`), and `dispatch_agent` when the session
can reach a model (an API key in the environment, or a scripted model): its subagents run in
the session's worker pool, their model requests made by this process; a tool is marked
`readOnlyHint` when its facts say it only reads. Nothing is printed on stdout but the protocol:
the SDK's `stdio_server` points fd 1 at stderr while it serves, and the session's own output goes
nowhere.

Over HTTP (`--http PORT`) the SDK's streamable HTTP app runs under uvicorn, which is asyncio's,
in a thread of its own; each tool call crosses back to the session's trio thread
(`trio.from_thread.run`), so the session, its tool hosts and its nurseries stay trio's. The
app listens on 127.0.0.1 only, behind the SDK's DNS-rebinding check and a bearer token
(`BearerToken`): a request without it, or with another, gets 401 before the MCP app sees it.
"""

from __future__ import annotations

import functools
import hmac
import io
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final

import mcp_types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from orchestrator.errors import ConfigError
from orchestrator.messages import ImageBlock, TextBlock, ToolResultBlock
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.session.session import Session
from policies.claude_names import SUBAGENT_TOOL

__all__ = ["SERVED", "BearerToken", "build_server", "serve_http", "serve_stdio", "served"]

SERVED: Final = ("Read", "Glob", "Grep", "LS", "Edit", "MultiEdit", "Write", "NotebookEdit", "Bash")
"""The tools always offered to clients; `dispatch_agent` too when the session can reach a
model (`served`)."""


def served(session: Session) -> tuple[str, ...]:
    """The names of the tools this session offers its clients."""
    model = session.config.model.startswith("scripted:") or any(
        os.environ.get(key) for key in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
    )
    agent = model and session.tools.get(SUBAGENT_TOOL) is not None
    return (*SERVED, SUBAGENT_TOOL) if agent else SERVED


def _tool(session: Session, name: str) -> mcp_types.Tool | None:
    tool = session.tools.get(name)
    if tool is None:
        return None
    return mcp_types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema(),
        annotations=mcp_types.ToolAnnotations(
            read_only_hint=tool.facts.family in ("read", "meta"),
            destructive_hint=tool.facts.family in ("edit", "exec"),
            open_world_hint=False,
        ),
    )


def _content(result: ToolResultBlock) -> list[mcp_types.ContentBlock]:
    if isinstance(result.content, str):
        return [mcp_types.TextContent(text=result.content)]
    content: list[mcp_types.ContentBlock] = []
    for block in result.content:
        if isinstance(block, TextBlock):
            content.append(mcp_types.TextContent(text=block.text))
        elif isinstance(block, ImageBlock):
            content.append(
                mcp_types.ImageContent(data=block.source.data, mime_type=block.source.media_type)
            )
    return content


ToolCall = Callable[[str, dict[str, Any]], Awaitable[ToolResultBlock]]
"""Runs one served call through the session (`Session.call_tool`, or a bridge to it)."""


def build_server(session: Session, call: ToolCall | None = None) -> Server[Any]:
    """An MCP server whose tools are `session`'s served tools; `call` runs a call (default:
    `session.call_tool`, in this thread)."""
    names = served(session)
    tools = [t for t in (_tool(session, name) for name in names) if t is not None]
    run_call: ToolCall = call or session.call_tool

    async def list_tools(
        ctx: Any, params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: Any, params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        if params.name not in names:
            listed = ", ".join(t.name for t in tools)
            text = f"No such tool: {params.name}. Tools: {listed}"
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(text=text)], is_error=True
            )
        result = await run_call(params.name, dict(params.arguments or {}))
        return mcp_types.CallToolResult(content=_content(result), is_error=bool(result.is_error))

    return Server(
        "warren",
        instructions="Warren's file and shell tools, each call inside a bubblewrap sandbox "
        "under the repository's permission policy.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_stdio(config: SessionConfig, parts: SessionParts) -> None:
    """Serve until the client closes stdin. The session's own output is discarded."""
    parts = _served_parts(parts)
    async with open_session(config, parts) as session:
        server = build_server(session)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def _served_parts(parts: SessionParts) -> SessionParts:
    """What a served session runs with; its own output goes nowhere."""
    return SessionParts(
        dirs=parts.dirs,
        runner=parts.runner,
        subagents=parts.subagents,
        broker=parts.broker,
        mcp=parts.mcp,
        stdout=io.StringIO(),
    )


class BearerToken:
    """ASGI middleware: an HTTP request passes only with `Authorization: Bearer <token>`
    (compared in constant time); any other gets 401 and never reaches the MCP app."""

    def __init__(self, app: Any, token: str) -> None:
        self._app = app
        self._token = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._token):
                body = b'{"error": "unauthorized: a bearer token is required"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


async def serve_http(config: SessionConfig, parts: SessionParts, *, port: int, token: str) -> None:
    """Serve streamable HTTP on 127.0.0.1:`port` (0: any free port) until cancelled
    (Ctrl-C); one line on stderr says where.

    **Cancellation:** the HTTP server is told to exit and its thread joined (bounded by
    uvicorn's own shutdown), then the session closes.
    **Errors:** `ConfigError` when the port cannot be bound.
    """
    import anyio.to_thread
    import trio

    parts = _served_parts(parts)
    try:
        listener = socket.create_server(("127.0.0.1", port))
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}", source="--http"
        ) from exc
    async with open_session(config, parts) as session:
        trio_token = trio.lowlevel.current_trio_token()

        async def call(name: str, arguments: dict[str, Any]) -> ToolResultBlock:
            # On uvicorn's asyncio thread: the call runs on the session's trio thread.
            cross = functools.partial(
                trio.from_thread.run, session.call_tool, name, arguments, trio_token=trio_token
            )
            return await anyio.to_thread.run_sync(cross)

        http = _HttpThread(build_server(session, call), token, listener)
        thread = threading.Thread(target=http.run, name="mcp http", daemon=True)
        thread.start()
        bound = listener.getsockname()[1]
        sys.stderr.write(f"warren: mcp serve: listening on http://127.0.0.1:{bound}/mcp\n")
        sys.stderr.flush()
        try:
            await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
        finally:
            http.stop()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join)
            listener.close()
        if http.failure is not None:
            raise ConfigError(http.failure, source="mcp serve --http")


class _HttpThread:
    """uvicorn on its own asyncio loop in a thread. The app is built there: the SDK's session
    manager makes its anyio primitives for the loop that builds it."""

    def __init__(self, server: Server[Any], token: str, listener: socket.socket) -> None:
        self._server = server
        self._token = token
        self._listener = listener
        self._http: Any = None
        self._stopping = False
        self.failure: str | None = None
        """Why the HTTP server stopped by itself (it does not, unless it failed)."""

    def run(self) -> None:
        import asyncio

        try:
            asyncio.run(self._serve())
        except Exception as exc:  # reported by the session's thread, as one line
            self.failure = f"the HTTP server failed: {exc}"

    async def _serve(self) -> None:
        import uvicorn

        app = BearerToken(self._server.streamable_http_app(host="127.0.0.1"), self._token)
        config = uvicorn.Config(app, log_level="critical", lifespan="on")
        self._http = http = uvicorn.Server(config)
        if self._stopping:
            return
        await http.serve(sockets=[self._listener])
        if not self._stopping and not http.started:
            self.failure = "the HTTP server did not start"

    def stop(self) -> None:
        """Ask uvicorn to finish (from any thread)."""
        self._stopping = True
        if self._http is not None:
            self._http.should_exit = True
