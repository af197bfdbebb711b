"""Scoped writers benchmark (issue 17): three writers with disjoint scopes at once.

    .venv/bin/python tests/bench/bench_parallel_writers.py

Three `dispatch_agent` calls of a writable type, each with its own `write_paths`, in one
message of the main agent; each subagent takes 5 turns (4 writing a file in its scope, then an
answer) at 200 ms model latency. Ideal is one writer alone, 5 x 200 ms. Printed:

- the writers' wall / ideal: from the first model request of the batch to the last answer,
  the issue's measure (goal <= 1.15; serial would be 3.0);
- the batch's whole wall time / ideal, which adds the start of a fresh worker per scoped
  writer (its sandbox mounts its scope, so no warm worker can serve it): the start is printed
  on its own;
- the same batch with unscoped writers (today's serial order), and the load average, since
  the box is shared.

Everything real but the model: the executor and pipeline, `DispatchAgentTool` (scope checked,
made, hashed before and after), the worker pool starting a fresh worker under bwrap with only
its scope writable. The model is an in-process function (the SDK's cost is bench_loop's).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.events import Event  # noqa: E402
from orchestrator.executor import StreamingToolExecutor  # noqa: E402
from orchestrator.messages import ContentBlock, TextBlock, ToolUseBlock  # noqa: E402
from orchestrator.model.base import ModelRequest  # noqa: E402
from orchestrator.permissions import default_permission, headless_asker  # noqa: E402
from orchestrator.pipeline import ToolPipeline  # noqa: E402
from orchestrator.subagents import AgentType  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.dispatch_agent import DispatchAgentTool  # noqa: E402
from orchestrator.tools.registry import ToolRegistry, builtin_tools  # noqa: E402
from tests.workers.agent_kit import FunctionModel  # noqa: E402
from workers.broker import ModelBroker  # noqa: E402
from workers.pool import PoolOptions, open_worker_pool  # noqa: E402

WRITERS = 3
TURNS = 5
LATENCY_S = 0.2
WRITER = AgentType(
    name="writer", description="d", system_prompt="s", tools=("Write",), writable=True
)


async def batch_wall(root: Path, *, scoped: bool) -> tuple[float, float, float, float]:
    """Wall time of one main-agent message of `WRITERS` writer dispatches, in a fresh
    workspace under `root`: (whole batch, writers from first request to last answer, slowest
    start: batch start to a writer's first request, the longest single writer from its first
    request to its last answer)."""
    workspace = Path(tempfile.mkdtemp(dir=root))
    for i in range(WRITERS):
        (workspace / f"pkg_{i}").mkdir()

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        await trio.sleep(LATENCY_S)
        first = req.messages[0].content
        me = (first if isinstance(first, str) else first[0].text).split()[-1]  # type: ignore[union-attr]
        turn = (len(req.messages) + 1) // 2
        if turn < TURNS:
            path = workspace / f"pkg_{me}" / f"f{turn}.py"
            return [
                ToolUseBlock(
                    id=f"toolu_{turn}",
                    name="Write",
                    input={"file_path": str(path), "content": f"x = {turn}\n"},
                )
            ]
        return [TextBlock(text="done")]

    model = FunctionModel(respond)
    options = PoolOptions(max_workers=WRITERS, start="lazy")
    async with open_worker_pool(
        broker=ModelBroker(model), workspace=workspace, options=options
    ) as pool:
        ctx = ToolContext(workspace=workspace, cwd=workspace)
        dispatch = DispatchAgentTool(
            runner=pool,
            agent_types={"writer": WRITER},
            tools=ToolRegistry(builtin_tools()),
            permission=default_permission("bypass"),
            asker=headless_asker,
        )
        pipeline = ToolPipeline(
            tools=ToolRegistry([dispatch]),
            ctx=ctx,
            permission=default_permission("bypass"),
            asker=headless_asker,
            emit=_ignore,
        )
        blocks = [_dispatch(i, scoped) for i in range(WRITERS)]
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            executor = StreamingToolExecutor(pipeline, nursery, trio.CapacityLimiter(10))
            for block in blocks:
                executor.add(block)
            executor.message_complete(blocks)
            results = await executor.results()
        end = time.perf_counter()
    assert not any(r.is_error for r in results), results
    assert len(model.requests) == WRITERS * TURNS
    firsts = [t for t, r in zip(model.started_at, model.requests, strict=True)
              if len(r.messages) == 1]  # fmt: skip
    by_writer: dict[str, list[float]] = {}
    for t, r in zip(model.started_at, model.requests, strict=True):
        first = r.messages[0].content
        me = first if isinstance(first, str) else first[0].text  # type: ignore[union-attr]
        by_writer.setdefault(str(me), []).append(t)
    longest = max(max(ts) - min(ts) for ts in by_writer.values()) + LATENCY_S
    return end - start, end - min(model.started_at), max(firsts) - start, longest


def _dispatch(i: int, scoped: bool) -> ToolUseBlock:
    input: dict[str, Any] = {"description": "w", "prompt": f"write {i}", "subagent_type": "writer"}
    if scoped:
        input["write_paths"] = [f"pkg_{i}"]
    return ToolUseBlock(id=f"toolu_dispatch_{i}", name="dispatch_agent", input=input)


def _ignore(event: Event) -> None:
    pass


async def main(workspace: Path) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    ideal = TURNS * LATENCY_S
    await batch_wall(workspace, scoped=True)  # warm-up: imports, page cache
    load = os.getloadavg()
    whole, writers, started, longest = await batch_wall(workspace, scoped=True)
    serial, _, _, _ = await batch_wall(workspace, scoped=False)
    print(
        f"{WRITERS} scoped writers x {TURNS} turns x {LATENCY_S * 1000:.0f} ms: writers' wall "
        f"{writers:.2f} s / ideal {ideal:.2f} s = {writers / ideal:.3f}     goal <= 1.15"
    )
    print(
        f"  the longest single writer alone took {longest:.2f} s ({longest / ideal:.3f} x ideal: "
        "its own tool calls and turns), the rest is the writers' starts apart"
    )
    print(
        f"  whole batch {whole:.2f} s / ideal = {whole / ideal:.3f}, of which the fresh "
        f"workers' start (slowest) {started:.2f} s"
    )
    print(
        f"same writers unscoped (serial): whole batch {serial:.2f} s / ideal = "
        f"{serial / ideal:.3f}"
    )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp).resolve()
        trio.run(main, root)
