"""A subagent's MCP tools, served by the coordinator: the servers are never started per worker.

An agent type that names MCP tools (`mcp__time__get_current_time`, or `mcp__time` for all of a
server's) gets their specs in its `RunAgent`, as the coordinator lists them when the agent is
dispatched (after waiting for the named servers to finish starting: they start with the
session, and a dispatch can come before they are up). The worker's pipeline treats such a tool
like any other: its PreToolUse hooks and its permission are asked of the coordinator, whose
decider (`DispatchAgentTool`) decides with the session's policy, as for the main agent (MCP
tools default to ask). When that answer allows a call, the decider `grant`s it here; the
worker then sends `McpCall`, and `AgentMcp.call` runs it only against a grant for that tool and
that very input (each grant serves one call), so a worker that skips the permission ask, or
names a tool its agent type lacks, gets an error result and nothing runs. The call itself is
the main agent's: the coordinator's `McpTool` validates the input against the server's schema,
calls the server (within its `timeout_s`), and the result is capped to the session's output
limit before it goes down the pipe. A refused call is reported as a denial (`PermissionDecided`)
for the session's audit log.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import pydantic
import structlog

from orchestrator.agents.types import MCP_PREFIX, AgentType
from orchestrator.aio import closing_iter
from orchestrator.events import Event, PermissionDecided
from orchestrator.mcp.deferred import DeferredMcp
from orchestrator.mcp.tool import split_name
from orchestrator.model.base import ToolSpec
from orchestrator.text import truncate_middle
from orchestrator.tools.base import ToolContext, ToolOutput
from orchestrator.tools.registry import ToolRegistry

__all__ = ["AgentMcp", "agent_mcp"]


@dataclass(eq=False)
class AgentMcp:
    """One subagent's MCP tools (`orchestrator.agents.types.SubagentMcp`)."""

    tools: ToolRegistry
    """The session's, MCP tools among them."""
    agent_type: AgentType
    """The subagent's type: which MCP tools it may call."""
    ctx: ToolContext
    _: KW_ONLY
    output_cap: int
    """Characters of a call's result that go down the pipe."""
    emit: Callable[[Event], None]
    """Where a refused call is reported (`PermissionDecided`)."""
    _specs: list[ToolSpec] = field(init=False)
    _grants: defaultdict[str, int] = field(init=False, default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        self._specs = [
            ToolSpec(t.name, t.description, t.input_schema())
            for t in self.tools
            if t.name.startswith(MCP_PREFIX) and self.agent_type.allows(t.name)
        ]

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def grant(self, tool: str, input: dict[str, Any]) -> None:
        """The permission answer allowed this call: one `call` with this input may run."""
        self._grants[_key(tool, input)] += 1

    def _take(self, tool: str, input: dict[str, Any]) -> bool:
        key = _key(tool, input)
        if self._grants.get(key, 0) <= 0:
            return False
        self._grants[key] -= 1
        return True

    async def call(self, tool: str, input: dict[str, Any]) -> ToolOutput:
        """Run one allowed call (see the module docstring); an error result otherwise."""
        found = self.tools.get(tool) if self.agent_type.allows(tool) else None
        if found is None or not tool.startswith(MCP_PREFIX):
            return self._refuse(
                tool, input, f"{tool} is not one of the tools of a {self.agent_type.name} agent."
            )
        if not self._take(tool, input):
            return self._refuse(
                tool, input, f"This {tool} call was not allowed by the coordinator; it was not run."
            )
        try:
            parsed = found.parse_input(input)
            refusal = await found.validate(parsed, self.ctx)
            if refusal is not None:
                return ToolOutput(content=refusal, is_error=True)
            output: ToolOutput | None = None
            async with closing_iter(found.call(parsed, self.ctx)) as events:
                async for event in events:
                    if isinstance(event, ToolOutput):
                        output = event
                        break
        except pydantic.ValidationError as exc:
            why = f"The input of this {tool} call is invalid: {exc}"
            return ToolOutput(content=why, is_error=True)
        except Exception as exc:  # a bug in the tool: the subagent's call fails, not the session
            return ToolOutput(content=f"{tool} failed unexpectedly: {exc}", is_error=True)
        if output is None:
            return ToolOutput(content=f"{tool} returned no result.", is_error=True)
        return self._capped(output)

    def _capped(self, output: ToolOutput) -> ToolOutput:
        content = output.content
        if isinstance(content, str):
            return ToolOutput(
                content=truncate_middle(content, self.output_cap), is_error=output.is_error
            )
        blocks = [
            b.model_copy(update={"text": truncate_middle(b.text, self.output_cap)})
            if b.type == "text"
            else b
            for b in content
        ]
        return ToolOutput(content=blocks, is_error=output.is_error)

    def _refuse(self, tool: str, input: dict[str, Any], why: str) -> ToolOutput:
        structlog.get_logger().warning("subagent mcp call refused", tool=tool, why=why)
        self.emit(
            PermissionDecided(
                tool_use_id="",
                tool=tool,
                input=input,
                decision="deny",
                rule=f"agent type {self.agent_type.name}",
                answered_by="policy",
                message=why,
            )
        )
        return ToolOutput(content=why, is_error=True)


def _key(tool: str, input: dict[str, Any]) -> str:
    return tool + "\0" + json.dumps(input, sort_keys=True, default=str)


async def agent_mcp(
    tools: ToolRegistry,
    agent_type: AgentType,
    ctx: ToolContext,
    *,
    output_cap: int,
    emit: Callable[[Event], None],
) -> AgentMcp | None:
    """The MCP tools of a subagent of `agent_type`, once the servers it names have finished
    starting (started now if the session had not started them yet; each within its
    `startup_timeout_s`); None when it names none, or the session has no MCP servers."""
    named = {
        (split_name(t) or (t[len(MCP_PREFIX) :], ""))[0]
        for t in agent_type.tools
        if t.startswith(MCP_PREFIX)
    }
    sources = [s for s in tools.sources if isinstance(s, DeferredMcp)]
    if not named or not sources:
        return None
    for source in sources:
        servers = await source.ready()
        if servers is not None:
            await servers.wait_started(names=named)
    return AgentMcp(tools, agent_type, ctx, output_cap=output_cap, emit=emit)
