"""`RaySpawner`: the pool's `HostSpawner` whose workers run on Ray nodes (`RemoteProcess`).

The worker pool (workers/pool.py) talks to each worker through a `HostProcess`: a pid, stdin,
stdout, stderr, an exit status, `wait` and `kill`. A `RemoteProcess` is that surface over a
`NodeWorker` actor (workers/remote/actor.py) relaying a worker process on its node, so the
pool serves a remote worker exactly as a local one: its model requests go through the
coordinator's broker, its asks to the coordinator's permission function, its events and
transcript stay here. Only bytes cross the cluster.

Costs: an actor call's round trip is about 1.4 ms here (several under load), and a
subagent's turn waits on four in a row (its model request, the response, its permission ask,
the reply). So a worker's stdio takes a direct TCP connection from its actor to the
coordinator when the cluster can reach this machine (workers/remote/channel.py: a listener per
start, a one-use token, nothing listening between starts), which the actor hands to the
worker itself as its stdin and stdout: its bytes never pass through the actor. Ray then only
places, starts, syncs, measures, kills and stops it, and brings its stderr and exit status
back on a long poll (`NodeWorker.read`), whose failure says the actor is lost. Without that
connection (Ray Client, a firewall) the bytes go over Ray, where nothing waits on a call per
line:

- writes are numbered and sent without waiting (the actor puts them back in order); their
  results are checked as they complete, and a failed one makes the next send fail;
- one long poll per worker (`NodeWorker.read`) brings stdout and stderr back together;
- a call's result wakes the trio loop from Ray's callback (`ObjectRef.future()`), with no
  thread per pending call.

Placement: each new worker goes to the alive node with the fewest of this session's workers,
never to a node that refused work (no floor) or lost a worker (`avoid`); Ray may still move it
(soft affinity) when that node is gone.
"""

from __future__ import annotations

import contextlib
import math
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
import trio

from sandbox.spec import SandboxSpec
from workers.child import HostLaunch, HostProcess
from workers.remote.channel import ChannelOffer, facing_address
from workers.remote.cluster import RayCluster

__all__ = ["ACTOR_CONCURRENCY", "RaySpawner", "RemoteProcess", "resolve"]

ACTOR_CONCURRENCY = 16
"""Threads of one `NodeWorker` actor: its long poll, writes in flight, usage, kill, stop."""

_READ_BYTES = 1024**2
_MAX_WRITES_IN_FLIGHT = 256
"""Writes sent and not yet acknowledged before a send waits for the oldest."""


