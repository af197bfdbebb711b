"""A worker cannot call an MCP tool the coordinator did not allow it (attack test).

The coordinator side is real: `DispatchAgentTool` over a `WorkerPool`, the session's MCP
servers (`mcp-server-time` from PyPI, a real process speaking MCP to the real SDK). The worker
is `tests.workers.rogue_worker unasked-mcp` in the real worker's sandbox: it sends `McpCall`s
without a permission answer, for a tool its agent type lacks, and replays an allowed one. The
end-to-end path through a real worker and the CLI is in
tests/orchestrator/mcp/test_mcp_e2e.py.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from orchestrator.agents.dispatch_agent import DispatchAgentInput, DispatchAgentTool
from orchestrator.agents.types import SubagentEvent, SubagentUpdate
from orchestrator.calls.permissions import Allow, PermissionResult, headless_asker
from orchestrator.calls.plan import CallPlan
from orchestrator.cli.wiring import _plain_process
from orchestrator.events import PermissionDecided
from orchestrator.mcp.deferred import DeferredMcp
from orchestrator.mcp.servers import ServerProcess, open_mcp_servers
from orchestrator.messages import ContentBlock
from orchestrator.model.base import ModelRequest
from orchestrator.tools.base import ToolContext, ToolOutput
from orchestrator.tools.registry import ToolRegistry
from policies.mcp import McpServer
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    FunctionModel,
    agent,
    rogue_spawner,
    tools,
    workspace_at,
)
from tests.workers.agent_kit import text as text_turn
from workers.broker import ModelBroker
from workers.pool import PoolOptions, open_worker_pool

pytestmark = needs_sandbox

BIN = Path(sys.executable).parent
CLOCK = agent("clock", tools=("Read", "mcp__time__get_current_time"))


async def _allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
    return Allow(rule="test: allow")


@asynccontextmanager
async def _launch(name: str, server: McpServer) -> AsyncIterator[ServerProcess]:
    assert server.command is not None
    ctx = ToolContext(workspace=Path.cwd(), cwd=Path.cwd(), session_id="mcp")
    async with _plain_process((server.command, *server.args), {}, ctx) as process:
        yield process


async def test_a_worker_cannot_call_an_mcp_tool_it_was_not_allowed(tmp_path: Path) -> None:
    ws = workspace_at(tmp_path)
    config = McpServer(command=str(BIN / "mcp-server-time"), args=("--local-timezone", "UTC"))

    async def never(request: ModelRequest) -> list[ContentBlock]:
        return text_turn("unused")

    updates: list[SubagentUpdate] = []
    async with (
        DeferredMcp(
            lambda: open_mcp_servers({"time": (config, "test")}, _launch), ["time"]
        ).running() as servers,
        open_worker_pool(
            broker=ModelBroker(FunctionModel(never)),
            workspace=ws,
            spawner=rogue_spawner("unasked-mcp"),
            options=PoolOptions(max_workers=1, start="lazy"),
            tools=FACTORY,
        ) as pool,
    ):
        registry = ToolRegistry(list(tools("read_only")), [servers])
        tool = DispatchAgentTool(
            runner=pool,
            agent_types={"clock": CLOCK},
            tools=registry,
            permission=_allow,
            asker=headless_asker,
            on_update=updates.append,
        )
        ctx = ToolContext(workspace=ws, cwd=ws, session_id="s1")
        input = DispatchAgentInput(description="time", prompt="go", subagent_type="clock")
        outputs = [o async for o in tool.call(input, ctx) if isinstance(o, ToolOutput)]
    said = str(outputs[-1].content)
    assert "offered=['mcp__time__get_current_time']" in said
    assert "unasked error=True: This mcp__time__get_current_time call was not allowed" in said
    assert "other error=True: mcp__time__convert_time is not one of the tools" in said
    assert "permission allow=True" in said
    assert "granted error=False: {" in said and '"timezone": "UTC"' in said
    assert "replayed error=True: This mcp__time__get_current_time call was not allowed" in said
    denials = [
        u.event
        for u in updates
        if isinstance(u, SubagentEvent)
        and isinstance(u.event, PermissionDecided)
        and u.event.decision == "deny"
    ]
    assert len(denials) == 3  # each refused call is in the audit log's stream
