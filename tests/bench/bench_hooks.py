"""What hooks cost a tool call (issue 12), measured in one run against the same pipeline
without the hook code path.

    .venv/bin/python tests/bench/bench_hooks.py

a) no hooks configured: the pipeline holds the session's `HookRunner` with no hooks (two set
   lookups per call, PreToolUse and PostToolUse) vs a pipeline with `hooks=None`; batches of
   2,000 `Think` calls, interleaved, medians per call. Goal: <= 20 us added.
b) a trivial sandboxed PreToolUse hook (`true`) vs none, run where a session runs it: in the
   session's warm read-write tool host (`SandboxedToolRunner.run_hook`, the host started under
   the floor by bwrap as `warren -p` starts it); 40 calls each, interleaved, medians per call.
   Goal: <= 15 ms added.
c) for scale, in the same rounds: the same hook in a one-shot sandbox of its own
   (`run_sandboxed` of `/bin/sh -c true` with the workspace writable), the path a hook takes
   without a warm host (`warren hooks test`), and the path (b) took before hooks moved into
   the tool host.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.calls.permissions import Allow, PermissionResult, headless_asker  # noqa: E402
from orchestrator.calls.pipeline import ToolPipeline  # noqa: E402
from orchestrator.calls.plan import CallPlan  # noqa: E402
from orchestrator.events import Event, HookRan  # noqa: E402
from orchestrator.hooks.matchers import build_matcher  # noqa: E402
from orchestrator.hooks.runner import ConfiguredHook, HookRunner, HookSandbox  # noqa: E402
from orchestrator.messages import ToolUseBlock  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.registry import ToolRegistry  # noqa: E402
from orchestrator.tools.think import ThinkTool  # noqa: E402
from policies.files import Hook  # noqa: E402
from sandbox.spec import SandboxSpec  # noqa: E402
from workers.toolhost_runner import (  # noqa: E402
    HOST_LIMITS,
    SandboxedSpawner,
    open_tool_runner,
)

BATCH = 2000
ROUNDS = 15
HOOKED_CALLS = 40


async def allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
    return Allow(rule="bench")


def pipeline(ws: Path, hooks: HookRunner | None) -> ToolPipeline:
    return ToolPipeline(
        tools=ToolRegistry([ThinkTool()]),
        ctx=ToolContext(workspace=ws, cwd=ws),
        permission=allow,
        asker=headless_asker,
        emit=lambda event: None,
        hooks=hooks,
    )


async def per_call(pipe: ToolPipeline, calls: int) -> float:
    block = ToolUseBlock(id="toolu_1", name="Think", input={"thought": "x"})
    started = time.perf_counter()
    for _ in range(calls):
        await pipe.execute(pipe.prepare(block))
    return (time.perf_counter() - started) / calls


async def main(ws: Path) -> None:
    bare = pipeline(ws, None)
    empty = pipeline(ws, HookRunner((), workspace=ws))
    trivial = ConfiguredHook(
        Hook(event="PreToolUse", command="true"), "bench.toml", build_matcher(None)
    )
    async with open_tool_runner(
        spawner=SandboxedSpawner(SandboxSpec(limits=HOST_LIMITS)),
        prestart=ToolContext(workspace=ws, cwd=ws),
    ) as runner:
        ran: list[Event] = []
        sandbox = HookSandbox(SandboxSpec(), warm=runner)
        hooks = HookRunner((trivial,), workspace=ws, sandbox=sandbox, emit=ran.append)
        hooked = pipeline(ws, hooks)
        await per_call(hooked, 2)  # wait for the host to start, warm caches
        await rounds(ws, bare, empty, hooked)
        assert all(isinstance(e, HookRan) and e.exit_code == 0 and not e.error for e in ran)


async def rounds(ws: Path, bare: ToolPipeline, empty: ToolPipeline, hooked: ToolPipeline) -> None:
    await per_call(bare, BATCH)

    without, with_runner = [], []
    for _ in range(ROUNDS):
        without.append(await per_call(bare, BATCH))
        with_runner.append(await per_call(empty, BATCH))
    a_bare, a_empty = statistics.median(without), statistics.median(with_runner)

    from sandbox.run import run_sandboxed
    from sandbox.spec import WorkspaceRoot

    host = await HookSandbox(SandboxSpec()).sandbox_host()
    floor_spec = SandboxSpec(workspaces=(WorkspaceRoot(path=ws, mode="rw"),))
    plain, sandboxed, floor = [], [], []
    for _ in range(HOOKED_CALLS):
        plain.append(await per_call(bare, 1))
        sandboxed.append(await per_call(hooked, 1))
        started = time.perf_counter()
        await run_sandboxed(floor_spec, ["/bin/sh", "-c", "true"], cwd=ws, host=host)
        floor.append(time.perf_counter() - started)
    b_bare, b_hooked = statistics.median(plain), statistics.median(sandboxed)
    c_floor = statistics.median(floor)

    print(f"a) no hooks configured: {a_bare * 1e6:.2f} us/call without the hook code path, "
          f"{a_empty * 1e6:.2f} us/call with it: +{(a_empty - a_bare) * 1e6:.2f} us "
          "(goal <= 20 us)")  # fmt: skip
    print(f"b) trivial sandboxed PreToolUse hook: {b_bare * 1e3:.2f} ms/call without, "
          f"{b_hooked * 1e3:.2f} ms/call with: +{(b_hooked - b_bare) * 1e3:.2f} ms median "
          "(goal <= 15 ms)")  # fmt: skip
    print(f"c) the same hook in a one-shot sandbox (run_sandboxed, sh -c true, rw): "
          f"{c_floor * 1e3:.2f} ms median")  # fmt: skip


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        trio.run(main, Path(tmp).resolve())
