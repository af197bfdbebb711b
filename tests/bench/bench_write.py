"""Atomic writes (issue 9, item 12): what the temporary file, fsync and rename cost, in one run:

    .venv/bin/python tests/bench/bench_write.py [directory]

(a) Edit of a 2,000-line file through the whole tool (validate + call), old way (the file
    truncated and rewritten in place, as before) vs new way (`write_atomically`): medians, the
    difference per call and the ratio. Budget: <= 1 ms added per call, median.
(b) The write step alone, in place vs atomic.
(c) Read's open: plain `open` vs `open_regular` (the FIFO/device check), per call.

The files live in `directory` (default: a temporary directory under /var/tmp, a real disk;
/tmp may be a tmpfs where fsync is free). Old and new calls alternate, so drift in the
machine's load hits both alike.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import orchestrator.tools.edit as edit_module  # noqa: E402
from orchestrator.tools._files import open_regular, write_atomically  # noqa: E402
from orchestrator.tools.base import ToolContext, ToolOutput  # noqa: E402
from orchestrator.tools.edit import EditTool  # noqa: E402

RUNS = 101
LINES = 2000


def write_in_place(path: Path, data: bytes, ctx: ToolContext) -> None:
    """The parent commit's write: truncate and rewrite the file where it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    ctx.read_ledger.record(path)


async def edit_once(tool: EditTool, path: Path, ctx: ToolContext, flip: bool) -> None:
    old, new = ("value = 1000", "value = 2000") if flip else ("value = 2000", "value = 1000")
    parsed = tool.parse_input({"file_path": str(path), "old_string": old, "new_string": new})
    refusal = await tool.validate(parsed, ctx)
    assert refusal is None, refusal
    async for event in tool.call(parsed, ctx):
        assert isinstance(event, ToolOutput) and not event.is_error


async def bench_edit(directory: Path) -> tuple[float, float]:
    path = directory / "module.py"
    body = "".join(f"def function_{i}(x):  # line {i}\n" for i in range(LINES - 1))
    path.write_text(body + "value = 1000\n")
    ctx = ToolContext(workspace=directory, cwd=directory)
    ctx.read_ledger.record(path)
    tool = EditTool()
    times: dict[str, list[float]] = {"old": [], "new": []}
    flip = True
    for run in range(RUNS + 1):
        for way, writer in (("old", write_in_place), ("new", write_atomically)):
            setattr(edit_module, "write_atomically", writer)  # noqa: B010 (the bench's seam)
            start = time.perf_counter()
            await edit_once(tool, path, ctx, flip)
            elapsed = time.perf_counter() - start
            flip = not flip
            if run:  # the first round warms caches
                times[way].append(elapsed)
    setattr(edit_module, "write_atomically", write_atomically)  # noqa: B010
    return statistics.median(times["old"]), statistics.median(times["new"])


def median_of(step: Callable[[], object], runs: int = RUNS) -> float:
    step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_write_step(directory: Path) -> tuple[float, float]:
    path = directory / "step.txt"
    data = b"".join(b"def function_%d(x):  # line %d\n" % (i, i) for i in range(LINES))
    path.write_bytes(data)
    ctx = ToolContext(workspace=directory, cwd=directory)
    old = median_of(lambda: write_in_place(path, data, ctx))
    new = median_of(lambda: write_atomically(path, data, ctx))
    return old, new


def bench_open(directory: Path) -> tuple[float, float]:
    path = directory / "step.txt"

    def plain() -> None:
        with path.open("rb") as f:
            f.read(8192)

    def checked() -> None:
        with open_regular(path) as f:
            f.read(8192)

    return median_of(plain, 1001), median_of(checked, 1001)


def report(what: str, old: float, new: float) -> None:
    print(
        f"{what:<44} old {old * 1e3:8.3f} ms   new {new * 1e3:8.3f} ms   "
        f"added {(new - old) * 1e3:+7.3f} ms   ratio {new / old:5.2f}"
    )


async def main() -> None:
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/var/tmp")
    with tempfile.TemporaryDirectory(dir=base, prefix="warren-bench-write-") as tmp:
        directory = Path(await trio.Path(tmp).resolve())
        print(f"files in {directory} ({os.statvfs(directory).f_bsize}-byte blocks), {RUNS} runs")
        report(f"(a) Edit of a {LINES}-line file, whole call", *await bench_edit(directory))
        report("(b) the write step alone", *bench_write_step(directory))
        report("(c) Read's open (check for FIFOs, devices)", *bench_open(directory))


if __name__ == "__main__":
    trio.run(main)
