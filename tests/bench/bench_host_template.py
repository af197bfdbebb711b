"""Spare tool hosts forked from a template against fresh ones (issue 15): memory and the first
call, measured in one run, interleaved.

    uv run python tests/bench/bench_host_template.py [--rounds 8]

Two `SpareKeeper`s play the warm server (each in a thread, as its loop): one forks its spares
from a tool-host template (orchestrator/cli/warm/host_template.py), the other starts them fresh
(its template cannot start, so it falls back, as a server does). Each round, a "session" on
each keeper adopts both spares through a real link exactly as a warm session does
(`SandboxedSpawner(spares=...)`), and the bench times the first call in each host (a Read in
the read-only host, a Bash `true` in the read-write one), then the PSS and USS of each host's
processes (python, and bwrap for a fresh one) with the session still holding them. The
spares of the next round are the replacements the keeper starts when that session ends.

Figures: medians over the rounds, with the load average. Nothing is judged here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.aio import closing_iter  # noqa: E402
from orchestrator.calls.plan import plan_call, tool_assessor  # noqa: E402
from orchestrator.cli.warm.host_template import HostTemplate  # noqa: E402
from orchestrator.cli.warm.spares import SpareKeeper  # noqa: E402
from orchestrator.messages import ToolUseBlock  # noqa: E402
from orchestrator.tools.base import Tool, ToolContext, ToolProgress  # noqa: E402
from orchestrator.tools.bash import BashTool  # noqa: E402
from orchestrator.tools.read import ReadTool  # noqa: E402
from tests.kit.keeper_loop import KeeperLoop, is_forked, spare_waiting  # noqa: E402
from workers.toolhost_runner import SandboxedSpawner, open_tool_runner  # noqa: E402

MB = 1024 * 1024


class _Fresh(SpareKeeper):
    """A keeper whose spares are all fresh (no template)."""

    def _template_for(self, key: str, recipe: Any) -> tuple[HostTemplate | None, bool]:
        return None, False


def _python_of(pid: int) -> list[psutil.Process]:
    """A host's processes: the forked host itself, or a fresh one's bwrap tree."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def _memory(pid: int) -> tuple[float, float]:
    pss = uss = 0
    for process in _python_of(pid):
        with_info = process.memory_full_info()
        pss += with_info.pss
        uss += with_info.uss
    return pss / MB, uss / MB


def _idle(loop: KeeperLoop, forked: bool) -> None:
    """Until the keeper has its two spares, of the kind wanted, each waiting for its first
    message (sent Ready, in trio's epoll wait)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = loop.run_in(loop.keeper.status)["spare_pids"]
        if len(pids) == 2 and all(is_forked(pid) == forked and spare_waiting(pid) for pid in pids):
            return
        time.sleep(0.05)
    raise SystemExit(f"spares never became idle: {loop.run_in(loop.keeper.status)}")


async def _call(runner: Any, tool: Tool[Any], ctx: ToolContext, **input: Any) -> float:
    parsed = tool.parse_input(input)
    block = ToolUseBlock(id="t", name=tool.name, input=parsed.model_dump(mode="json"))
    plan = plan_call(block, tool, parsed, tool_assessor)
    started = time.perf_counter()
    async with closing_iter(runner.call(plan, ctx)) as events:
        async for event in events:
            if not isinstance(event, ToolProgress):
                pass
    return (time.perf_counter() - started) * 1000


async def _session(loop: KeeperLoop, pid: int, ctx: ToolContext, file: Path) -> dict[str, float]:
    link = loop.link(pid)
    out: dict[str, float] = {}
    async with open_tool_runner(spawner=SandboxedSpawner(spares=link), stop_grace_s=2) as runner:
        out["read ms"] = await _call(runner, ReadTool(), ctx, file_path=str(file))
        out["bash ms"] = await _call(runner, BashTool(), ctx, command="true")
        out["second read ms"] = await _call(runner, ReadTool(), ctx, file_path=str(file))
        out["second bash ms"] = await _call(runner, BashTool(), ctx, command="true")
        pids = runner.host_pids()
        out["ro PSS"], out["ro USS"] = _memory(pids["read_only"])
        out["rw PSS"], out["rw USS"] = _memory(pids["read_write"])
    link.close()
    await trio.to_thread.run_sync(loop.run_in, lambda: loop.keeper.session_ended(pid))
    return out


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workspace = Path(tmp) / "ws"
        workspace.mkdir()
        await trio.run_process(["git", "init", "-q", str(workspace)])
        file = workspace / "a.py"
        file.write_text("".join(f"line {i}\n" for i in range(200)))
        ctx = ToolContext(workspace=workspace, cwd=workspace)
        loops = {"forked": KeeperLoop(SpareKeeper()), "fresh": KeeperLoop(_Fresh())}
        figures: dict[str, list[dict[str, float]]] = {kind: [] for kind in loops}
        load = os.getloadavg()
        try:
            for loop in loops.values():  # a cold session reports the recipes
                await _session(loop, 1, ctx, file)
            for n in range(rounds):
                for kind, loop in (list(loops.items()) if n % 2 else reversed(loops.items())):
                    await trio.to_thread.run_sync(_idle, loop, kind == "forked")
                    figures[kind].append(await _session(loop, n + 2, ctx, file))
            status = loops["forked"].run_in(loops["forked"].keeper.status)
            await trio.to_thread.run_sync(_idle, loops["forked"], True)
            spares = set(loops["forked"].run_in(loops["forked"].keeper.status)["spare_pids"])
            template_pss = 0
            for pid in status["template_pids"]:
                for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                    if p.pid not in spares:
                        template_pss += p.memory_full_info().pss
        finally:
            for loop in loops.values():
                loop.close()
        print(
            f"spare tool hosts, forked from a template vs fresh: median of {rounds} interleaved "
            f"rounds (load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after)"
        )
        for name in figures["forked"][0]:
            forked = statistics.median(f[name] for f in figures["forked"])
            fresh = statistics.median(f[name] for f in figures["fresh"])
            unit = "ms" if name.endswith("ms") else "MB"
            label = name.removesuffix(" ms")
            print(
                f"  {label:16} forked {forked:7.1f} {unit}   fresh {fresh:7.1f} {unit}   "
                f"difference {forked - fresh:+7.1f} {unit}"
            )
        print(f"  the template itself (bwrap, its two python processes): {template_pss / MB:.1f} MB"
              " PSS, shared by every host it forks")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    trio.run(main, parser.parse_args().rounds)
