"""What runs on a Ray node: `NodeWorker`, the actor holding one pool worker, and `prove_node`.

The coordinator's `RaySpawner` (workers/remote/process.py) creates one `NodeWorker` per pool
worker. At `start` the actor proves its node's floor with the same probe `warren doctor` runs
(bwrap with user namespaces, read-only root, no network, no capabilities...); a node without
one refuses the work and says why. Then it starts the same `python -m workers.agent_worker`
under the node's floor, read-only: the workspace is the node's snapshot view of the
coordinator's workspace (`view`), shown at the coordinator's workspace path so tool results
name the user's paths (`sandbox.spec.WorkspaceRoot.source`); without a view (a file system
the nodes share), the workspace path itself, read-only. The session's extra roots
(`--add-dir`) are shown the same way, each from a view of its own (`view_names`) at its own
path, read-only.

The worker's protocol bytes do not pass through the actor when it can make a direct
connection to the coordinator (workers/remote/channel.py): once the actor has connected and
checked the coordinator's proof, the connected socket itself becomes the worker's protocol
stdin and stdout (passed into the sandbox like its pipes would be,
`open_sandboxed_process(stdio_socket=...)`), and the actor closes its own copy, so the
worker is its only holder: it reads and writes the very line protocol it would on pipes, and
can reach nothing else through it (the connection is made; its sandbox has no network to
make another). The actor keeps the worker's stderr and exit status, which `read` (a long
poll) brings back over Ray; a `read` that fails tells the coordinator the actor is lost.
Without a direct connection the actor relays over Ray: `write` to the worker's stdin
(numbered, so writes the coordinator sends without waiting go in order whatever thread runs
them), `read` of what the worker wrote on stdout and stderr, with its exit status at the
end. `relayed` counts the stdout and stdin bytes that went through the actor. The
worker's sandbox is measured here (`usage`: `sandbox.limits.tree_usage`, its /proc on this
node), killed here (`kill`) and stopped here (`stop`: end of stdin, the sandbox's SIGTERM,
grace, SIGKILL, reaping). Model calls, permission asks, hooks and transcripts are the
coordinator's: nothing in the actor holds a key or decides anything.

Ray runs the actor's methods on its threads; the sandbox code is trio, so the actor runs one
trio loop on a thread of its own and each method is a `trio.from_thread.run` into it.
Actors are owned by the coordinator's driver (not detached): they die with it.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import trio

from sandbox.limits import tree_usage
from sandbox.scratch import PRIVATE_SCRATCH_ENV
from sandbox.spec import SandboxSpec, WorkspaceRoot

__all__ = [
    "MAX_BUFFER_BYTES",
    "NodeWorker",
    "cache_root",
    "mount_point_problem",
    "prove_node",
    "view_names",
]

MAX_BUFFER_BYTES = 4 * 1024**2
"""Bytes of a worker's output held on the node before it is read (then its pipe fills)."""


def prove_node() -> tuple[bool, str]:
    """Prove this node's floor (`sandbox.probe.probe_floor`, what `warren doctor` runs): True
    and how long it took, or False and what failed with its fix. Runs as a Ray task on each
    node for `warren doctor --pool ray`, and in each `NodeWorker` before it takes work."""
    from sandbox.probe import probe_floor

    return _verdict(trio.run(probe_floor))


def _verdict(report: Any) -> tuple[bool, str]:
    if report.proven:
        return True, f"floor proven in {report.duration_ms:.0f} ms (bwrap {report.bwrap_version})"
    failed = [f"{check.name}: {check.detail}" for check in report.checks if not check.ok]
    fixes = [f"{d.message} (fix: {d.fix})" for d in report.diagnoses]
    return False, "the sandbox floor is not proven: " + (
        "; ".join(failed + fixes) or "the probe found no floor"
    )


def cache_root() -> Path:
    """Where this node keeps snapshot blobs and the actors' views: `WARREN_RAY_CACHE`, else
    `$XDG_CACHE_HOME/warren/ray` (`~/.cache/warren/ray`). Kept across sessions: blobs are
    content-addressed, so a later session sends only what changed."""
    explicit = os.environ.get("WARREN_RAY_CACHE", "")
    if explicit and Path(explicit).is_absolute():
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "warren" / "ray"


