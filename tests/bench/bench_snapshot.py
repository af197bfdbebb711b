"""What the remote workspace snapshot costs on a 10,000-file git repository, in one run.

    .venv/bin/python tests/bench/bench_snapshot.py

Coordinator (`SnapshotBuilder`): the first build (git's listing in the read-only sandbox,
every file read and hashed), a build with nothing changed (the listing and a stat of each
file, nothing read), a build after one file changed; reading every blob back (`read_blob`).
Node (`NodeCache`): taking every blob in, the first `sync_view` (every file written), a sync
with nothing changed and one after one file changed. Wall and CPU time of this process (git's
sandbox is a child: its CPU is not counted), with the load average beside them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from workers.remote import snapshot  # noqa: E402
from workers.remote.snapshot import NodeCache, SnapshotBuilder  # noqa: E402

FILES = 10_000
PER_DIR = 20
T = TypeVar("T")


def make_repository(base: Path) -> Path:
    ws = base / "ws"
    ws.mkdir()
    for i in range(FILES):
        directory = ws / f"pkg{i // PER_DIR:03d}"
        directory.mkdir(exist_ok=True)
        (directory / f"m{i}.py").write_text(f"# module {i}\n" + "x = 1\n" * 40)
    (ws / ".gitignore").write_text("*.pyc\n")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(base)}
    for argv in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *argv], cwd=ws, env=env, check=True, capture_output=True)
    return ws


def timed(label: str, call: Callable[[], T]) -> T:
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"  {label:<44} {wall * 1000:8.1f} ms wall {cpu * 1000:8.1f} ms cpu")
    return result


def main() -> None:
    snapshot.RACY_NS = 0  # the files were just written: count them as settled
    base = Path(tempfile.mkdtemp(prefix="bench-snap-", dir="/var/tmp"))
    try:
        ws = make_repository(base)
        print(f"load average {os.getloadavg()[0]:.2f}; {FILES} files in {FILES // PER_DIR} dirs")
        builder = SnapshotBuilder(ws, read_denied=None)
        print("coordinator")
        first = timed("first build (reads every file)", lambda: trio.run(builder.build))
        reads = builder.reads
        timed("build, nothing changed", lambda: trio.run(builder.build))
        assert builder.reads == reads, "an unchanged build read files"
        (ws / "pkg000" / "m0.py").write_text("changed\n")
        changed = timed("build, one file changed", lambda: trio.run(builder.build))
        assert changed.id != first.id
        digests = sorted({e.digest for e in changed.entries if e.digest})
        blobs = timed("read_blob of every file", lambda: {d: builder.read_blob(d) for d in digests})
        print("node")
        cache = NodeCache(base / "node")
        timed("missing + add_blobs (every blob)", lambda: cache.add_blobs(blobs))
        view = base / "view"
        timed("first sync_view (writes every file)", lambda: cache.sync_view(changed, view))
        timed("sync_view, nothing changed", lambda: cache.sync_view(changed, view))
        (ws / "pkg000" / "m1.py").write_text("changed too\n")
        again = trio.run(builder.build)
        cache.add_blobs({d: builder.read_blob(d) for d in cache.missing(again)})
        writes = cache.writes
        timed("sync_view, one file changed", lambda: cache.sync_view(again, view))
        assert cache.writes == writes + 1
        print(f"load average {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
