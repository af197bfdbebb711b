"""Worker pool benchmarks (issue "Worker pool and dispatch_agent"): numbers from one run, printed.

    .venv/bin/python tests/bench/bench_pool.py

(a) dispatch to a warm worker until the subagent's first model request reaches the coordinator's
    model client, median of 50 dispatches                                   (goal <= 20 ms)
(b) 10 subagents in parallel, each 5 turns (4 Think calls, then an answer) with 200 ms model
    latency: wall time / ideal (5 x 200 ms)                                 (goal <= 1.1)
(c) memory of an idle worker, over its whole process tree, and of a pool of 10, with workers
    forked from the zygote (the pool's tree then includes the zygote's: two bwrap, the zygote
    and its waiting parent) and with fresh ones (bwrap, the sandbox's init, python), in one run:
    PSS shares out the pages processes share            (goal <= 15 MB; pool of 10 <= 150 MB)

Real workers under real bwrap; the coordinator's model is an in-process function (the real
SDK's own cost is measured by tests/bench/bench_loop.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import psutil
import structlog
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.agents.types import GENERAL, SubagentEvent, SubagentRequest  # noqa: E402
from orchestrator.calls.permissions import Allow, Deny  # noqa: E402
from orchestrator.messages import ContentBlock, TextBlock, ToolUseBlock  # noqa: E402
from orchestrator.model.base import ModelRequest  # noqa: E402
from tests.workers.agent_kit import FunctionModel  # noqa: E402
from workers.broker import ModelBroker  # noqa: E402
from workers.pool import PoolOptions, open_worker_pool  # noqa: E402

DISPATCHES = 50
_MiB = 1024 * 1024


async def allow(tool: str, input: dict[str, object]) -> Allow | Deny:
    return Allow()


def ignore(event: SubagentEvent) -> None:
    pass


def request(agent_id: str, workspace: Path) -> SubagentRequest:
    return SubagentRequest(
        agent_id, GENERAL, "go", GENERAL.system_blocks(workspace=workspace, cwd=workspace)
    )


async def dispatch_latency(workspace: Path) -> list[float]:
    async def answer(req: ModelRequest) -> Sequence[ContentBlock]:
        return [TextBlock(text="done")]

    model = FunctionModel(answer)
    latencies = []
    async with open_worker_pool(
        broker=ModelBroker(model), workspace=workspace, options=PoolOptions(max_workers=1)
    ) as pool:
        await pool.run(request("warm-up", workspace), on_event=ignore, permission=allow)
        for i in range(DISPATCHES):
            start = time.perf_counter()
            await pool.run(request(f"a{i}", workspace), on_event=ignore, permission=allow)
            latencies.append(model.started_at[-1] - start)
    return latencies


async def parallel_ratio(workspace: Path, latency_s: float = 0.2, turns: int = 5) -> float:
    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        await trio.sleep(latency_s)
        turn = (len(req.messages) + 1) // 2
        if turn < turns:
            return [ToolUseBlock(id=f"toolu_{turn}", name="Think", input={"thought": "hmm"})]
        return [TextBlock(text="done")]

    model = FunctionModel(respond)
    options = PoolOptions(max_workers=10, start="eager")
    async with open_worker_pool(
        broker=ModelBroker(model), workspace=workspace, options=options
    ) as pool:
        await pool.wait_idle(10)

        async def one(agent_id: str) -> None:
            await pool.run(request(agent_id, workspace), on_event=ignore, permission=allow)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(one, f"p{i}")
        wall = time.perf_counter() - start
    assert len(model.requests) == 10 * turns
    return wall / (turns * latency_s)


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


async def idle_memory(workspace: Path, zygote: Literal["auto", "off"]) -> None:
    options = PoolOptions(max_workers=10, start="eager", zygote=zygote)

    async def never(req: ModelRequest) -> Sequence[ContentBlock]:
        raise AssertionError("an idle pool gets no request")

    model = FunctionModel(never)
    async with open_worker_pool(
        broker=ModelBroker(model), workspace=workspace, options=options
    ) as pool:
        await pool.wait_idle(10)
        await trio.sleep(1.0)  # let start-up garbage settle
        load = os.getloadavg()[0]
        pids = pool.worker_pids()
        per_worker: list[tuple[int, int]] = []  # (RSS, PSS) of each worker's process tree
        for pid in pids:
            infos = [proc.memory_full_info() for proc in tree(pid)]
            per_worker.append((sum(i.rss for i in infos), sum(i.pss for i in infos)))
        # A forked worker's parents up to the pool are the zygote's tree, shared by all.
        ours = psutil.Process().pid
        shared = [p for p in psutil.Process(pids[0]).parents() if p.pid != ours]
        shared = shared[: [p.pid for p in psutil.Process(pids[0]).parents()].index(ours)]
        zygote_pss = sum(p.memory_full_info().pss for p in shared) if zygote == "auto" else 0
        rss = statistics.median(r for r, _ in per_worker) / _MiB
        pss = statistics.median(p for _, p in per_worker) / _MiB
        total = (sum(p for _, p in per_worker) + zygote_pss) / _MiB
        kind = "forked from the zygote" if zygote == "auto" else "fresh interpreters   "
        print(
            f"(c) idle worker, {kind}: PSS {pss:.1f} MB (RSS {rss:.1f} MB) per worker tree; "
            f"pool of {len(pids)}: {total:.0f} MB PSS"
            + (f" incl. the zygote's tree {zygote_pss / _MiB:.1f} MB" if zygote_pss else "")
            + f"  [load {load:.1f}]   goal <= 15 MB, pool <= 150 MB"
        )


async def main(workspace: Path) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    latencies = await dispatch_latency(workspace)
    print(
        f"(a) dispatch to a warm worker -> its first model request: median "
        f"{statistics.median(latencies) * 1000:.1f} ms, p90 "
        f"{statistics.quantiles(latencies, n=10)[-1] * 1000:.1f} ms over {DISPATCHES}"
        "      goal <= 20 ms"
    )
    ratio = await parallel_ratio(workspace)
    print(
        f"(b) 10 subagents x 5 turns x 200 ms in parallel: wall / ideal = {ratio:.3f}"
        "                goal <= 1.1"
    )
    await idle_memory(workspace, "auto")
    await idle_memory(workspace, "off")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workspace = Path(tmp).resolve()
        (workspace / "a.txt").write_text("alpha\n")
        trio.run(main, workspace)
