"""Tool host benchmarks (issue "The OS floor", item 7): medians from one run, printed.

    .venv/bin/python tests/bench/bench_toolhost.py

(a) round trip of a Think call through the sandboxed read-only host, minus the same call
    in process, median over 500 calls                                   (goal <= 1 ms)
(b) the same for `validate` (ValidateTool -> Validated)
(c) (a) with 1,000 entries in the read ledger: the runner sends only what changed
(d) what shipping the whole 1,000-entry ledger on every call would add (encode + decode)
(e) a host's start-up (spawn to Ready), sandboxed and not, median of 5: the cost a lazy
    start adds to the first call, and what `start_soon` hides behind the first model request
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.aio import closing_iter  # noqa: E402
from orchestrator.calls.plan import plan_call, tool_assessor  # noqa: E402
from orchestrator.messages import ToolUseBlock  # noqa: E402
from orchestrator.tools.base import Tool, ToolContext, ToolOutput  # noqa: E402
from orchestrator.tools.think import ThinkTool  # noqa: E402
from workers import protocol as wire  # noqa: E402
from workers.toolhost_runner import (  # noqa: E402
    HostSpawner,
    SandboxedSpawner,
    open_tool_runner,
    unsandboxed_spawner,
)

CALLS = 500
WARMUP = 50


async def _run(call: Any) -> ToolOutput:
    async with closing_iter(call) as events:
        async for event in events:
            if isinstance(event, ToolOutput):
                return event
    raise AssertionError("no output")


async def _median_us(step: Callable[[], Awaitable[object]], n: int = CALLS) -> float:
    for _ in range(WARMUP):
        await step()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


async def _start_up_ms(spawner: HostSpawner, ctx: ToolContext) -> float:
    times = []
    for _ in range(5):
        async with open_tool_runner(spawner=spawner) as runner:
            start = time.perf_counter()
            await runner.start(ctx, ["read_only"])
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _drop(*_: object) -> Any:
    raise structlog.DropEvent


async def main(workspace: Path) -> None:
    structlog.configure(processors=[_drop])  # the hosts' forwarded logs are not the point
    ctx = ToolContext(workspace=workspace, cwd=workspace)
    think: Tool[Any] = ThinkTool()
    thought = think.parse_input({"thought": "a short thought"})
    block = ToolUseBlock(id="t", name="Think", input={"thought": "a short thought"})
    planned = plan_call(block, think, thought, tool_assessor)

    local = await _median_us(lambda: _run(think.call(thought, ctx)))
    async with open_tool_runner() as runner:
        await runner.start(ctx, ["read_only"])
        hosted = await _median_us(lambda: _run(runner.call(planned, ctx)))
        validate = await _median_us(lambda: runner.validate(planned, ctx))
        ctx.read_ledger.apply(
            {workspace / f"dir/file_{i:04}.py": 1_700_000_000_000_000_000 + i for i in range(1000)},
            (),
        )
        big_ledger = await _median_us(lambda: _run(runner.call(planned, ctx)))
        assert set(runner.host_pids()) == {"read_only"}

    entries = {str(p): m for p, m in ctx.read_ledger.entries().items()}

    async def whole_ledger() -> None:
        message = wire.RunTool(
            id="c1",
            tool="Think",
            input={"thought": "x"},
            ledger=wire.LedgerDelta(recorded=entries),
        )
        wire.decode_line(wire.encode(message))

    async def empty_ledger() -> None:
        wire.decode_line(wire.encode(wire.RunTool(id="c1", tool="Think", input={})))

    shipping = await _median_us(whole_ledger) - await _median_us(empty_ledger)
    sandboxed_start = await _start_up_ms(SandboxedSpawner(), ctx)
    bare_start = await _start_up_ms(unsandboxed_spawner, ctx)

    print(
        f"(a) Think round trip through the host: {hosted:7.0f} us, in process {local:4.0f} us,"
        f" overhead {(hosted - local) / 1000:.3f} ms (goal <= 1 ms)"
    )
    print(f"(b) validate round trip:               {validate:7.0f} us")
    print(
        f"(c) round trip, 1,000-entry ledger:    {big_ledger:7.0f} us "
        f"({big_ledger / hosted:.2f}x of (a))"
    )
    print(f"(d) whole ledger on every call would add {shipping:5.0f} us per call")
    print(
        f"(e) host start-up: {sandboxed_start:5.0f} ms under bwrap, "
        f"{bare_start:5.0f} ms unsandboxed"
    )


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp).resolve())
