"""The first whole scan of a session, in a child process (`python -m
orchestrator.changes.scan_child`).

The first scan reads, hashes and packs every file of the writable roots (seconds on a large
tree): in the coordinator's process it would hold the GIL against the trio loop on the way to
the first model request. `TreeState.start` runs this module instead, with the same Python,
at `nice` 10 from its first instruction (through the system's `nice`: its interpreter's start
and imports, a few hundred milliseconds of CPU, would otherwise compete at the coordinator's
priority with the session's way to its first model request), handing it the session's
inotify descriptor: inotify watches belong to the
descriptor, not to the process, so the watches the child puts on each directory (before
listing it) keep reporting to the coordinator after the child has exited. What the child saw
comes back on its stdout (a temporary file): one JSON document, read only when a writing call
first needs it.

The walk is `tree_state.scan` itself: the same rules (no link followed, regular files only,
`MAX_SCAN_ENTRIES` and `MAX_NEW_BYTES_PER_SCAN` bounds).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.tree_state import (
    SCAN_NICENESS,
    Entry,
    Key,
    load_index,
    scan,
    watch_directory,
)

__all__ = ["main", "run"]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Scan as `spec` says (roots, store, known entries' index files, skip, inotify fd); what
    the coordinator adopts: entries, watches, completeness."""
    roots = [Path(root) for root in spec["roots"]]
    store = ContentStore(Path(spec["store"]))
    known: dict[Key, Entry] = {}
    for root, index in spec["indexes"]:
        known.update(load_index(Path(root), Path(index)))
    fd = int(spec.get("inotify", -1))
    watches: list[tuple[int, str, str]] = []
    degraded = [fd < 0]

    def on_dir(root: Path, prefix: str, dir_fd: int) -> None:
        if degraded[0]:
            return
        wd = watch_directory(fd, dir_fd)
        if wd < 0:
            degraded[0] = True
        else:
            watches.append((wd, str(root), prefix))

    with store.packing():
        result = scan(roots, store, known, on_dir=on_dir, skip=[Path(p) for p in spec["skip"]])
    return {
        "complete": result.complete,
        "degraded": degraded[0],
        "watches": watches,
        "entries": [
            [root, rel, e.kind, e.mode, e.sha, e.target, *e.stamp]
            for (root, rel), e in result.entries.items()
        ],
    }


def main() -> None:
    with contextlib.suppress(OSError):
        if os.nice(0) < SCAN_NICENESS:  # started without the system's `nice`
            os.nice(SCAN_NICENESS - os.nice(0))
    try:
        answer = run(json.loads(sys.argv[1]))
    except Exception as exc:  # the coordinator falls back to its own scan
        sys.stderr.write(f"change scan failed: {exc}\n")
        raise SystemExit(1) from None
    sys.stdout.write(json.dumps(answer, separators=(",", ":")))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
