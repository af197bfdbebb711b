"""Scoped writers benchmark (issue 17): three writers with disjoint scopes at once.

    .venv/bin/python tests/bench/bench_parallel_writers.py

Three `dispatch_agent` calls of a writable type, each with its own `write_paths`, in one
message of the main agent; each subagent takes 5 turns (4 writing a file in its scope, then an
answer) at 200 ms model latency. Ideal is one writer alone, 5 x 200 ms. Run under both ways a
scope is held (workers/pool.py):

- Landlock (`scopes="auto"` on a kernel with ABI >= 2): the pool keeps `warm_writers` = 3
  writable workers ready (a session with a writing agent type asks for them when dispatch_agent
  is built, `expect_writers`), and each writer confines one; the batch starts once they are
  warm, as a session's first dispatch does after its first model request;
- mounts (`scopes="mount"`, no warm writers): a fresh worker per scoped writer, whose sandbox
  mounts only its scope writable, started when the dispatch arrives.

Printed for each: the writers' wall / ideal from the first model request of the batch to the
last answer (the issue's measure: goal <= 1.15; serial would be 3.0), the longest single
writer, the whole batch / ideal (with the mounts, that adds the fresh workers' start), and the
CPU time of the batch: the coordinator's (`time.process_time`, from the batch's start to its
end) and the workers' (psutil, their process trees just before they stop, less what a warm
worker had used when the batch began: a fresh worker's start counts, a warm one's does not).
Then unscoped writers (serial, today's order for writers without scopes) and the load
average: the box is shared.

Everything real but the model: the executor and pipeline, `DispatchAgentTool` (scope checked,
made, hashed before and after), the worker pool under bwrap. The model is an in-process
function (the SDK's cost is bench_loop's).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import structlog
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.agents.dispatch_agent import DispatchAgentTool  # noqa: E402
from orchestrator.agents.types import AgentType  # noqa: E402
from orchestrator.calls.permissions import default_permission, headless_asker  # noqa: E402
from orchestrator.calls.pipeline import ToolPipeline  # noqa: E402
from orchestrator.conversation.executor import StreamingToolExecutor  # noqa: E402
from orchestrator.events import Event  # noqa: E402
from orchestrator.messages import ContentBlock, TextBlock, ToolUseBlock  # noqa: E402
from orchestrator.model.base import ModelRequest  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.registry import ToolRegistry, builtin_tools  # noqa: E402
from tests.workers.agent_kit import FunctionModel  # noqa: E402
from workers.broker import ModelBroker  # noqa: E402
from workers.pool import PoolOptions, WorkerPool, open_worker_pool, tree_usage  # noqa: E402

WRITERS = 3
TURNS = 5
LATENCY_S = 0.2
WRITER = AgentType(
    name="writer", description="d", system_prompt="s", tools=("Write",), writable=True
)


class _WorkerCpu:
    """CPU seconds the workers used during the batch, each measured (psutil, its whole tree)
    just before the pool stops it, less what a warm one had used when the batch began (its
    start, paid before): the pool's `_retire` is wrapped for the benchmark only."""

    def __init__(self, pool: WorkerPool) -> None:
        self.seconds = 0.0
        self.seen: set[int] = set()
        self.before: dict[int, float] = {}
        retire = pool._retire

        def measured(worker: Any) -> bool:
            pid = worker.process.pid
            usage = tree_usage(pid) if pid not in self.seen else None
            if usage is not None:
                self.seen.add(pid)
                self.seconds += usage[1] - self.before.get(pid, 0.0)
            return retire(worker)

        pool._retire = measured  # type: ignore[method-assign]

    def batch_begins(self, pids: list[int]) -> None:
        for pid in pids:
            usage = tree_usage(pid)
            self.before[pid] = usage[1] if usage is not None else 0.0


async def batch_wall(
    root: Path, *, scoped: bool, scopes: Literal["auto", "mount"] = "auto"
) -> tuple[float, float, float, float, float, float]:
    """Wall time of one main-agent message of `WRITERS` writer dispatches, in a fresh
    workspace under `root`: (whole batch, writers from first request to last answer, slowest
    start: batch start to a writer's first request, the longest single writer from its first
    request to its last answer, CPU seconds of the coordinator, of the workers)."""
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
    warm = WRITERS if scopes == "auto" else 0
    options = PoolOptions(max_workers=WRITERS, start="lazy", scopes=scopes, warm_writers=warm)
    async with open_worker_pool(
        broker=ModelBroker(model), workspace=workspace, options=options
    ) as pool:
        workers = _WorkerCpu(pool)
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
        await pool.wait_idle(warm)  # DispatchAgentTool asked for them (`expect_writers`)
        workers.batch_begins(pool.worker_pids())
        cpu = time.process_time()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            executor = StreamingToolExecutor(pipeline, nursery, trio.CapacityLimiter(10))
            for block in blocks:
                executor.add(block)
            executor.message_complete(blocks)
            results = await executor.results()
        end = time.perf_counter()
        cpu = time.process_time() - cpu
        for pid in pool.worker_pids():  # the warm ones started after the batch: not its cost
            workers.seen.add(pid)
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
    spans = (end - start, end - min(model.started_at), max(firsts) - start, longest)
    return (*spans, cpu, workers.seconds)


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
    print(
        f"{WRITERS} scoped writers x {TURNS} turns x {LATENCY_S * 1000:.0f} ms, "
        f"ideal {ideal:.2f} s (goal: writers' wall / ideal <= 1.15)"
    )
    for scopes, label in (("auto", "Landlock, warm workers"), ("mount", "mounts, fresh workers")):
        whole, writers, started, longest, cpu, worker_cpu = await batch_wall(
            workspace, scoped=True, scopes=scopes
        )
        print(
            f"  {label}: writers' wall {writers:.2f} s / ideal = {writers / ideal:.3f}; "
            f"longest single writer {longest / ideal:.3f} x ideal; whole batch "
            f"{whole / ideal:.3f} x ideal (first requests {started:.2f} s after it began); "
            f"CPU: coordinator {cpu:.2f} s, workers {worker_cpu:.2f} s"
        )
    serial = (await batch_wall(workspace, scoped=False))[0]
    print(f"  unscoped writers (serial): whole batch {serial:.2f} s / ideal = {serial / ideal:.3f}")
    end = os.getloadavg()
    print(f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {end[0]:.2f}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp).resolve()
        trio.run(main, root)
