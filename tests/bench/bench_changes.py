"""What per-turn change sets cost on a 10,000-file workspace, in one run.

    .venv/bin/python tests/bench/bench_changes.py

Once per session (in a child process from the start of a session that can write, overlapping
the first model request; the first writing call waits for it if it is not done):
  the whole scan that watches every directory and keeps every file's content (a workspace
  seen for the first time), and the same in a later session, which has the stamps of the last
  one and reads no file whose stamp did not change; for each, the CPU time this process (the
  coordinator) spent, against the same scan made in this process (how it ran before).
Per read-write call (a writing turn is one refresh before its first call, one after each):
  a refresh after a call that changed nothing, and after one that appended to 5 files and made
  a directory with 3 files, against what inotify saves: a whole stat scan (the fallback) and a
  whole hash (what recording would cost without a stat cache).
Per writing turn: the difference of two 10,000-entry scans (`end_turn`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.changes.content_store import ContentStore  # noqa: E402
from orchestrator.changes.recorder import diff  # noqa: E402
from orchestrator.changes.tree_state import TreeState, scan  # noqa: E402

FILES = 10_000
PER_DIR = 20
ROUNDS = 15


def make_workspace(base: Path) -> Path:
    ws = base / "ws"
    (ws / ".git").mkdir(parents=True)
    for i in range(FILES):
        d = ws / f"pkg{i // (PER_DIR * 25)}" / f"mod{i // PER_DIR}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text(f"# file {i}\n" + "x = 1\n" * 60)
    return ws


def timed(step: Callable[[], object], rounds: int = ROUNDS) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1000)
    return times


def show(label: str, times: list[float]) -> None:
    print(f"  {label:58} median {statistics.median(times):8.2f} ms  (min {min(times):.2f})")


def show_cpu(label: str, step: Callable[[], object]) -> None:
    cpu, started = time.process_time(), time.perf_counter()
    step()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"  {label:58} wall {wall * 1000:8.2f} ms  CPU of this process {cpu * 1000:.2f} ms")


def _packed_scan(ws: Path, store: ContentStore) -> None:
    with store.packing():
        scan([ws], store)


def main() -> None:
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = Path(tempfile.mkdtemp(prefix="bench-changes-"))
    try:
        ws = make_workspace(base)
        print(f"workspace: {FILES} files in {sum(1 for _ in ws.rglob('*')) - FILES} directories")
        print("once per session:")
        tree = TreeState([ws], ContentStore(base / "objects"), base / "scans")
        show_cpu("first refresh, first session (scan, watch, keep all)", tree.refresh)
        tree.close()
        inside = ContentStore(base / "objects-inside")
        show_cpu("  the same scan in this process", lambda: _packed_scan(ws, inside))
        again = TreeState([ws], ContentStore(base / "objects"), base / "scans")
        show_cpu("first refresh, a later session (stamps kept)", again.refresh)
        show("saving the stamps at the end of a session", timed(again._save_index, 3))
        print("per read-write call:")
        show("refresh after a call that changed nothing", timed(again.refresh))
        counter = [0]

        def write_some() -> None:
            counter[0] += 1
            for k in range(5):
                with (ws / "pkg0" / "mod0" / f"f{k}.py").open("a") as f:
                    f.write(f"y = {counter[0]}\n")
            new = ws / "pkg1" / f"new{counter[0]}"
            new.mkdir()
            for k in range(3):
                (new / f"n{k}.py").write_text("new\n")

        times = []
        for _ in range(ROUNDS):
            write_some()
            times.extend(timed(again.refresh, 1))
        show("refresh after 5 appends + a new directory of 3 files", times)
        assert again.full_scans == 1, again.full_scans
        known = again.refresh().entries
        store = ContentStore(base / "objects")
        show("whole stat scan instead (no inotify: the fallback)",
             timed(lambda: scan([ws], store, known), 5))  # fmt: skip

        def hash_all() -> None:
            for path in ws.rglob("*.py"):
                hashlib.sha256(path.read_bytes()).hexdigest()

        show("whole hash of the tree (what a stat cache avoids)", timed(hash_all, 3))
        print("per writing turn:")
        before = again.refresh()
        write_some()
        after = again.refresh()
        show("diff of two 10,000-entry scans (end of turn)",
             timed(lambda: diff(before.entries, after.entries)))  # fmt: skip
        again.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
