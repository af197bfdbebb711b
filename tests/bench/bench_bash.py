"""Bash tool micro-benchmark: round trips of `true`, medians over one run each.

    .venv/bin/python tests/bench/bench_bash.py      (or: .venv/bin/python -m tests.bench.bench_bash)

(a) `true` in the persistent shell (PersistentShell.run)                (goal <= 5 ms)
(b) `true` through the tool: syntax check + persistent shell           (for information)
(c) `true` in a one-shot shell (the path of concurrent read-only calls) (for information)
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

from orchestrator.shell import PersistentShell, shell_environment  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.bash import MAX_OUTPUT_CHARS, BashTool  # noqa: E402

RUNS = 200


async def median_ms(step: Callable[[], Awaitable[object]], runs: int = RUNS) -> float:
    await step()  # warm-up: starts the shell
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def bench(workspace: Path) -> tuple[float, float, float]:
    shell = PersistentShell(cwd=workspace, env=shell_environment(), output_limit=MAX_OUTPUT_CHARS)
    try:
        a = await median_ms(lambda: shell.run("true", timeout_s=10))
        c = await median_ms(lambda: shell.run_oneshot("true", timeout_s=10))
    finally:
        await shell.aclose()

    ctx = ToolContext(workspace=workspace, cwd=workspace)
    tool = BashTool()
    input = tool.parse_input({"command": "true"})

    async def through_tool() -> None:
        async for _ in tool.call(input, ctx):
            pass

    try:
        b = await median_ms(through_tool)
    finally:
        await ctx.aclose()
    return a, b, c


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = trio.run(bench, Path(tmp).resolve())
    print(f"(a) persistent shell, `true`, median of {RUNS}: {a:.2f} ms (goal <= 5 ms)")
    print(f"(b) Bash tool call,   `true`, median of {RUNS}: {b:.2f} ms")
    print(f"(c) one-shot shell,   `true`, median of {RUNS}: {c:.2f} ms")


if __name__ == "__main__":
    main()
