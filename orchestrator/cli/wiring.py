"""The concrete parts of a session: the one place the orchestrator meets workers/ and sandbox/.

`session_parts()` is what `warren -p` and `warren demo` open a `Session` with: every tool call
in a sandboxed tool host, `dispatch_agent`'s subagents in the worker pool, and every model
request (main agent and subagents) through one `ModelBroker` holding the session's `Limits`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

from orchestrator.session import SessionParts

if TYPE_CHECKING:
    from orchestrator.limits import Limits
    from orchestrator.model.base import ModelClient
    from orchestrator.pipeline import ToolRunner
    from orchestrator.session_policy import SessionPolicy
    from orchestrator.subagents import SubagentRunner
    from orchestrator.tools.base import ToolContext
    from workers.broker import ModelBroker

__all__ = ["open_broker", "open_subagents", "open_tool_hosts", "session_parts"]


def session_parts() -> SessionParts:
    """The sandboxed tool hosts, the worker pool and the broker."""
    return SessionParts(runner=open_tool_hosts, subagents=open_subagents, broker=open_broker)


def open_tool_hosts(
    ctx: ToolContext, policy: SessionPolicy
) -> AbstractAsyncContextManager[ToolRunner]:
    """Where every tool call of the main agent runs: the sandboxed tool hosts, with the
    policy's read masks and protected paths added to the floor."""
    from sandbox.spec import SandboxSpec
    from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner, open_tool_runner

    spec = SandboxSpec(
        limits=HOST_LIMITS,
        extra_deny_read=policy.deny_read(),
        extra_protected=policy.protected(),
        extra_home_allow=policy.home_allow(),
    )
    return open_tool_runner(
        spawner=SandboxedSpawner(spec, read_denied=policy.read_denied()), prestart=ctx
    )


def open_broker(model: ModelClient, limits: Limits) -> ModelBroker:
    """The session's one model client: its concurrency and budgets hold for every agent."""
    from workers.broker import BrokerLimits, ModelBroker

    return ModelBroker(
        model,
        limits=BrokerLimits(
            max_concurrent_requests=limits.max_concurrent_requests,
            max_cost_usd=limits.max_budget_usd,
            max_output_tokens=limits.max_output_tokens_total,
        ),
    )


@asynccontextmanager
async def open_subagents(
    ctx: ToolContext, policy: SessionPolicy, model: ModelClient, limits: Limits
) -> AsyncIterator[SubagentRunner]:
    """The worker pool behind dispatch_agent: at most `limits.max_subagents` sandboxed
    workers, their model requests through the session's broker (one is made if the session
    has none, so subagents are always held to the limits)."""
    from sandbox.spec import SandboxSpec
    from workers.broker import ModelBroker
    from workers.pool import PoolOptions, open_worker_pool
    from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner

    broker = model if isinstance(model, ModelBroker) else open_broker(model, limits)
    spec = SandboxSpec(
        limits=HOST_LIMITS,
        extra_deny_read=policy.deny_read(),
        extra_protected=policy.protected(),
        extra_home_allow=policy.home_allow(),
    )
    async with open_worker_pool(
        broker=broker,
        workspace=ctx.workspace,
        cwd=ctx.cwd,
        extra_roots=ctx.extra_roots,
        spawner=SandboxedSpawner(spec, read_denied=policy.read_denied()),
        options=PoolOptions(
            max_workers=limits.max_subagents, thinking_budget=limits.max_thinking_tokens
        ),
    ) as pool:
        yield pool
