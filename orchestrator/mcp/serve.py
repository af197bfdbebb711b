"""`warren mcp serve`: Warren's tools as an MCP server over stdio, with the floor and the policy.

Another client (Claude Desktop, an IDE, another agent) gets sandboxed tools: each call goes
through a `Session`'s pipeline exactly as a model's call does (schema, hooks, the repository's
policy, the audit log, the output cap), and runs in the session's sandboxed tool hosts. There is
no one to ask, so a call the policy would ask about is denied, and says so; `--permission-mode`
and `--allowed-tools` widen what runs, as for `warren -p`.

The served tools are the file and shell tools (`SERVED`); a tool is marked `readOnlyHint` when
its facts say it only reads. Nothing is printed on stdout but the protocol: the SDK's
`stdio_server` points fd 1 at stderr while it serves, and the session's own output goes nowhere.
"""

from __future__ import annotations

import io
from typing import Any, Final

import mcp_types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from orchestrator.messages import ImageBlock, TextBlock, ToolResultBlock
from orchestrator.session import Session, SessionConfig, SessionParts, open_session

__all__ = ["SERVED", "build_server", "serve_stdio"]

SERVED: Final = ("Read", "Glob", "Grep", "LS", "Edit", "MultiEdit", "Write", "NotebookEdit", "Bash")
"""The tools offered to clients (dispatch_agent needs a model and is not offered)."""


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


def build_server(session: Session) -> Server[Any]:
    """An MCP server whose tools are `session`'s served tools."""
    tools = [t for t in (_tool(session, name) for name in SERVED) if t is not None]

    async def list_tools(
        ctx: Any, params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: Any, params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        if params.name not in SERVED:
            names = ", ".join(t.name for t in tools)
            text = f"No such tool: {params.name}. Tools: {names}"
            return mcp_types.CallToolResult(
                content=[mcp_types.TextContent(text=text)], is_error=True
            )
        result = await session.call_tool(params.name, dict(params.arguments or {}))
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
    parts = SessionParts(
        dirs=parts.dirs, runner=parts.runner, mcp=parts.mcp, stdout=io.StringIO()
    )
    async with open_session(config, parts) as session:
        server = build_server(session)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
