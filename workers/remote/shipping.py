"""Shipping the workspace snapshot to the nodes through Ray's object store (`SnapshotShipper`).

Before each remote run the pool asks the worker's process to `prepare_run`
(`workers.child.RemoteHostProcess`), which lands here:

1. the coordinator builds the snapshot (`workers.remote.snapshot.SnapshotBuilder.build`:
   incremental, unchanged files are not read again) of the workspace as the subagent may see
   it; runs dispatched together share one build (one that started after they asked: each
   still sees the workspace as it was at its dispatch or later), not one each in a row;
2. each blob goes into the object store once per session (`ray.put`, its `ObjectRef` kept by
   digest), the manifest once per workspace state;
3. the worker's actor gets the manifest and the refs of the blobs its node is not known to
   have (`NodeWorker.sync`): it fetches only the ones its node's cache lacks, then mirrors the
   manifest into its view directory, which its idle worker's sandbox shows read-only at the
   workspace path (a bind of the directory: the worker sees the update). A node that has
   synced a manifest is known to hold its blobs, so later runs there send no refs at all;
   a worker whose view shows the manifest already (only `sync` writes a view, and its
   worker's sandbox has it read-only) is not called at all.

The run's outcome names the snapshot it saw (`SubagentOutcome.snapshot`: the manifest id's
first 12 hex digits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from workers.remote.process import RemoteProcess, resolve
from workers.remote.snapshot import Manifest, SnapshotBuilder

__all__ = ["SnapshotShipper", "short_id"]


def short_id(manifest: Manifest) -> str:
    """How results name a snapshot: the first 12 hex digits of its id."""
    return manifest.id[:12]


class SnapshotShipper:
    """One session's snapshots on their way to the nodes (see the module docstring)."""

    def __init__(self, builder: SnapshotBuilder, ray: Callable[[], Any]) -> None:
        """`ray()`: the connected `ray` module (`RayCluster.ray`), asked for at first use."""
        self._builder = builder
        self._ray = ray
        self._refs: dict[str, Any] = {}
        """digest -> the ObjectRef of its bytes (kept for the session)."""
        self._manifest: tuple[Manifest, Any] | None = None
        """The last manifest and its ObjectRef."""
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

    async def current(self) -> tuple[Manifest, Any]:
        """The workspace's manifest now and its ObjectRef, its new blobs in the object store.

        **Errors:** `OSError` with the snapshot's one-line reason (a cap, a file that keeps
        changing...).
        """
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            from workers.remote.snapshot import SnapshotError

            if self._manifest is not None and self._served >= ticket:
                return self._manifest  # built after this call began
            serves = self._asked  # every call so far began before this build
            try:
                self.builds += 1
                manifest = await self._builder.build()
                if self._manifest is not None and self._manifest[0].id == manifest.id:
                    self._served = serves
                    return self._manifest
                new = sorted(
                    {e.digest for e in manifest.entries if e.digest and e.digest not in self._refs}
                )
                await trio.to_thread.run_sync(self._put, new)
            except SnapshotError as exc:
                raise OSError(f"the workspace snapshot failed: {exc.message}") from exc
            self._manifest = (manifest, self._ray().put(manifest))
            self._served = serves
            return self._manifest

    def _put(self, digests: list[str]) -> None:
        ray = self._ray()
        for digest in digests:
            self._refs[digest] = ray.put(self._builder.read_blob(digest))
            self.blobs_put += 1

    async def prepare(self, process: RemoteProcess) -> str:
        """Bring `process`'s view up to date (it is idle); the snapshot's short id.

        **Errors:** `OSError` when the snapshot cannot be built or the node cannot take it.
        """
        manifest, ref = await self.current()
        if process.synced == manifest.id:
            return short_id(manifest)
        node = process.placement.node_id
        known = self._on_node.setdefault(node, set())
        digests = {e.digest for e in manifest.entries if e.digest is not None}
        offered = {d: self._refs[d] for d in digests - known}
        try:
            lacking: list[str] = await resolve(process.actor.sync.remote(ref, offered))
            if lacking:  # its cache lost blobs it was known to hold: send those too
                lacking = await resolve(
                    process.actor.sync.remote(ref, {d: self._refs[d] for d in lacking})
                )
        except Exception as exc:  # the node's SnapshotError, a lost actor: one line
            raise OSError(f"{process.where} could not take the snapshot: {_line(exc)}") from exc
        if lacking:
            raise OSError(f"{process.where} still lacks {len(lacking)} blobs of the snapshot")
        known |= digests
        process.synced = manifest.id
        return short_id(manifest)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
