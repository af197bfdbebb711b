"""The tools the coordinator serves a subagent, as its worker sees them: every call runs there.

The coordinator sends the specs of the tools it serves the run (`RunAgent.mcp_tools`): the MCP
tools the agent type may use, and `StructuredOutput` for a dispatch with an output schema
(orchestrator/agents/structured.py). Each becomes a `ForwardedMcpTool` in the run's registry,
named as its spec is (no `mcp__` prefix is assumed here), so the worker's pipeline treats it as
any tool: its hooks and its permission are asked upward, and once allowed, `call` sends a
`workers.protocol.McpCall` and yields the coordinator's `McpResult`. The servers, their
processes, the schema checks and the structured value all stay in the coordinator
(orchestrator/agents/mcp.py, structured.py); nothing of the MCP SDK is imported here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

from pydantic import ConfigDict

from orchestrator.model.base import ToolSpec
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts
from workers import protocol as wire

__all__ = ["ForwardedMcpTool", "McpAsker"]

McpAsker = Callable[[wire.McpCall], Awaitable[wire.McpResult]]
"""Sends a call (its `id` is replaced by a fresh one) and waits for the result."""


class _Arguments(ToolInput):
    """Whatever the server's schema says: the coordinator checks it against that schema."""

    model_config = ConfigDict(extra="allow", frozen=True)


class ForwardedMcpTool(Tool[_Arguments]):
    """One tool the coordinator serves (an MCP tool, StructuredOutput), run there for agent
    `agent_id`."""

    name: ClassVar[str] = "mcp"
    input_model: ClassVar[type[ToolInput]] = _Arguments
    description: ClassVar[str] = "A tool of an MCP server."
    facts: ClassVar[ToolFacts] = ToolFacts(family="external", runs_in_coordinator=True)

    def __init__(self, spec: ToolSpec, *, agent_id: str, ask: McpAsker) -> None:
        self.name = spec.name  # type: ignore[misc]
        self.description = spec.description  # type: ignore[misc]
        self._schema = spec.input_schema
        self._agent_id = agent_id
        self._ask = ask

    def input_schema(self) -> dict[str, Any]:
        return self._schema

    async def call(
        self, input: _Arguments, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        arguments = input.model_dump(mode="json", by_alias=True)
        result = await self._ask(
            wire.McpCall(id="", agent=self._agent_id, tool=self.name, input=arguments)
        )
        yield ToolOutput(content=result.content, is_error=result.is_error)

    def render_use(self, input: _Arguments) -> str:
        arguments = json.dumps(input.model_dump(mode="json"), ensure_ascii=False)
        return f"{self.name}({arguments[:200]})"
