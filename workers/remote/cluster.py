"""The coordinator's connection to a Ray cluster, and `warren doctor --pool ray`'s node check.

Ray is optional (`warren[ray]`) and slow to import (about 2 s), so it is imported only here and
only in a worker thread, when a session with the Ray pool starts: `RayCluster.connect` runs in
the background while the session starts, and the first dispatch waits for it only if it has
not finished.

What is never done:

- start a cluster: an address is required (`policies.pool.PoolConfig.address`: `RAY_ADDRESS`
  or `[pool] address`, `HOST:PORT` for the cluster's GCS or `ray://HOST:PORT` for Ray Client);
- send anything of this machine to the cluster. `ray.init` under `uv run` would package the
  current directory and upload it to the cluster (Ray's uv integration: 3.57 MiB of the
  user's workspace, measured); it is turned off before ray is imported
  (`RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`), no `runtime_env` (working_dir, py_modules) is given and
  a runtime-env hook named in the environment is skipped. The nodes run the Warren installed
  on them (deploy/ray/README.md);
- pass the cluster's credentials on: Ray reads `RAY_AUTH_MODE` and `RAY_AUTH_TOKEN` from this
  process's environment; Warren never logs them, and every sandbox's environment is built
  from an allowlist (sandbox/env.py) that does not name them.

An unreachable cluster is a value (`RayCluster.failure`, one line), never a traceback: the
backend then runs subagents in the local pool and says so once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
from dataclasses import dataclass
from typing import Any

import trio

__all__ = [
    "CONNECT_TIMEOUT_S",
    "NodeReport",
    "RayCluster",
    "check_nodes",
    "import_ray",
]

CONNECT_TIMEOUT_S = 30.0
"""Seconds `ray.init` may take before the cluster counts as unreachable."""

_QUIET_RAY = {
    # `uv run` must not make Ray package and upload the current directory.
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return host.strip("[]"), int(port)


def import_ray() -> Any:
    """The `ray` module, imported with its uv packaging and usage stats off (blocking: call
    it in a thread). Its types are not Warren's: it is `Any` here and typed at our edges."""
    for name, value in _QUIET_RAY.items():
        os.environ.setdefault(name, value)
    # Set by the user or not, the uv integration must stay off: it uploads the workspace.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    try:
        import ray
    except ImportError as exc:
        raise ModuleNotFoundError(
            "the Ray pool needs Ray: install Warren with its `ray` extra (warren[ray])"
        ) from exc
    return ray


class RayCluster:
    """One session's connection to the cluster (`ray.init` is per process: one session per
    process holds it). `connect` in the background, `wait` before the first use."""

    def __init__(self, address: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self.connect_timeout_s = connect_timeout_s
        self.failure: str | None = None
        """Why the cluster cannot be used (one line), once `connect` failed."""
        self._ray: Any = None
        self._owned = True
        """Whether `connect` made this process's connection (and `aclose` ends it)."""
        self._done = trio.Event()

    @property
    def ray(self) -> Any:
        """The connected `ray` module (only after `wait` returned True)."""
        assert self._ray is not None, "RayCluster.wait() first"
        return self._ray

    async def connect(self) -> None:
        """Connect to the cluster; never raises: a failure is `failure`. Bounded by
        `connect_timeout_s` (a hung `ray.init` is left to its thread).

        **Cancellation:** `failure` says so and `wait` returns False.
        """
        try:
            with trio.move_on_after(self.connect_timeout_s) as scope:
                if not await self.reachable():
                    self.failure = f"the Ray cluster at {self.address} is unreachable"
                    return
                self._ray = await trio.to_thread.run_sync(self._init, abandon_on_cancel=True)
            if scope.cancelled_caught:
                self.failure = (
                    f"the Ray cluster at {self.address} did not answer within "
                    f"{self.connect_timeout_s:g} s"
                )
        except Exception as exc:  # Ray's own exceptions: one line, never a traceback
            self.failure = (
                f"cannot connect to the Ray cluster at {self.address}: "
                + (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            )
        finally:
            if self._ray is None and self.failure is None:
                self.failure = f"the connection to the Ray cluster at {self.address} was cancelled"
            self._done.set()

    def _init(self) -> Any:
        ray = import_ray()
        if self.address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
            raise ModuleNotFoundError(
                "a ray:// address needs Ray Client: install Warren with its `ray-client` "
                "extra (warren[ray-client]), or give the head's GCS address HOST:PORT"
            )
        if ray.is_initialized():  # this process is a driver already (an embedding host)
            self._owned = False
            return ray
        ray.init(
            address=self.address,
            log_to_driver=False,  # the nodes' logs stay on the nodes
            logging_level="ERROR",
            include_dashboard=False,
            namespace="warren",
            _skip_env_hook=True,  # a RAY_RUNTIME_ENV_HOOK could add a working_dir
        )
        return ray

    async def wait(self) -> bool:
        """Wait for `connect` to end; True when the cluster can be used."""
        await self._done.wait()
        return self._ray is not None

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        """Whether the cluster's address takes a TCP connection (a cheap liveness check: the
        head's GCS, or the Ray Client server)."""
        host, port = _host_port(self.address)

        def probe() -> bool:
            try:
                with socket.create_connection((host, port), timeout=timeout_s):
                    return True
            except OSError:
                return False

        return await trio.to_thread.run_sync(probe, abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Disconnect (bounded); the actors this driver owns die with its connection."""
        if self._ray is None or not self._owned:
            return
        ray, self._ray = self._ray, None
        with trio.CancelScope(shield=True), trio.move_on_after(10), contextlib.suppress(Exception):
            await trio.to_thread.run_sync(ray.shutdown, abandon_on_cancel=True)


@dataclass(frozen=True)
class NodeReport:
    """One node's floor, as `warren doctor --pool ray` prints it."""

    node_id: str
    ip: str
    ok: bool
    detail: str
    """What the probe found: the failed checks and the fix, or how long the proof took."""

    def render(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"  [{mark}] node {self.node_id[:8]} ({self.ip}): {self.detail}"


def check_nodes(address: str, timeout_s: float = 60.0) -> list[NodeReport]:
    """Prove the floor on every alive node of the cluster at `address` (a task pinned to each
    node runs the same probe as `warren doctor`), blocking. A node whose probe does not answer
    within `timeout_s` is reported as failed.

    **Errors:** `ConnectionError` with one line when the cluster cannot be reached. The
    address is checked by `policies.pool` (the same forms Ray accepts).
    """

    async def connect() -> RayCluster:
        cluster = RayCluster(address)
        await cluster.connect()
        return cluster

    cluster = trio.run(connect)
    if cluster.failure is not None:
        raise ConnectionError(cluster.failure)
    ray = cluster.ray
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from workers.remote.actor import prove_node

        probe = ray.remote(num_cpus=0, max_retries=0)(prove_node)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        pending = {
            node["NodeID"]: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote()
            for node in nodes
        }
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=timeout_s)
        reports = []
        for node in nodes:
            node_id, ip = node["NodeID"], node.get("NodeManagerAddress", "?")
            ref = pending[node_id]
            if ref not in ready:
                reports.append(NodeReport(node_id, ip, False, f"no answer in {timeout_s:g} s"))
                continue
            try:
                ok, detail = ray.get(ref)
            except Exception as exc:
                ok, detail = False, f"the probe failed: {str(exc).strip()[:300]}"
            reports.append(NodeReport(node_id, ip, bool(ok), str(detail)))
        return reports
    finally:
        trio.run(cluster.aclose)
