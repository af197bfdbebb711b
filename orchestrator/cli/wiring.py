"""The concrete parts of a session: the one place the orchestrator meets workers/ and sandbox/.

`session_parts()` is what `warren -p` and `warren demo` open a `Session` with: every tool call
in a sandboxed tool host, `dispatch_agent`'s subagents in the worker pool, and every model
request (main agent and subagents) through one `ModelBroker` holding the session's `Limits`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

from orchestrator.session.config import SessionParts
from orchestrator.session.later import LaterSubagents, LaterToolHosts

if TYPE_CHECKING:
    from orchestrator.agents.types import SubagentRunner
    from orchestrator.calls.pipeline import ToolRunner
    from orchestrator.calls.policy import SessionPolicy
    from orchestrator.limits import Limits
    from orchestrator.mcp.servers import McpServers, ServerProcess
    from orchestrator.mcp.transport import HostMessages
    from orchestrator.model.base import ModelClient
    from orchestrator.tools.base import ToolContext
    from policies.pool import PoolConfig
    from sandbox.host import SandboxHost
    from sandbox.spare import SpareSource
    from workers.broker import ModelBroker
    from workers.remote.cluster import NodeReport

__all__ = [
    "SCOPES_ENV",
    "ZYGOTE_ENV",
    "open_broker",
    "open_mcp",
    "open_subagents",
    "open_tool_hosts",
    "session_parts",
]

SCOPES_ENV = "WARREN_SCOPES"
"""`mount`: hold scoped writers to their scopes with mounts (a fresh worker each) even where
the kernel has Landlock (`PoolOptions.scopes`); for tests and for comparing the two."""


ZYGOTE_ENV = "WARREN_ZYGOTE"
"""`off`: every pool worker a fresh interpreter, none forked from the zygote
(`PoolOptions.zygote`); for comparing the two and as a way out."""


def session_parts(
    spares: SpareSource | None = None, host: SandboxHost | None = None
) -> SessionParts:
    """The sandboxed tool hosts, the worker pool, the broker and the MCP servers. In a
    session process of `warren server`: `spares`, the server's spare tool hosts, and `host`,
    the sandbox host the server detected when this session would detect the same (so the
    tool hosts do not detect it again on their way to the first call)."""
    runner = (
        open_tool_hosts
        if spares is None and host is None
        else partial(open_tool_hosts, spares=spares, host=host)
    )
    return SessionParts(
        runner=runner,
        subagents=open_subagents,
        broker=open_broker,
        mcp=open_mcp,
        spares=spares,  # the context probe's spare sandbox
        start_at_once=spares is not None,  # the warm server's session: nothing to import
    )


def open_tool_hosts(
    ctx: ToolContext,
    policy: SessionPolicy,
    *,
    spares: SpareSource | None = None,
    host: SandboxHost | None = None,
) -> AbstractAsyncContextManager[ToolRunner]:
    """Where every tool call of the main agent runs: the sandboxed tool hosts, with the
    policy's read masks and protected paths added to the floor; each adopted from `spares`
    when one there was started from exactly the recipe this session would use. They start
    once the session's first request is on its way, or at the first call or hook that needs
    them (`orchestrator.session.later`): neither their imports nor their start delay that request.
    A session of the warm server starts them at once (`session_parts`)."""

    def open_hosts() -> AbstractAsyncContextManager[ToolRunner]:
        from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner, open_tool_runner

        return open_tool_runner(
            spawner=SandboxedSpawner(
                policy.sandbox_spec(HOST_LIMITS),
                host=host,
                read_denied=policy.read_denied(),
                spares=spares,
            ),
            prestart=ctx,
        )

    return LaterToolHosts(open_hosts).running()


def open_broker(
    model: ModelClient,
    limits: Limits,
    client_for: Callable[[str], ModelClient] | None = None,
) -> ModelBroker:
    """The session's one model client: its concurrency and budgets hold for every agent,
    whichever model an agent type names (`client_for` makes that model's client)."""
    from workers.broker import BrokerLimits, ModelBroker

    return ModelBroker(
        model,
        limits=BrokerLimits(
            max_concurrent_requests=limits.max_concurrent_requests,
            max_cost_usd=limits.max_budget_usd,
            max_output_tokens=limits.max_output_tokens_total,
        ),
        client_for=client_for,
    )


@asynccontextmanager
async def open_subagents(
    ctx: ToolContext,
    policy: SessionPolicy,
    model: ModelClient,
    limits: Limits,
    pool: PoolConfig,
) -> AsyncIterator[SubagentRunner]:
    """The worker pool behind dispatch_agent, on `pool`'s backend: at most
    `limits.max_subagents` sandboxed workers, their model requests through the session's
    broker (one is made if the session has none, so subagents are always held to the
    limits); scoped writers confined with Landlock where the kernel has it, unless
    `WARREN_SCOPES=mount`.

    `ray` (workers/remote/backend.py): read-only subagents run as actors on the cluster at
    `pool.address` (up to 64 at once), under each node's floor with the session's masks;
    writable ones in the local pool (at most 10); all of them locally, with one line on
    stderr, when the cluster cannot be reached.

    A local pool opens once the session's first request is on its way, or at the first
    subagent (`orchestrator.session.later`); a Ray pool at once (a cluster that cannot be reached is
    said at start-up)."""
    if pool.backend == "ray" and pool.address is not None:
        async with _open_pool(ctx, policy, model, limits, pool) as runner:
            yield runner
        return
    later = LaterSubagents(lambda: _open_pool(ctx, policy, model, limits, pool))
    async with later.running():
        yield later


@asynccontextmanager
async def _open_pool(
    ctx: ToolContext,
    policy: SessionPolicy,
    model: ModelClient,
    limits: Limits,
    pool: PoolConfig,
) -> AsyncIterator[SubagentRunner]:
    """`open_subagents`' pool itself, opened when it is needed."""
    from workers.broker import ModelBroker
    from workers.pool import PoolOptions, open_worker_pool
    from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner

    broker = model if isinstance(model, ModelBroker) else open_broker(model, limits)
    spec = policy.sandbox_spec(HOST_LIMITS)
    spawner = SandboxedSpawner(spec, read_denied=policy.read_denied())
    options = PoolOptions(
        max_workers=max(1, min(limits.max_subagents, LOCAL_MAX_SUBAGENTS)),
        thinking_budget=limits.max_thinking_tokens,
        scopes="mount" if os.environ.get(SCOPES_ENV) == "mount" else "auto",
        zygote="off" if os.environ.get(ZYGOTE_ENV) == "off" else "auto",
    )
    if pool.backend == "ray" and pool.address is not None:
        from workers.remote.backend import open_ray_subagents

        async with open_ray_subagents(
            address=pool.address,
            broker=broker,
            workspace=ctx.workspace,
            cwd=ctx.cwd,
            extra_roots=ctx.extra_roots,
            spec=spec,
            local_spawner=spawner,
            remote_options=options.model_copy(update={"max_workers": max(1, limits.max_subagents)}),
            local_options=options,
            read_denied=policy.read_denied(),
            prestart=2,
        ) as runner:
            yield runner
        return
    async with open_worker_pool(
        broker=broker,
        workspace=ctx.workspace,
        cwd=ctx.cwd,
        extra_roots=ctx.extra_roots,
        spawner=spawner,
        options=options.model_copy(update={"max_workers": limits.max_subagents}),
    ) as workers:
        yield workers


LOCAL_MAX_SUBAGENTS = 10
"""Workers of the local pool, whatever the limits say (a Ray session's may say up to 64)."""


MCP_NICENESS = 10
"""How much lower than the coordinator's an MCP server's CPU priority is."""


def cluster_nodes(address: str) -> list[NodeReport]:
    """Each alive node of the Ray cluster at `address` with its floor (`warren doctor
    --pool ray`).

    **Errors:** `ConnectionError` when the cluster cannot be reached; `ModuleNotFoundError`
    without Ray installed.
    """
    from workers.remote.cluster import check_nodes

    return check_nodes(address)


def open_mcp(
    ctx: ToolContext,
    policy: SessionPolicy,
    *,
    notices: bool = True,
    host: HostMessages | None = None,
) -> AbstractAsyncContextManager[McpServers]:
    """The policy's MCP servers, started in the background: each stdio server in its own
    sandbox (the floor's masks and the policy's, the workspace read-only unless the server
    has `write = true`, no network unless it has `network = true` (then the host's), the
    scrubbed environment plus the server's `env`), or, for a `sandbox = false` server of the
    user's or the managed policy, as a plain process with the same short environment; an
    `sdk` server through `host`, the SDK host that runs it (`--input-format stream-json`). One
    line on stderr for each server that fails, is reached over HTTP or has the network
    (unless not `notices`: `warren doctor` reports states itself)."""
    import shutil
    import sys

    from orchestrator.mcp.servers import open_mcp_servers
    from policies.mcp import McpServer
    from workers.child import HostLaunch
    from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner, host_environment

    floor_proven = policy.engine.floor_proven
    spawner = SandboxedSpawner(policy.sandbox_spec(HOST_LIMITS), read_denied=policy.read_denied())

    # Servers start while the session starts, on the same cores: niced, so the coordinator's
    # own start-up (and its first model request) goes first. Once up, a server runs while
    # the coordinator waits for it, so the niceness costs its calls nothing.
    nice = shutil.which("nice")
    background = (nice, "-n", str(MCP_NICENESS)) if nice is not None else ()

    @asynccontextmanager
    async def launch(name: str, server: McpServer) -> AsyncIterator[ServerProcess]:
        assert server.command is not None
        argv = (*background, server.command, *server.args)
        if not server.sandbox:
            async with _plain_process(argv, {**host_environment(), **server.env}, ctx) as proc:
                yield proc
            return
        if not floor_proven:
            raise RuntimeError("not started: the sandbox is not available (see `warren doctor`)")
        started = HostLaunch(
            role="read_write" if server.write else "read_only",
            argv=argv,
            workspace=ctx.workspace,
            extra_roots=ctx.extra_roots,
            cwd=ctx.cwd,
        )
        async with spawner.stdio(started, env=server.env, network=server.network) as process:
            yield process  # type: ignore[misc]

    servers = {name: (server, source) for name, server, source in policy.effective.mcp_servers}
    return open_mcp_servers(
        servers,
        launch,
        read_only_tools=policy.effective.mcp_read_only_tools,
        on_notice=(lambda line: print(line, file=sys.stderr)) if notices else None,
        host=host,
    )


@asynccontextmanager
async def _plain_process(
    argv: tuple[str, ...], env: dict[str, str], ctx: ToolContext
) -> AsyncIterator[ServerProcess]:
    """A server outside the floor (the user's own choice): its own session, stopped with its
    process group (`sandbox.process.child.open_child`: stdin closed, SIGTERM, SIGKILL)."""
    from sandbox.process.child import open_child

    async with open_child(argv, env=env, cwd=ctx.cwd) as process:
        yield process
