"""Shipping the workspace snapshot to the nodes through Ray's object store (`SnapshotShipper`).

Before each remote run the pool asks the worker's process to `prepare_run`
(`workers.child.RemoteHostProcess`), which lands here:

1. the coordinator builds the snapshot (`workers.remote.snapshot.SnapshotBuilder.build`:
   incremental, unchanged files are not read again) of the workspace as the subagent may see
   it, and one of each extra root (`--add-dir`) the session has; runs dispatched together
   share one build (one that started after they asked: each still sees the workspace as it
   was at its dispatch or later), not one each in a row;
2. each blob goes into the object store once per session (`ray.put`, its `ObjectRef` kept by
   digest), each manifest once per state of its root;
3. the worker's actor gets the manifests (a `Shipment`) and the refs of the blobs its node is
   not known to have (`NodeWorker.sync`): it fetches only the ones its node's cache lacks,
   then mirrors each manifest into its view directory, which its idle worker's sandbox shows
   read-only at that root's path (a bind of the directory: the worker sees the update). A
   node that has synced a manifest is known to hold its blobs, so later runs there send no
   refs at all; a worker whose views show the shipment already (only `sync` writes a view,
   and its worker's sandbox has it read-only) is not called at all.

The run's outcome names the snapshot it saw (`SubagentOutcome.snapshot`, `short_id`: the
first 12 hex digits of the manifest's id, or with extra roots of the shipment's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from workers.remote.process import RemoteProcess, resolve
from workers.remote.snapshot import Manifest, SnapshotBuilder

__all__ = ["Shipment", "SnapshotShipper", "short_id"]


@dataclass(frozen=True)
class Shipment:
    """One state of the roots a remote subagent is shown: a manifest per root (the
    workspace's first, then each extra root's, in the views' order) and their ObjectRefs."""

    manifests: tuple[Manifest, ...]
    refs: tuple[Any, ...]

    @property
    def id(self) -> str:
        """The workspace manifest's id; with extra roots, the sha256 of all the ids."""
        if len(self.manifests) == 1:
            return self.manifests[0].id
        return hashlib.sha256("\n".join(m.id for m in self.manifests).encode()).hexdigest()


def short_id(shipment: Shipment) -> str:
    """How results name a snapshot: the first 12 hex digits of its id."""
    return shipment.id[:12]


class SnapshotShipper:
    """One session's snapshots on their way to the nodes (see the module docstring)."""

    def __init__(self, builders: Sequence[SnapshotBuilder], ray: Callable[[], Any]) -> None:
        """`builders`: the workspace's, then one per extra root. `ray()`: the connected `ray`
        module (`RayCluster.ray`), asked for at first use."""
        self._builders = tuple(builders)
        self._ray = ray
        self._refs: dict[str, Any] = {}
        """digest -> the ObjectRef of its bytes (kept for the session)."""
        self._shipment: Shipment | None = None
        """The last shipment."""
        self._on_node: dict[str, set[str]] = {}
        """node id -> digests its cache is known to hold."""
        self._lock = trio.Lock()
        self._asked = 0
        """Calls of `current` so far."""
        self._served = 0
        """Calls of `current` that the last build (started after them) answers."""
        self.builds = 0
        """Snapshots built so far (tests: runs dispatched together share one)."""
        self.blobs_put = 0
        """Blobs put into the object store so far (tests: unchanged files are not re-sent)."""

    async def current(self) -> Shipment:
        """The roots' manifests now and their ObjectRefs, their new blobs in the object store.

        **Errors:** `OSError` with the snapshot's one-line reason (a cap, a file that keeps
        changing...).
        """
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            from workers.remote.snapshot import SnapshotError

            if self._shipment is not None and self._served >= ticket:
                return self._shipment  # built after this call began
            serves = self._asked  # every call so far began before this build
            try:
                self.builds += 1
                manifests = [await builder.build() for builder in self._builders]
                last = self._shipment
                if last is not None and [m.id for m in last.manifests] == [
                    m.id for m in manifests
                ]:
                    self._served = serves
                    return last
                new = {
                    e.digest: builder
                    for builder, manifest in zip(self._builders, manifests, strict=True)
                    for e in manifest.entries
                    if e.digest and e.digest not in self._refs
                }
                await trio.to_thread.run_sync(self._put, new)
            except SnapshotError as exc:
                raise OSError(f"the workspace snapshot failed: {exc.message}") from exc
            ray = self._ray()
            self._shipment = Shipment(tuple(manifests), tuple(ray.put(m) for m in manifests))
            self._served = serves
            return self._shipment

    def _put(self, new: dict[str, SnapshotBuilder]) -> None:
        ray = self._ray()
        for digest in sorted(new):
            self._refs[digest] = ray.put(new[digest].read_blob(digest))
            self.blobs_put += 1

    async def prepare(self, process: RemoteProcess) -> str:
        """Bring `process`'s views up to date (it is idle); the snapshot's short id.

        **Errors:** `OSError` when the snapshot cannot be built or the node cannot take it.
        """
        shipment = await self.current()
        if process.synced == shipment.id:
            return short_id(shipment)
        node = process.placement.node_id
        known = self._on_node.setdefault(node, set())
        digests = {e.digest for m in shipment.manifests for e in m.entries if e.digest}
        offered = {d: self._refs[d] for d in digests - known}
        try:
            lacking: list[str] = await resolve(process.actor.sync.remote(offered, *shipment.refs))
            if lacking:  # its cache lost blobs it was known to hold: send those too
                lacking = await resolve(
                    process.actor.sync.remote(
                        {d: self._refs[d] for d in lacking}, *shipment.refs
                    )
                )
        except Exception as exc:  # the node's SnapshotError, a lost actor: one line
            raise OSError(f"{process.where} could not take the snapshot: {_line(exc)}") from exc
        if lacking:
            raise OSError(f"{process.where} still lacks {len(lacking)} blobs of the snapshot")
        known |= digests
        process.synced = shipment.id
        return short_id(shipment)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
