"""File tool benchmarks (issue "Core tools"), printed from one run:

    .venv/bin/python tests/bench/bench_tools.py

(a) Grep over a generated tree of 10,000 files vs plain `rg` on the same query: ratio of
    medians (goal <= 1.2), both in content mode and files-with-matches mode
(b) Read of a 2,000-line file: median
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.tools.base import ToolContext, ToolOutput  # noqa: E402
from orchestrator.tools.grep import GrepTool  # noqa: E402
from orchestrator.tools.read import ReadTool  # noqa: E402

RG = Path(sys.executable).parent / "rg"
RUNS = 15


def make_tree(root: Path, files: int = 10_000) -> None:
    for i in range(files):
        directory = root / f"pkg{i // 100:03d}"
        directory.mkdir(exist_ok=True)
        body = "".join(
            f"def function_{i}_{j}(x):\n    return x + {j}  # value {i * j}\n" for j in range(20)
        )
        if i % 250 == 0:
            body += "NEEDLE = 'found me'\n"
        (directory / f"module_{i}.py").write_text(body)


async def median_s(step: Callable[[], Awaitable[object]], runs: int = RUNS) -> float:
    await step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def call(tool: GrepTool | ReadTool, raw: dict[str, object], ctx: ToolContext) -> ToolOutput:
    parsed = tool.parse_input(raw)
    refusal = await tool.validate(parsed, ctx)
    assert refusal is None, refusal
    async for event in tool.call(parsed, ctx):
        if isinstance(event, ToolOutput):
            return event
    raise AssertionError("no output")


async def plain_rg(flags: list[str], tree: Path) -> object:
    return await trio.run_process([str(RG), *flags, "NEEDLE", str(tree)], capture_stdout=True)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = trio.Path(tmp)
        root = trio.Path(await root.resolve())
        tree = Path(root / "tree")
        await trio.to_thread.run_sync(tree.mkdir)
        await trio.to_thread.run_sync(make_tree, tree)
        root_path = Path(root)
        ctx = ToolContext(workspace=root_path, cwd=root_path)
        grep = GrepTool()
        for mode, rg_flags in (
            ("content", ["-n", "--no-heading", "--color=never"]),
            ("files_with_matches", ["-l", "--color=never"]),
        ):
            ours = await median_s(
                lambda mode=mode: call(
                    grep, {"pattern": "NEEDLE", "path": str(tree), "output_mode": mode}, ctx
                )
            )
            plain = await median_s(lambda flags=rg_flags: plain_rg(flags, tree))
            print(
                f"(a) Grep {mode} over 10,000 files: {ours * 1000:.1f} ms vs plain rg "
                f"{plain * 1000:.1f} ms, ratio {ours / plain:.2f} (goal <= 1.2)"
            )
        big = root_path / "big.py"
        await trio.to_thread.run_sync(
            big.write_text,
            "".join(f"line {i}: some ordinary source text here\n" for i in range(2000)),
        )
        read = ReadTool()
        median = await median_s(lambda: call(read, {"file_path": str(big)}, ctx), runs=200)
        print(f"(b) Read of a 2,000-line file: median {median * 1000:.2f} ms")


if __name__ == "__main__":
    trio.run(main)
