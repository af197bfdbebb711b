"""Bash tool micro-benchmark: round trips of `true`, medians over one run each.

    .venv/bin/python tests/bench/bench_bash.py      (or: .venv/bin/python -m tests.bench.bench_bash)

(a) `true` in the persistent shell (PersistentShell.run)                (goal <= 5 ms)
(b) `true` through the tool: syntax check + persistent shell           (for information)
(c) `true` in a one-shot shell (the path of concurrent read-only calls) (for information)
(d) the same one-shot with the subreaper that kills what it leaves behind, against the old way
    (the script run by one bash, no subreaper), alternating in one run
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

from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.bash import MAX_OUTPUT_CHARS, BashTool  # noqa: E402
from orchestrator.tools.shell import PersistentShell, shell_environment  # noqa: E402

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


async def bench_reaper(workspace: Path) -> tuple[float, float]:
    """(d): medians of `true` one-shots, new way and old way, alternating."""
    import orchestrator.tools.shell as shell_module

    new_script, new_preexec = shell_module._ONESHOT_REAPER, shell_module.become_subreaper

    def old_way() -> None:  # one bash sources the script: what the old code ran
        shell_module._ONESHOT_REAPER = '. "$1"'
        shell_module.become_subreaper = lambda: None

    def new_way() -> None:
        shell_module._ONESHOT_REAPER = new_script
        shell_module.become_subreaper = new_preexec

    shell = PersistentShell(cwd=workspace, env=shell_environment(), output_limit=MAX_OUTPUT_CHARS)
    samples: dict[str, list[float]] = {"new": [], "old": []}
    try:
        for _ in range(RUNS):
            for name, switch in (("new", new_way), ("old", old_way)):
                switch()
                start = time.perf_counter()
                await shell.run_oneshot("true", timeout_s=10)
                samples[name].append(time.perf_counter() - start)
    finally:
        new_way()
        await shell.aclose()
    return statistics.median(samples["new"]) * 1000, statistics.median(samples["old"]) * 1000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = trio.run(bench, Path(tmp).resolve())
        new, old = trio.run(bench_reaper, Path(tmp).resolve())
    print(f"(a) persistent shell, `true`, median of {RUNS}: {a:.2f} ms (goal <= 5 ms)")
    print(f"(b) Bash tool call,   `true`, median of {RUNS}: {b:.2f} ms")
    print(f"(c) one-shot shell,   `true`, median of {RUNS}: {c:.2f} ms")
    print(
        f"(d) one-shot with the subreaper {new:.2f} ms, the old way {old:.2f} ms, "
        f"+{new - old:.2f} ms (x{new / old:.2f}), medians of {RUNS} alternating"
    )


if __name__ == "__main__":
    main()
