"""An MCP server's tool as a Warren tool: `mcp__<server>__<tool>`.

The call runs in the coordinator (it touches no workspace itself: the server does, inside its
own sandbox) and goes through the same pipeline as every built-in tool: schema validation
against the server's JSON schema, hooks, the policy (family `external`: asked unless a rule
such as `mcp__github` or `mcp__github__create_issue` allows it), the audit log and the output
cap. A tool its server marks `readOnlyHint` counts as read-only only when the policy says
`[mcp] allow_read_only_tools = true` and the server runs with the workspace read-only: the
server's word alone approves nothing.

`McpTools` is the registry's view of the servers: the tools of every server that has listed
them, and, for a name of a server still starting, a tool that waits for it (a call the model
makes from a listing it saw in an earlier session is not refused while the server starts).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import jsonschema
import mcp_types
from pydantic import ConfigDict

from orchestrator.mcp.servers import McpCallFailed, McpServers
from orchestrator.messages import ImageBlock, ImageSource, TextBlock
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts

__all__ = ["McpInput", "McpTool", "McpTools", "split_name", "tool_name"]

PREFIX = "mcp__"
_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def tool_name(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of `mcp__server__tool`; server names hold no `__` (policies.mcp)."""
    if not name.startswith(PREFIX):
        return None
    server, sep, tool = name[len(PREFIX) :].partition("__")
    return (server, tool) if sep and server and tool else None


class McpInput(ToolInput):
    """Whatever the server's schema says: checked against it in `McpTool.validate`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def arguments(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class McpTool(Tool[McpInput]):
    """One tool of one server (its `info` None while the server is still starting)."""

    name: ClassVar[str] = "mcp"
    input_model: ClassVar[type[ToolInput]] = McpInput
    description: ClassVar[str] = "A tool of an MCP server."
    facts: ClassVar[ToolFacts] = ToolFacts(family="external", runs_in_coordinator=True)

    def __init__(
        self, servers: McpServers, server: str, tool: str, info: mcp_types.Tool | None
    ) -> None:
        self.servers = servers
        self.server = server
        self.tool = tool
        self.info = info
        self.name = tool_name(server, tool)  # type: ignore[misc]
        text = (info.description if info is not None else None) or f"{tool} ({server})"
        self.description = f"{text.strip()}\n\n(MCP server: {server})"  # type: ignore[misc]

    def input_schema(self) -> dict[str, Any]:
        schema = self.info.input_schema if self.info is not None else None
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return {"type": "object", "additionalProperties": True}
        return schema

    def is_read_only(self, input: McpInput) -> bool:
        hints = self.info.annotations if self.info is not None else None
        config = self.servers.config(self.server)
        return bool(
            self.servers.read_only_tools
            and hints is not None
            and hints.read_only_hint
            and config is not None
            and not config.write
        )

    async def validate(self, input: McpInput, ctx: ToolContext) -> str | None:
        if self.info is None:
            return None  # checked by the server once it is up
        try:
            jsonschema.validate(input.arguments(), self.input_schema())
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path) or "(input)"
            return f"InputValidationError: {self.name}: {where}: {exc.message}"
        except jsonschema.SchemaError as exc:
            return f"MCP server {self.server!r} gave {self.tool!r} a broken schema: {exc.message}"
        return None

    async def call(
        self, input: McpInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        try:
            result = await self.servers.call(self.server, self.tool, input.arguments())
        except McpCallFailed as exc:
            yield ToolOutput(content=str(exc), is_error=True, summary=str(exc).split(". ")[0])
            return
        yield to_output(result)

    def render_use(self, input: McpInput) -> str:
        args = json.dumps(input.arguments(), ensure_ascii=False)
        return f"{self.name}({args[:200]})"


def to_output(result: mcp_types.CallToolResult) -> ToolOutput:
    """A tool result's content as the model's tool_result: text and images as they are,
    resources as their text (or a note for binary ones), structured content as JSON when
    nothing else came back."""
    blocks: list[TextBlock | ImageBlock] = []
    for item in result.content:
        match item:
            case mcp_types.TextContent():
                blocks.append(TextBlock(text=item.text))
            case mcp_types.ImageContent() if item.mime_type in _IMAGE_TYPES:
                source = ImageSource(media_type=item.mime_type, data=item.data)
                blocks.append(ImageBlock(source=source))
            case mcp_types.EmbeddedResource():
                resource = item.resource
                if isinstance(resource, mcp_types.TextResourceContents):
                    blocks.append(TextBlock(text=f"[resource {resource.uri}]\n{resource.text}"))
                else:
                    blocks.append(TextBlock(text=f"[binary resource {resource.uri}]"))
            case mcp_types.ResourceLink():
                blocks.append(TextBlock(text=f"[resource link {item.uri}: {item.name}]"))
            case _:
                kind = getattr(item, "type", type(item).__name__)
                blocks.append(TextBlock(text=f"[{kind} content not shown]"))
    if not blocks and result.structured_content is not None:
        blocks.append(TextBlock(text=json.dumps(result.structured_content, ensure_ascii=False)))
    if not blocks:
        blocks.append(TextBlock(text="(no content)"))
    if all(isinstance(b, TextBlock) for b in blocks):
        text = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
        return ToolOutput(content=text, is_error=result.is_error)
    return ToolOutput(content=list(blocks), is_error=result.is_error)


class McpTools:
    """The registry's view of the servers (`ToolRegistry` consults it for `mcp__` names)."""

    def __init__(self, servers: McpServers) -> None:
        self.servers = servers
        self._built: dict[str, McpTool] = {}
        self._version = -1

    @property
    def version(self) -> int:
        return self.servers.version

    def listed(self) -> list[McpTool]:
        """The tools of every server that has listed them."""
        if self._version != self.servers.version:
            self._version = self.servers.version
            self._built = {
                tool_name(server, info.name): McpTool(self.servers, server, info.name, info)
                for server, info in self.servers.tools()
            }
        return list(self._built.values())

    def get(self, name: str) -> McpTool | None:
        """A listed tool, or one of a configured server not listed yet (it waits for it)."""
        self.listed()
        if name in self._built:
            return self._built[name]
        parts = split_name(name)
        if parts is None or parts[0] not in self.servers.names():
            return None
        status, _, _ = self.servers.status(parts[0])
        return McpTool(self.servers, parts[0], parts[1], None) if status != "ready" else None
