"""The Ray pool backend: read-only subagents on a Ray cluster, everything else at home.

`open_ray_subagents` opens the session's `SubagentRunner` for `--pool ray`: two
`workers.pool.WorkerPool`s, unchanged in how they serve a worker (model requests through the
coordinator's broker, admission, asks, hooks, MCP, events, limits, cancellation), one whose
workers are Ray actors (`RaySpawner`) and the local one. `RaySubagents.run` sends:

- read-only agent types to the cluster (up to 64 at once);
- writable and scoped-writer types to the local pool (at most 10): their changes would have
  to come back as a patch applied with a conflict check, which is not built; the user is told
  once, the first time;
- everything to the local pool once the cluster is unreachable, at start or later (one line);
- a run whose remote worker died or could not be started (`worker_crashed`,
  `worker_unavailable`) once more, on another node: a read-only agent changed nothing, so
  running it again is safe. A second failure is the run's outcome (an error tool_result).

Cancelling a run cancels its remote work: the pool sends `Cancel` on the worker's stdin and kills
the worker on its node if it does not stop; closing the backend kills every actor this
session made (they are owned by its Ray driver, not detached, so they also die with it).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import structlog
import trio

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentOutcome,
    SubagentPermission,
    SubagentRequest,
)
from sandbox.spec import SandboxSpec
from workers.agent_worker import DEFAULT_TOOLS
from workers.broker import ModelBroker
from workers.child import HostProcess, HostSpawner, RemoteHostProcess
from workers.pool import PoolOptions, WorkerPool, open_worker_pool
from workers.remote.cluster import RayCluster
from workers.remote.process import RaySpawner

__all__ = ["RETRYABLE", "RaySubagents", "open_ray_subagents"]

RETRYABLE = frozenset({"worker_crashed", "worker_unavailable"})
"""Outcomes of a remote run that are tried once more, on another node."""


class RaySubagents:
    """The `SubagentRunner` of a session with the Ray pool (see the module docstring)."""

    def __init__(
        self,
        *,
        cluster: RayCluster,
        spawner: RaySpawner,
        remote: WorkerPool,
        local: WorkerPool,
        notice: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.spawner = spawner
        self.remote = remote
        self.local = local
        self._notice = notice
        self._said: set[str] = set()
        self._lost = False
        self._log = structlog.get_logger().bind(component="ray_pool")

    def _say_once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._notice(line)

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome:
        """Run one subagent where it belongs (module docstring).

        **Cancellation:** as `WorkerPool.run`: the worker (remote or local) is told to stop,
        then killed; `Cancelled` propagates.
        **Errors:** none: failures are outcomes.
        """
        if request.agent_type.writable:
            self._say_once(
                "writable",
                "warren: writable subagents run in the local pool; the Ray pool runs "
                "read-only ones",
            )
            return await self.local.run(request, on_event=on_event, permission=permission)
        if not await self._usable():
            return await self.local.run(request, on_event=on_event, permission=permission)
        outcome = await self.remote.run(request, on_event=on_event, permission=permission)
        if outcome.reason not in RETRYABLE:
            return outcome
        if not await self.cluster.reachable():
            self._fall_back(f"the Ray cluster at {self.cluster.address} became unreachable")
            return await self.local.run(request, on_event=on_event, permission=permission)
        if outcome.worker_node is not None:
            lost_on = outcome.worker_node
            self.spawner.avoid_where(lost_on, outcome.result)
            # The retry must not take a warm worker of that node either (one placed there
            # before the loss was known).
            self.remote.shun(lambda p: _runs_on(p, lost_on))
        self._log.warning(
            "remote subagent retried", agent_id=request.agent_id, reason=outcome.reason
        )
        self._say_once(
            f"retry:{request.agent_id}",
            f"warren: subagent {request.agent_id} lost its worker"
            + (f" on {outcome.worker_node}" if outcome.worker_node else "")
            + "; it runs again on another node",
        )
        again = await self.remote.run(request, on_event=on_event, permission=permission)
        return replace(again, duration_s=again.duration_s + outcome.duration_s)

    async def _usable(self) -> bool:
        if self._lost:
            return False
        if await self.cluster.wait():
            return True
        self._fall_back(self.cluster.failure or "the Ray cluster is not connected")
        return False

    def _fall_back(self, why: str) -> None:
        self._lost = True
        self._say_once("fallback", f"warren: {why}; subagents run in the local pool")


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@asynccontextmanager
async def open_ray_subagents(
    *,
    address: str,
    broker: ModelBroker,
    workspace: Path,
    cwd: Path | None = None,
    extra_roots: tuple[Path, ...] = (),
    spec: SandboxSpec,
    local_spawner: HostSpawner | None = None,
    remote_options: PoolOptions | None = None,
    local_options: PoolOptions | None = None,
    tools: str = DEFAULT_TOOLS,
    notice: Callable[[str], None] = _stderr_line,
    prestart: int = 0,
    read_denied: Callable[[str], bool] | None = None,
    snapshot: bool = True,
) -> AsyncIterator[RaySubagents]:
    """The Ray backend for one session: connects to the cluster at `address` in the
    background (the session starts meanwhile), opens the remote and the local pools.

    `spec`: the session's sandbox (masks, protected paths, limits), applied on each node.
    `remote_options`/`local_options`: each pool's size and limits (the local one stays at
    most 10). `notice`: where the backend's one-line notices go (default: stderr).
    `prestart`: remote workers started as soon as the cluster is connected (warm for the
    first dispatch). `read_denied`: the policy's `Read` deny rules, whose files stay out of
    the snapshot. `snapshot`: ship a snapshot of the workspace, and of each of `extra_roots`
    (`--add-dir`, each read-only at its own path on the node, as in the local pool), to the
    nodes before each run (default); False: the nodes read them at their own paths (a shared
    file system).

    **Cancellation:** leaving the block stops every worker: each remote one on its node,
    then its actor is killed; then the driver disconnects. All shielded and bounded.
    """
    cluster = RayCluster(address)
    options = remote_options or PoolOptions()
    prepare = None
    if snapshot:
        from workers.remote.shipping import SnapshotShipper
        from workers.remote.snapshot import SnapshotBuilder

        builders = [
            SnapshotBuilder(root, read_denied=read_denied, deny_read=spec.extra_deny_read)
            for root in (workspace, *extra_roots)
        ]
        prepare = SnapshotShipper(builders, lambda: cluster.ray).prepare
    spawner = RaySpawner(cluster, spec=spec, stop_grace_s=options.stop_grace_s, prepare=prepare)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cluster.connect)
        try:
            async with (
                open_worker_pool(
                    broker=broker,
                    workspace=workspace,
                    cwd=cwd,
                    extra_roots=extra_roots,
                    spawner=spawner,
                    options=options.model_copy(update={"start": "lazy"}),
                    tools=tools,
                ) as remote,
                open_worker_pool(
                    broker=broker,
                    workspace=workspace,
                    cwd=cwd,
                    extra_roots=extra_roots,
                    spawner=local_spawner,
                    options=local_options,
                    tools=tools,
                ) as local,
            ):
                runner = RaySubagents(
                    cluster=cluster, spawner=spawner, remote=remote, local=local, notice=notice
                )
                if prestart:

                    async def warm() -> None:
                        if await cluster.wait():
                            remote.start_soon(min(prestart, options.max_workers))

                    nursery.start_soon(warm)
                yield runner
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()
            nursery.cancel_scope.cancel()


def _runs_on(process: HostProcess, where: str) -> bool:
    return isinstance(process, RemoteHostProcess) and process.where == where