def view_names(view: str, roots: int) -> list[str]:
    """The views of a worker whose first view is `view`, one per root it is shown (the
    workspace first, then each extra root): `view`, `view-r1`, `view-r2`..."""
    return [view, *(f"{view}-r{i}" for i in range(1, roots))]


def mount_point_problem(workspace: Path) -> str | None:
    """Why the coordinator's workspace path cannot be where the snapshot is shown on this node
    (bwrap makes a missing mount point only on a tmpfs: the sandbox's private /tmp), or None."""
    if workspace.is_dir() or workspace.is_relative_to("/tmp"):
        return None
    if workspace.exists():
        return f"{workspace} exists on this node and is not a directory"
    return (
        f"the workspace path {workspace} does not exist on this node, so the snapshot cannot "
        "be mounted there: create it (an empty directory) on every node, or run Warren from "
        "a workspace under /tmp"
    )


class _Relay:
    """The trio side of a `NodeWorker`: the worker's sandbox and its pipes, run on the actor's
    own trio thread. Apart from the actor class because Ray runs an actor that has any
    coroutine method as an asyncio actor, one call at a time on its event loop: a pending
    `read` would then hold up every other call."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._views: list[tuple[Path, int]] = []
        """This actor's snapshot views (`cache_root()/mounts/NAME`), one per root it shows
        (the workspace first), each with its claim (`NodeCache.claim_view`), held for the
        actor's life; none without a snapshot."""
        self._process: Any = None
        self._out = bytearray()
        self._err = bytearray()
        self._out_eof = self._err_eof = False
        self._returncode: int | None = None
        self._changed = trio.Event()
        self._next_seq = 0
        self._stop = trio.Event()
        self._stopped = trio.Event()
        self._channel: trio.SocketStream | None = None
        """The direct connection to the coordinator, until the worker took it."""
        self.relayed = 0
        """Bytes of the worker's stdin and stdout that went through this actor (over Ray)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, ready), name="warren-node-worker", daemon=True
        )
        self._thread.start()
        ready.wait()

    async def _main(self, ready: threading.Event) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            ready.set()
            await trio.sleep_forever()

    def release_view(self) -> None:
        """Remove the views and let go of their claims (at the worker's stop), then collect
        the node's cache when one is due."""
        from workers.remote.snapshot import NodeCache

        views, self._views = self._views, []
        if not views:
            return
        cache = NodeCache(cache_root())
        try:
            for view, claim in views:
                cache.release_view(view, claim)
        finally:
            cache.collect_when_due()

    @property
    def process(self) -> Any:
        """The worker's `SandboxProcess`, once started."""
        return self._process

    @property
    def views(self) -> list[Path]:
        """The views, the workspace's first (empty without a snapshot)."""
        return [view for view, _ in self._views]

    def call(self, afn: Any, *args: Any) -> Any:
        """Run `afn(*args)` on the trio thread and return its result (from a Ray thread)."""
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def call_sync(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def start(self, start: dict[str, Any]) -> dict[str, Any]:
        from sandbox.probe import probe_floor

        ok, detail = _verdict(await probe_floor())
        if not ok:
            return {"ok": False, "detail": detail}
        paths = [Path(start["workspace"]), *(Path(p) for p in start.get("extra_roots") or ())]
        sources: list[Path | None] = [None] * len(paths)
        if start.get("view"):
            for path in paths:
                problem = mount_point_problem(path)
                if problem is not None:
                    return {"ok": False, "detail": problem}
            from workers.remote.snapshot import NodeCache, SnapshotError

            cache = NodeCache(cache_root())
            try:
                with cache.using():
                    for name in view_names(start["view"], len(paths)):
                        view = cache.view_path(name)
                        self._views.append((view, cache.claim_view(view)))
            except (OSError, SnapshotError) as exc:
                self.release_view()
                return {"ok": False, "detail": f"the snapshot view on this node: {exc}"}
            sources = list(self.views)
        spec = SandboxSpec.model_validate(start["spec"])
        # The workspace first. sandbox/argv.py mounts outer paths first, so where two roots
        # nest (an extra root inside the workspace, or holding it) the inner one is shown
        # from its own view.
        roots = tuple(
            WorkspaceRoot(path=path, mode="ro", source=source)
            for path, source in zip(paths, sources, strict=True)
        )
        # The floor gives the worker its own /tmp and /dev/shm, emptied after each run.
        values = {**spec.env.values, "PYTHONDONTWRITEBYTECODE": "1", PRIVATE_SCRATCH_ENV: "1"}
        spec = spec.model_copy(
            update={
                "workspaces": roots,
                "env": spec.env.model_copy(update={"values": values}),
            }
        ).read_only()
        # The node's own interpreter and Warren, not the coordinator's paths.
        argv = [sys.executable, *start["argv"][1:]]
        channel = "not offered"
        if start.get("channel"):
            from workers.remote.channel import connect

            self._channel, channel = await connect(start["channel"])
        try:
            assert self._nursery is not None
            self._process = await self._nursery.start(self._run, spec, argv, Path(start["cwd"]))
        except Exception as exc:  # SandboxError, OSError: the node's message, one line
            return {"ok": False, "detail": f"the worker's sandbox did not start: {exc}"}
        finally:
            if self._channel is not None:  # the worker holds it now (or it did not start)
                held, self._channel = self._channel, None
                await held.aclose()
        return {"ok": True, "pid": self._process.pid, "detail": detail, "channel": channel}

    async def _run(
        self,
        spec: SandboxSpec,
        argv: list[str],
        cwd: Path,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        from sandbox.run import open_sandboxed_process

        socket = None if self._channel is None else self._channel.socket.fileno()
        try:
            async with (
                open_sandboxed_process(
                    spec, argv, cwd=cwd, stderr="pipe", private_pipes=True, stdio_socket=socket
                ) as process,
                trio.open_nursery() as nursery,
            ):
                task_status.started(process)
                if process.stdout is not None:
                    nursery.start_soon(self._pump, process.stdout, self._out, "out")
                else:  # on the direct connection: nothing of it comes here
                    self._out_eof = True
                nursery.start_soon(self._pump, process.stderr, self._err, "err")
                nursery.start_soon(self._reap, process)
                await self._stop.wait()
                if process.stdin is not None:
                    await process.stdin.aclose()
                nursery.cancel_scope.cancel()
        finally:
            if self._process is not None:
                self._returncode = self._process.returncode
            self._out_eof = self._err_eof = True
            self._stopped.set()
            self._wake()

    async def _pump(self, stream: Any, buffer: bytearray, name: str) -> None:
        try:
            while True:
                while len(buffer) >= MAX_BUFFER_BYTES:
                    await self._changed.wait()
                data = await stream.receive_some(65536)
                if not data:
                    break
                if name == "out":
                    self.relayed += len(data)
                buffer += data
                self._wake()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            if name == "out":
                self._out_eof = True
            else:
                self._err_eof = True
            self._wake()

    async def _reap(self, process: Any) -> None:
        self._returncode = await process.wait()
        self._wake()

    async def read(self, max_bytes: int) -> tuple[bytes, bytes, bool, bool, int | None]:
        while True:
            ended = self._out_eof and self._err_eof and self._returncode is not None
            if self._out or self._err or ended or self._stopped.is_set():
                break
            await self._changed.wait()
        out, err = bytes(self._out[:max_bytes]), bytes(self._err[:max_bytes])
        del self._out[: len(out)], self._err[: len(err)]
        self._wake()  # room for the pumps
        out_eof = self._out_eof and not self._out
        err_eof = self._err_eof and not self._err
        done = out_eof and err_eof and (self._returncode is not None or self._stopped.is_set())
        return out, err, out_eof, err_eof, self._returncode if done else None

    async def write(self, seq: int, data: bytes) -> bool:
        while seq != self._next_seq:
            await self._changed.wait()
        try:
            stdin = None if self._process is None else self._process.stdin
            if stdin is None:
                return False
            await stdin.send_all(data)
            self.relayed += len(data)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            self._next_seq += 1
            self._wake()

    async def stop(self, timeout_s: float) -> int | None:
        self._stop.set()
        with trio.move_on_after(timeout_s):
            await self._stopped.wait()
        return self._returncode

    def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()


class NodeWorker:
    """One pool worker on this node, as the coordinator drives it. Made into a Ray actor by
    `workers.remote.process` (`ray.remote(NodeWorker)`), which calls `start` first. Its
    methods run on Ray's threads (no coroutine methods here: see `_Relay`)."""

    def __init__(self) -> None:
        self._relay = _Relay()

    def _call(self, afn: Any, *args: Any) -> Any:
        return self._relay.call(afn, *args)

    def start(self, start: dict[str, Any]) -> dict[str, Any]:
        """Prove the floor, then start the worker. `start`: `spec` (the coordinator's
        `SandboxSpec` as JSON: masks, protected paths, limits), `argv`, `workspace`, `cwd`,
        `extra_roots` (the session's `--add-dir` paths, shown read-only like the workspace),
        `view` (the name of this actor's first snapshot view, `view_names`, or None),
        `channel` (the coordinator's `ChannelOffer.for_actor`, or None). Returns `ok`,
        `detail` and, when ok, the worker's `pid` and `channel` ("direct", or why its stdio
        goes over Ray); plus where it runs."""
        import ray

        context = ray.get_runtime_context()
        where = {
            "node_id": context.get_node_id(),
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "actor_id": context.get_actor_id(),
            "actor_pid": os.getpid(),
            "runtime_env": dict(context.runtime_env or {}),
        }
        result: dict[str, Any] = self._call(self._relay.start, start)
        return {**result, **where}

    def relayed(self) -> int:
        """Bytes of the worker's stdin and stdout that went through this actor: none when its
        stdio is on the direct connection (tests)."""
        return self._relay.relayed

    def write(self, seq: int, data: bytes) -> bool:
        """Write `data` to the worker's stdin after write `seq - 1`; False when it is gone."""
        ok: bool = self._call(self._relay.write, seq, data)
        return ok

    def read(self, max_bytes: int) -> tuple[bytes, bytes, bool, bool, int | None]:
        """Wait for output: (stdout, stderr, stdout ended, stderr ended, exit status once
        both ended and the worker exited)."""
        got: tuple[bytes, bytes, bool, bool, int | None] = self._call(self._relay.read, max_bytes)
        return got

    def usage(self) -> tuple[int, float] | None:
        """Resident memory and CPU seconds of the worker's process tree on this node
        (`sandbox.limits.tree_usage`: the coordinator's modules are not imported here)."""
        process = self._relay.process
        if process is None or process.returncode is not None:
            return None
        return tree_usage(process.pid)

    def sync(self, offered: dict[str, Any], *manifests: Any) -> list[str]:
        """Mirror `manifests` (`workers.remote.snapshot.Manifest`s, one per view: the
        workspace's, then each extra root's; Ray resolves them, being arguments of their own)
        into this actor's views, fetching from `offered`
        (digest -> ObjectRef) the blobs this node's cache lacks. The worker is idle meanwhile.
        Returns the digests still lacking (not offered): nothing is synced then.

        **Errors:** `SnapshotError` (a blob with another sha256, a name that cannot be
        written).
        """
        import ray

        from workers.remote.snapshot import NodeCache

        views = self._relay.views
        assert len(views) == len(manifests), "one manifest per view"
        cache = NodeCache(cache_root())
        with cache.using():  # no collection between `missing` and the views' last file
            missing = sorted({d for manifest in manifests for d in cache.missing(manifest)})
            lacking = [d for d in missing if d not in offered]
            if lacking:
                return lacking
            if missing:
                blobs = ray.get([offered[d] for d in missing])
                cache.add_blobs(dict(zip(missing, blobs, strict=True)))
            for manifest, view in zip(manifests, views, strict=True):
                cache.sync_view(manifest, view)
        return []

    def kill(self) -> None:
        """Kill the worker's sandbox now (SIGKILL)."""
        self._relay.call_sync(self._relay.kill)

    def stop(self, timeout_s: float) -> int | None:
        """Stop the worker (end of stdin, then the sandbox's SIGTERM, grace, SIGKILL) and
        return its exit status (None if it is still stopping after `timeout_s`); its views
        go (the blobs stay in the node's cache for the next session, up to its cap:
        `NodeCache.collect`)."""
        code: int | None = self._call(self._relay.stop, timeout_s)
        if code is not None:
            self._relay.release_view()
        return code