async def resolve(ref: Any) -> Any:
    """The value of a Ray `ObjectRef`, waited for in trio: Ray's completion callback wakes the
    loop (no thread waits).

    **Cancellation:** stops waiting; the call goes on in the cluster.
    **Errors:** what `ray.get` raises (`RayActorError` when the actor died...).
    """
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = ref.future()

    def wake(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


@dataclass(frozen=True)
class Placement:
    """Where one worker runs."""

    node_id: str
    ip: str
    actor_id: str
    actor_pid: int
    """The actor's process on its node."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """The actor's Ray runtime environment: empty, since nothing is shipped with the job."""

    def describe(self) -> str:
        return f"node {self.node_id[:8]} ({self.ip})"


class _Inbound(trio.abc.ReceiveStream):
    """stdout or stderr of a remote worker: what its relay put here."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[bytes](math.inf)
        self._pending = b""

    def feed(self, data: bytes) -> None:
        if data:
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                self._send.send_nowait(data)

    def end(self) -> None:
        self._send.close()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._pending:
            try:
                self._pending = await self._receive.receive()
            except trio.EndOfChannel:
                return b""
        size = len(self._pending) if max_bytes is None else max_bytes
        data, self._pending = self._pending[:size], self._pending[size:]
        return data

    async def aclose(self) -> None:
        self._receive.close()


class _Outbound(trio.abc.SendStream):
    """stdin of a remote worker: each `send_all` is one numbered `NodeWorker.write`, sent
    without waiting for it; a write that failed makes the next send fail."""

    def __init__(self, process: RemoteProcess) -> None:
        self._process = process
        self._seq = 0
        self._in_flight = 0
        self._settled = trio.Event()
        self._failed = False
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        while self._in_flight >= _MAX_WRITES_IN_FLIGHT and not self._failed:
            await self._settled.wait()
        if self._closed or self._failed:
            raise trio.BrokenResourceError("the remote worker is gone")
        write = self._process.actor.write.options(concurrency_group="write")
        ref = write.remote(self._seq, bytes(data))
        self._seq += 1
        self._in_flight += 1
        self._process.nursery.start_soon(self._settle, ref)
        await trio.lowlevel.checkpoint()

    async def _settle(self, ref: Any) -> None:
        try:
            ok = await resolve(ref)
        except Exception:
            ok = False
        self._in_flight -= 1
        self._failed = self._failed or not ok
        self._settled.set()
        self._settled = trio.Event()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
        await trio.lowlevel.checkpoint()


class _ChannelOutbound(trio.abc.SendStream):
    """stdin of a remote worker over its direct connection; closing it ends the worker's
    stdin (the connection's sending half), its stdout stays readable."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.BrokenResourceError("the remote worker is gone")
        async with self._lock:
            try:
                await self._stream.send_all(data)
            except (trio.ClosedResourceError, OSError) as exc:
                raise trio.BrokenResourceError("the remote worker is gone") from exc

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        async with self._lock:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                await self._stream.send_eof()


class RemoteProcess:
    """A worker process on a Ray node, as the pool's `HostProcess` (and `RemoteHostProcess`)."""

    def __init__(
        self,
        actor: Any,
        placement: Placement,
        pid: int,
        nursery: trio.Nursery,
        prepare: Callable[[RemoteProcess], Any] | None = None,
        on_lost: Callable[[str], None] | None = None,
        channel: trio.SocketStream | None = None,
    ) -> None:
        """`prepare`: `RemoteHostProcess.prepare_run`'s work. `on_lost(node_id)`: told
        before the worker counts as exited when its actor is lost (the spawner then places
        the pool's replacement elsewhere). `channel`: the actor's direct connection, if it
        made one (else the stdio goes over Ray)."""
        self._on_lost = on_lost
        self.actor = actor
        self.placement = placement
        self.nursery = nursery
        self._pid = pid
        self._prepare = prepare
        self.channel = channel
        self._stdin: trio.abc.SendStream = (
            _Outbound(self) if channel is None else _ChannelOutbound(channel)
        )
        self._stdout = _Inbound()
        self._stderr = _Inbound()
        self._returncode: int | None = None
        self._exited = trio.Event()
        self.lost: str | None = None
        """Why the actor stopped answering (its node died...), when it did."""
        self.synced: str | None = None
        """The id of the snapshot manifest its view shows (workers/remote/shipping.py)."""

    # -- HostProcess ------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The worker's sandbox pid on its node (not a pid of this machine)."""
        return self._pid

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> trio.abc.ReceiveStream:
        return self._stderr

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def kill(self) -> None:
        """Kill the worker's sandbox on its node (sent, not waited for)."""
        if self._returncode is None:
            self.actor.kill.remote()

    # -- RemoteHostProcess -----------------------------------------------------------------

    @property
    def where(self) -> str:
        return self.placement.describe()

    async def usage(self) -> tuple[int, float] | None:
        if self._returncode is not None:
            return None
        try:
            got = await resolve(self.actor.usage.remote())
        except Exception:
            return None
        return None if got is None else (int(got[0]), float(got[1]))

    async def prepare_run(self) -> str | None:
        if self._prepare is None:
            return None
        snapshot: str | None = await self._prepare(self)
        return snapshot

    # -- the relay -------------------------------------------------------------------------

    async def relay(self) -> None:
        """Relay the worker's output until it has exited (or the actor is lost: the worker
        then counts as killed)."""
        try:
            if self.channel is None:
                await self._relay_over_ray()
            else:
                await self._relay_direct(self.channel)
        except Exception as exc:  # RayActorError and kin: the actor or its node is gone
            self.lost = f"its Ray actor on {self.where} is gone ({type(exc).__name__})"
            if self._on_lost is not None:
                self._on_lost(self.placement.node_id)
            structlog.get_logger().warning(
                "remote worker lost", where=self.where, error=str(exc).splitlines()[0][:300]
            )
            self._exit(-signal.SIGKILL)
        finally:
            self._stdout.end()
            self._stderr.end()
            if self.channel is not None:
                with trio.CancelScope(shield=True):
                    await self.channel.aclose()

    async def _relay_direct(self, stream: trio.SocketStream) -> None:
        """The worker's stdout from the direct connection (the worker writes it there itself)
        while a long poll of the actor brings its stderr and, once it ended, its exit status;
        the poll raises when the actor is lost (a connection may just hang then)."""
        drained = trio.Event()

        async def stdout() -> None:
            try:
                while data := await stream.receive_some(_READ_BYTES):
                    self._stdout.feed(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                self._stdout.end()
                drained.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stdout)
            err_open = True
            while True:
                _, err, _, err_eof, code = await resolve(self.actor.read.remote(_READ_BYTES))
                self._stderr.feed(err)
                if err_eof and err_open:
                    err_open = False
                    self._stderr.end()
                if code is not None:
                    break
            # Every copy of the socket was the worker's: what it wrote is on its way.
            with trio.move_on_after(2):
                await drained.wait()
            nursery.cancel_scope.cancel()
        self._exit(int(code))

    async def _relay_over_ray(self) -> None:
        """Long-poll the actor for output until the worker has exited."""
        out_open = err_open = True
        while True:
            out, err, out_eof, err_eof, code = await resolve(self.actor.read.remote(_READ_BYTES))
            self._stdout.feed(out)
            self._stderr.feed(err)
            if out_eof and out_open:
                out_open = False
                self._stdout.end()
            if err_eof and err_open:
                err_open = False
                self._stderr.end()
            if code is not None:
                self._exit(int(code))
                return

    def _exit(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
        self._exited.set()


@dataclass
class _Nodes:
    """This session's view of where its workers run."""

    workers: dict[str, int] = field(default_factory=dict)
    """Live workers per node id."""
    avoided: dict[str, str] = field(default_factory=dict)
    """Nodes not to place workers on, with why."""
    described: dict[str, str] = field(default_factory=dict)
    """Node ids by how `Placement.describe` names them."""


class RaySpawner:
    """Starts pool workers as `NodeWorker` actors on the cluster (read-only workers only:
    writable agent types stay in the local pool, workers/remote/backend.py)."""

    def __init__(
        self,
        cluster: RayCluster,
        *,
        spec: SandboxSpec,
        stop_grace_s: float = 2.0,
        prepare: Callable[[RemoteProcess], Any] | None = None,
        direct: bool = True,
    ) -> None:
        """`spec`: the session's sandbox (masks, protected paths, limits) that each node
        applies to its worker. `prepare(process)`: brings a worker's view up to date before a
        run and returns the snapshot id (workers/remote/shipping.py), each actor keeping a view
        of its own; None: the nodes read the workspace at its own path (a file system they
        share, and tests of the relay alone). `direct`: offer each worker's actor a direct
        connection for its stdio (workers/remote/channel.py); False: always over Ray."""
        self._cluster = cluster
        self.direct = direct
        """Whether the next worker's actor is offered a direct connection."""
        self._facing: str | None = None
        """This machine's address towards the cluster (`facing_address`), once known."""
        self._spec = spec
        self._stop_grace_s = stop_grace_s
        self._prepare = prepare
        self._nodes = _Nodes()
        self._actor_class: Any = None
        self.processes: list[RemoteProcess] = []
        """The live remote workers (tests and benchmarks)."""

    def avoid(self, node_id: str, why: str) -> None:
        """Place no more workers on `node_id` (it lost a worker, or has no floor)."""
        self._nodes.avoided[node_id] = why

    def avoid_where(self, where: str, why: str) -> None:
        """`avoid` the node a worker's `where` names (`RemoteProcess.where`)."""
        node_id = self._nodes.described.get(where)
        if node_id is not None:
            self.avoid(node_id, why)

    def _place(self) -> str | None:
        ray = self._cluster.ray
        alive = [str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")]
        usable = [n for n in alive if n not in self._nodes.avoided] or alive
        if not usable:
            return None
        return min(usable, key=lambda n: self._nodes.workers.get(n, 0))

    @asynccontextmanager
    async def __call__(self, launch: HostLaunch) -> AsyncIterator[HostProcess]:
        if launch.writable:
            raise OSError("the Ray pool runs read-only workers only")
        if not await self._cluster.wait():
            raise OSError(self._cluster.failure or "the Ray cluster is not connected")
        ray = self._cluster.ray
        try:  # Ray's errors (a cluster gone meanwhile) are the pool's start errors
            node = await trio.to_thread.run_sync(self._place)
            actor = self._create(node)
        except Exception as exc:
            raise OSError(f"no Ray actor could be placed: {_line(exc)}") from exc
        view = None if self._prepare is None else uuid.uuid4().hex
        offer = await self._offer()
        channel: trio.SocketStream | None = None
        try:
            async with trio.open_nursery() as accepting:
                if offer is not None:
                    accepting.start_soon(offer.accept)
                started = await resolve(
                    actor.start.remote(
                        {
                            "spec": self._spec.model_dump(mode="json"),
                            "argv": list(launch.argv),
                            "workspace": str(launch.workspace),
                            "extra_roots": [str(root) for root in launch.extra_roots],
                            "cwd": str(launch.cwd),
                            "view": view,
                            "channel": None if offer is None else offer.for_actor(),
                        }
                    )
                )
                accepting.cancel_scope.cancel()
            if offer is not None and offer.stream is not None:
                channel, offer.stream = offer.stream, None
                if started.get("channel") != "direct":  # it gave up waiting for the proof
                    await channel.aclose()
                    channel = None
        except BaseException as exc:
            _kill_actor(ray, actor)
            if isinstance(exc, Exception):
                raise OSError(f"its Ray actor failed to start: {_line(exc)}") from exc
            raise
        finally:
            if offer is not None:
                with trio.CancelScope(shield=True):
                    await offer.aclose()
                    if offer.stream is not None:
                        await offer.stream.aclose()
        placement = Placement(
            started["node_id"],
            started["ip"],
            started["actor_id"],
            started["actor_pid"],
            started["runtime_env"],
        )
        if offer is not None and channel is None and started["ok"]:
            structlog.get_logger().info(
                "remote worker relayed over Ray", why=started.get("channel", "")
            )
        if not started["ok"]:
            if channel is not None:
                await channel.aclose()
            _kill_actor(ray, actor)
            self.avoid(placement.node_id, started["detail"])
            raise OSError(f"{placement.describe()} refused the work: {started['detail']}")
        self._nodes.workers[placement.node_id] = self._nodes.workers.get(placement.node_id, 0) + 1
        self._nodes.described[placement.describe()] = placement.node_id
        try:
            async with trio.open_nursery() as nursery:
                process = RemoteProcess(
                    actor,
                    placement,
                    int(started["pid"]),
                    nursery,
                    prepare=self._prepare,
                    on_lost=lambda node: self.avoid(node, "it lost a worker's actor"),
                    channel=channel,
                )
                self.processes.append(process)
                nursery.start_soon(process.relay)
                try:
                    yield process
                finally:
                    with trio.CancelScope(shield=True):
                        await self._stop(process)
                    nursery.cancel_scope.cancel()
        finally:
            self.processes = [p for p in self.processes if p.actor is not actor]
            self._nodes.workers[placement.node_id] -= 1
            _kill_actor(ray, actor)

    async def _offer(self) -> ChannelOffer | None:
        """A direct connection's listener for one worker start, when the cluster can reach
        this machine (`facing_address`); None: its stdio goes over Ray."""
        if not self.direct:
            return None
        if self._facing is None:
            self._facing = facing_address(self._cluster.address) or ""
        if not self._facing:
            return None
        try:
            return await ChannelOffer.open(self._facing)
        except OSError as exc:
            structlog.get_logger().info("no listener for a direct relay", error=str(exc))
            return None

    async def _stop(self, process: RemoteProcess) -> None:
        """End of stdin, the sandbox's SIGTERM, grace and SIGKILL, on the node (bounded);
        also for a worker that has already exited (a crash, a kill, or the end of its input
        before this), whose actor still holds its snapshot view until its `stop` releases it.
        Only a lost actor is not asked (its node collects the view)."""
        if process.lost is not None:
            return
        with trio.move_on_after(3 * self._stop_grace_s + 5):
            with contextlib.suppress(Exception):
                await resolve(process.actor.stop.remote(2 * self._stop_grace_s + 2))
            await process.wait()

    def _create(self, node: str | None) -> Any:
        ray = self._cluster.ray
        if self._actor_class is None:
            from workers.remote.actor import NodeWorker

            # Writes wait in their own threads: a worker that stops reading its stdin must not
            # take the threads that read its output or kill it.
            self._actor_class = ray.remote(
                max_concurrency=ACTOR_CONCURRENCY, concurrency_groups={"write": 8}
            )(NodeWorker)
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        return self._actor_class.options(**options).remote()


def _kill_actor(ray: Any, actor: Any) -> None:
    """Kill an actor of ours (not detached, so its driver's end would too); a cluster already
    gone is no error here."""
    with contextlib.suppress(Exception):
        ray.kill(actor)


def _line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]
