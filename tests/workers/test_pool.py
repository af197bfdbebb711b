"""The worker pool against real agent workers under real bwrap: reuse and replacement, the
sandbox profile per agent type, limits, and every fault the issue lists. Each fault must give
an outcome that says what happened, leave the pool usable, and leave no process behind.

The coordinator's model is a `FunctionModel` (tests/workers/agent_kit.py): the real SDK over a
socket is exercised by tests/workers/test_dispatch_e2e.py.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from orchestrator.agents.types import GENERAL, SubagentOutcome, SubagentRequest
from orchestrator.calls.permissions import Allow, Deny
from orchestrator.errors import ModelError
from orchestrator.events import PermissionDecided
from orchestrator.messages import ContentBlock
from orchestrator.model.base import ModelRequest
from orchestrator.model.catalog import default_max_tokens
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    Collected,
    FunctionModel,
    Respond,
    agent,
    allow_all,
    descendants,
    first_prompt,
    request,
    rogue_spawner,
    text,
    tool_use,
    turn_of,
    worker_python,
    workspace_at,
)
from workers.broker import BrokerLimits, ModelBroker
from workers.pool import PoolOptions, WorkerPool, open_worker_pool
from workers.toolhost_runner import (
    HostLaunch,
    HostProcess,
    HostSpawner,
    SandboxedSpawner,
    unsandboxed_spawner,
)

pytestmark = needs_sandbox

PROBE = agent("probe")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return workspace_at(tmp_path)


def probe_then_report(done: str = "report") -> Respond:
    """Turn 1: a Probe call labelled with the prompt; turn 2: `done` and the prompt."""

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        prompt = first_prompt(req)
        if turn_of(req) == 1:
            return tool_use("Probe", {"label": prompt})
        return text(f"{done}: {prompt}")

    return respond


@asynccontextmanager
async def pool_for(
    workspace: Path,
    respond: Respond,
    *,
    spawner: HostSpawner | None = None,
    **options: Any,
) -> AsyncIterator[tuple[WorkerPool, FunctionModel]]:
    model = FunctionModel(respond)
    async with open_worker_pool(
        broker=ModelBroker(model),
        workspace=workspace,
        spawner=spawner,
        options=PoolOptions.model_validate({"max_workers": 3, **options}),
        tools=FACTORY,
    ) as pool:
        yield pool, model


async def run(
    pool: WorkerPool, req: SubagentRequest, events: Collected | None = None
) -> SubagentOutcome:
    return await pool.run(req, on_event=events or Collected(), permission=allow_all)


async def test_a_subagent_runs_in_its_own_read_only_sandbox(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-never-in-a-sandbox")
    events = Collected()
    async with pool_for(workspace, probe_then_report()) as (pool, model):
        out = await run(pool, request(PROBE, "alpha"), events)
        assert out.reason == "completed"
        assert out.result == "report: alpha"
        assert out.num_turns == 2
        assert out.usage.input_tokens == 20
        assert out.worker_pid is not None and out.worker_pid != os.getpid()
        # The Probe's report is what the model saw as its tool_result.
        probe = model.requests[1].messages[-1].tool_results()[0].text()
        assert probe == "label=alpha write failed: Read-only file system key_seen=False"
    assert not (workspace / "probe-alpha.txt").exists()
    kinds = [type(e.event).__name__ for e in events.events]
    assert kinds[0] == "AssistantTurn" and kinds[-1] == "AssistantTurn"
    assert "PermissionDecided" in kinds and "ToolResultsMessage" in kinds
    assert {e.agent_id for e in events.events} == {"agent-t1"}
    assert descendants() == []


async def test_a_writable_agent_type_gets_a_writable_workspace_then_a_fresh_worker(
    workspace: Path,
) -> None:
    writer = agent("writer", writable=True)
    async with pool_for(workspace, probe_then_report()) as (pool, model):
        out = await run(pool, request(writer, "w1"))
        assert out.reason == "completed"
        assert (workspace / "probe-w1.txt").read_text() == "written"
        # The writable worker is not reused: a read-only one takes the next run.
        again = await run(pool, request(PROBE, "r1", "agent-t2"))
        assert again.worker_pid != out.worker_pid
        probe = model.requests[-1].messages[-1].tool_results()[0].text()
        assert "Read-only file system" in probe


@pytest.mark.parametrize("where", ["var_tmp", "tmp"])
async def test_a_scoped_writer_confines_the_warm_writer_or_gets_its_scope_mounted(
    tmp_path: Path, where: str
) -> None:
    # Under /var/tmp the warm writer confines itself (Landlock). Under /tmp it must refuse:
    # the rule for the sandbox's /tmp would cover the workspace bound beneath it. The pool
    # would not even try there; made to, it falls back to a fresh worker with the scope
    # mounted. max_workers=1: the warm writer counts within it.
    base = Path(tempfile.mkdtemp(dir="/var/tmp")) if where == "var_tmp" else tmp_path
    workspace = workspace_at(base)
    writer = agent("writer", writable=True)
    scope = workspace / "scope"
    scope.mkdir()
    try:
        async with pool_for(workspace, probe_then_report(), max_workers=1) as (pool, model):
            assert pool.landlock == (where == "var_tmp")
            pool.landlock = True
            pool.expect_writers()
            with trio.fail_after(30):
                await pool.wait_idle(1)
            (warm,) = pool.worker_pids()
            req = dataclasses.replace(request(writer, "w1"), write_paths=(scope,))
            out = await run(pool, req)
            assert out.reason == "completed"
            probe = model.requests[-1].messages[-1].tool_results()[0].text()
            if where == "var_tmp":  # the warm worker, confined: outside its scope, EACCES
                assert out.worker_pid == warm
                assert "write failed: Permission denied" in probe
            else:  # a fresh worker with only the scope mounted writable
                assert out.worker_pid != warm
                assert "write failed: Read-only file system" in probe
            assert not (workspace / "probe-w1.txt").exists()
            assert out.worker_pid not in pool.worker_pids()  # never reused
        assert descendants() == []
    finally:
        if where == "var_tmp":
            shutil.rmtree(base)


async def test_the_pool_keeps_as_many_writers_warm_as_the_session_ran_scoped_at_once() -> None:
    # One writer is kept warm at first; two scoped writers at once teach the pool to keep two,
    # so the session's next batch of two finds both warm (Landlock, so under /var/tmp).
    base = Path(tempfile.mkdtemp(dir="/var/tmp"))
    workspace = workspace_at(base)
    writer = agent("writer", writable=True)
    scopes = [workspace / "a", workspace / "b"]
    for scope in scopes:
        scope.mkdir()
    try:
        async with pool_for(workspace, probe_then_report()) as (pool, _):
            if not pool.landlock:
                pytest.skip("no Landlock ABI 2 here: scoped writers get fresh workers")
            pool.expect_writers()
            with trio.fail_after(30):
                await pool.wait_idle(1, writers=1)
            assert pool.idle_writers == 1
            outcomes: list[SubagentOutcome] = []

            async def one(name: str, scope: Path) -> None:
                req = dataclasses.replace(request(writer, name), write_paths=(scope,))
                outcomes.append(await run(pool, req))

            async with trio.open_nursery() as nursery:
                for name, scope in zip(("w1", "w2"), scopes, strict=True):
                    nursery.start_soon(one, name, scope)
            assert [o.reason for o in outcomes] == ["completed", "completed"]
            with trio.fail_after(30):
                await pool.wait_idle(2, writers=2)
            assert pool.idle_writers == 2
    finally:
        shutil.rmtree(base)


CHECKS = (
    "sleeper() { for c in /proc/[0-9]*/cmdline; do "
    "test \"$(tr '\\0' ' ' < $c 2>/dev/null)\" = 'sleep 321 ' && echo found sleeper; done; }; "
    "files() { for p in /tmp/planted /dev/shm/planted /tmp/d /tmp/link; do "
    "test -e $p -o -L $p && echo found $p; done; }; "
)
"""Shell functions that print `found ...` for each thing `PLANT` leaves in a worker."""
PLANT = CHECKS + (
    "echo planted > /tmp/planted; echo planted > /dev/shm/planted; "
    "mkdir -p /tmp/d/e && echo planted > /tmp/d/e/f && chmod 0 /tmp/d/e /tmp/d; "
    "ln -s {workspace}/a.txt /tmp/link; "
    "setsid sleep 321 > /dev/null 2>&1 < /dev/null & "
    'for i in $(seq 100); do test -n "$(sleeper)" && break; sleep 0.05; done; sleeper; files'
)
LOOK = CHECKS + "sleeper; files; cat {workspace}/a.txt"
DEEP = "mkdir -p /tmp/$(printf 'n/%.0s' $(seq 300)) && echo deep"


@pytest.mark.parametrize("zygote", ["auto", "off"])
async def test_read_only_workers_are_reused_bash_included_and_keep_nothing_of_a_run(
    workspace: Path, zygote: str
) -> None:
    """A read-only type is reused whatever its tools, Bash included (`general`'s): the
    workspace is read-only, nothing a command starts outlives its call, and the worker
    empties its private /tmp and /dev/shm after each run. A run that leaves there what it
    cannot empty (a tree deeper than `sandbox.scratch.MAX_DEPTH`) gets its worker replaced.
    Writable types are never reused (the test above)."""
    commands = {"plant": PLANT, "look": LOOK, "deep": DEEP}

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if turn_of(req) == 1:
            command = commands[first_prompt(req)].replace("{workspace}", str(workspace))
            return tool_use("Bash", {"command": command})
        return text(req.messages[-1].tool_results()[0].text())

    assert GENERAL.tools == ("Read", "Glob", "Grep", "LS", "Think", "Bash")
    assert not GENERAL.writable and not GENERAL.leaves_state
    async with pool_for(workspace, respond, max_workers=1, zygote=zygote) as (pool, _):
        planted = await run(pool, request(GENERAL, "plant", "agent-a"))
        assert planted.result.split("\n") == [
            "found sleeper",
            "found /tmp/planted",
            "found /dev/shm/planted",
            "found /tmp/d",
            "found /tmp/link",
        ], planted.result
        assert not [p for p in descendants() if "321" in p.cmdline()]
        looked = await run(pool, request(GENERAL, "look", "agent-b"))
        assert looked.worker_pid == planted.worker_pid
        assert "found" not in looked.result, looked.result
        # The workspace, bound below /tmp, is still there: the sweep kept its mount.
        assert "alpha\nbeta" in looked.result, looked.result
        deep = await run(pool, request(GENERAL, "deep", "agent-c"))
        assert (deep.result, deep.worker_pid) == ("deep", planted.worker_pid)
        after = await run(pool, request(GENERAL, "look", "agent-d"))
        assert after.worker_pid != deep.worker_pid
        assert "found" not in after.result and "alpha" in after.result, after.result
        runs = (planted, looked, deep, after)
        assert all(o.reason == "completed" for o in runs), runs
    assert not (workspace / "planted").exists()


async def test_an_eager_pool_starts_its_workers_at_once(workspace: Path) -> None:
    async with pool_for(workspace, probe_then_report(), start="eager") as (pool, _):
        with trio.fail_after(30):
            await pool.wait_idle(3)
        pids = pool.worker_pids()
        assert len(set(pids)) == 3
        out = await run(pool, request(PROBE, "x"))
        assert out.worker_pid in pids
    assert descendants() == []


async def test_permission_answers_come_from_the_coordinator(workspace: Path) -> None:
    asked: list[tuple[str, dict[str, object]]] = []

    async def deny_probe(tool: str, input: dict[str, object]) -> Allow | Deny:
        asked.append((tool, input))
        if tool == "Probe":
            return Deny("Probe is not allowed for subagents.", rule="test")
        return Allow()

    events = Collected()
    async with pool_for(workspace, probe_then_report()) as (pool, model):
        out = await pool.run(request(PROBE, "p"), on_event=events, permission=deny_probe)
    assert out.reason == "completed"
    assert asked == [("Probe", {"label": "p"})]
    result = model.requests[1].messages[-1].tool_results()[0]
    assert result.is_error and "Probe is not allowed for subagents." in result.text()
    decided = [e.event for e in events.events if isinstance(e.event, PermissionDecided)]
    assert [(d.decision, d.rule) for d in decided] == [("deny", "test")]


# --- faults ---------------------------------------------------------------------------------


async def test_a_worker_sigkilled_mid_run_is_a_crash_outcome_and_is_replaced(
    workspace: Path,
) -> None:
    asked = trio.Event()

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if first_prompt(req) == "doomed":
            asked.set()
            await trio.sleep_forever()
        return text("fine")

    async with pool_for(workspace, respond, max_workers=1) as (pool, _):
        outcomes: list[SubagentOutcome] = []

        async def doomed() -> None:
            outcomes.append(await run(pool, request(PROBE, "doomed")))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(doomed)
                await asked.wait()
                (victim,) = pool.worker_pids()
                os.kill(worker_python(victim).pid, signal.SIGKILL)
        (out,) = outcomes
        assert out.reason == "worker_crashed"
        assert "killed by SIGKILL" in out.result
        assert out.worker_pid == victim
        after = await run(pool, request(PROBE, "after", "agent-t2"))
        assert after.reason == "completed" and after.worker_pid != victim
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie"
    assert descendants() == []


async def test_a_hung_worker_is_killed_at_its_wall_time(workspace: Path) -> None:
    blocker = agent("blocker", tools=("Block",))

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if first_prompt(req) == "hang" and turn_of(req) == 1:
            return tool_use("Block", {"seconds": 1000})
        return text("done")

    async with pool_for(workspace, respond, wall_time_s=1.5, max_workers=1) as (pool, _):
        out = await run(pool, request(blocker, "hang"))
        assert out.reason == "worker_limit"
        assert "wall-time limit of 1.5 s" in out.result
        after = await run(pool, request(PROBE, "after", "agent-t2"))
        assert after.reason == "completed"
    assert descendants() == []


@pytest.mark.parametrize(
    ("mode", "reason", "says"),
    [
        ("flood-garbage", "worker_protocol", "lines that are not protocol messages"),
        ("flood-logs", "worker_limit", "bytes of logs"),
        ("hang", "worker_limit", "wall-time limit"),
    ],
)
async def test_a_misbehaving_worker_is_killed_and_the_pool_goes_on(
    workspace: Path, mode: str, reason: str, says: str
) -> None:
    async with pool_for(
        workspace, probe_then_report(), spawner=rogue_spawner(mode), wall_time_s=2, max_workers=1
    ) as (pool, _):
        with trio.fail_after(30):
            out = await run(pool, request(PROBE, "x"))
        assert out.reason == reason
        assert says in out.result
        after = await run(pool, request(PROBE, "after", "agent-t2"))
        assert after.reason == "completed"
    assert descendants() == []


async def test_a_worker_that_cannot_start_is_an_outcome(workspace: Path) -> None:
    def failing(launch: HostLaunch) -> AbstractAsyncContextManager[HostProcess]:
        return unsandboxed_spawner(dataclasses.replace(launch, argv=("/bin/false",)))

    async with pool_for(workspace, probe_then_report(), spawner=failing) as (pool, _):
        out = await run(pool, request(PROBE, "x"))
    assert out.reason == "worker_unavailable"
    assert "a worker exited before it was ready (exit status 1)" in out.result
    assert out.worker_pid is None


async def test_some_garbage_on_the_protocol_is_survived(workspace: Path) -> None:
    async with pool_for(workspace, probe_then_report(), spawner=rogue_spawner("garbage")) as (
        pool,
        _,
    ):
        out = await run(pool, request(PROBE, "x"))
    assert (out.reason, out.result) == ("completed", "survived the garbage")


async def test_a_subagent_that_exceeds_its_max_turns(workspace: Path) -> None:
    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        return tool_use("LS", {"path": str(workspace)}, id=f"toolu_{len(req.messages)}")

    async with pool_for(workspace, respond) as (pool, model):
        out = await run(pool, request(agent("short", max_turns=2), "loop forever"))
        assert out.reason == "max_turns"
        assert out.num_turns == 2 and len(model.requests) == 2
        assert (await run(pool, request(PROBE, "after", "agent-t2"))).reason == "max_turns"


async def test_a_model_error_inside_a_subagent(workspace: Path) -> None:
    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if first_prompt(req) == "fail":
            raise ModelError("The API is down (503).", status=503)
        return text("ok")

    events = Collected()
    async with pool_for(workspace, respond) as (pool, _):
        out = await run(pool, request(PROBE, "fail"), events)
        assert (out.reason, out.result) == ("model_error", "The API is down (503).")
        assert (await run(pool, request(PROBE, "after", "agent-t2"))).reason == "completed"


@pytest.mark.parametrize(
    ("tool", "input", "limits", "says"),
    [
        ("Hog", {"mib": 400}, {"max_memory_bytes": 200 * 1024**2}, "MiB of memory"),
        ("Block", {"seconds": 30, "spin": True}, {"max_cpu_s": 0.5}, "s of CPU time"),
    ],
)
async def test_a_worker_past_its_memory_or_cpu_limit_is_killed(
    workspace: Path, tool: str, input: dict[str, object], limits: dict[str, Any], says: str
) -> None:
    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if first_prompt(req) == "greedy":
            return tool_use(tool, input)
        return text("ok")

    async with pool_for(workspace, respond, monitor_interval_s=0.1, max_workers=1, **limits) as (
        pool,
        _,
    ):
        with trio.fail_after(30):
            out = await run(pool, request(agent("greedy", tools=(tool,)), "greedy"))
        assert out.reason == "worker_limit"
        assert says in out.result
        assert (await run(pool, request(PROBE, "after", "agent-t2"))).reason == "completed"
    assert descendants() == []


async def test_cancelling_ten_running_subagents_stops_them_and_keeps_the_workers(
    workspace: Path,
) -> None:
    waiting = 0
    all_waiting = trio.Event()

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        nonlocal waiting
        if first_prompt(req).startswith("slow"):
            waiting += 1
            if waiting == 10:
                all_waiting.set()
            await trio.sleep_forever()
        return text("ok")

    reader = agent("reader", tools=("Read", "LS"))
    async with pool_for(workspace, respond, max_workers=10) as (pool, _):
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(run, pool, request(reader, f"slow {i}", f"agent-{i}"))
                await all_waiting.wait()
                assert len(pool.worker_pids()) == 10
                nursery.cancel_scope.cancel()
        # Each worker interrupted its run and answered, so each is kept warm.
        assert pool.idle == 10
        assert (await run(pool, request(PROBE, "after", "agent-t2"))).reason == "completed"
    assert descendants() == []


async def test_a_coordinator_that_crashes_leaves_no_worker_behind(workspace: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, structlog, trio
        from pathlib import Path
        from tests.workers.agent_kit import FACTORY, FunctionModel
        from workers.broker import ModelBroker
        from workers.pool import PoolOptions, open_worker_pool

        async def main():
            structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
            broker = ModelBroker(FunctionModel(None))
            options = PoolOptions(max_workers=2, start="eager")
            async with open_worker_pool(broker=broker, workspace=Path({str(workspace)!r}),
                                        options=options, tools=FACTORY) as pool:
                await pool.wait_idle(2)
                print(" ".join(str(p) for p in pool.worker_pids()), flush=True)
                await trio.sleep_forever()

        trio.run(main)
        """
    )
    coordinator = await trio.lowlevel.open_process(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert coordinator.stdout is not None
    with trio.fail_after(30):
        line = b""
        while not line.endswith(b"\n"):
            line += await coordinator.stdout.receive_some()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2
    tree = [p for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children()]]
    coordinator.kill()
    await coordinator.wait()
    await coordinator.stdout.aclose()
    with trio.fail_after(10):
        # Another process's exit has no event to wait on: poll it.
        while any(p.is_running() and p.status() != "zombie" for p in tree):  # noqa: ASYNC110
            await trio.sleep(0.05)


async def test_a_used_up_session_budget_ends_the_subagent(workspace: Path) -> None:
    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        return tool_use("LS", {"path": str(workspace)}, id=f"toolu_{len(req.messages)}")

    model = FunctionModel(respond)  # 10 input and 5 output tokens a response
    # A request reserves max_tokens (the model's default: 32,000 for a model the table does
    # not know) of output before it is sent (workers/broker.py): room for the first; after its
    # 5 output tokens, not for a second.
    reserved = default_max_tokens(model.model)
    broker = ModelBroker(model, limits=BrokerLimits(max_output_tokens=reserved + 4))
    async with open_worker_pool(
        broker=broker, workspace=workspace, options=PoolOptions(max_workers=1)
    ) as pool:
        out = await run(pool, request(agent("reader", tools=("LS",)), "x"))
    assert out.reason == "budget_exceeded"
    assert f"budget of {reserved + 4} output tokens would be passed" in out.result
    assert "not sent" in out.result
    assert len(model.requests) == 1 and out.num_turns == 2


async def test_the_session_composition_uses_the_policy(workspace: Path) -> None:
    from orchestrator.calls.policy import load_session_policy
    from orchestrator.cli.wiring import open_subagents
    from orchestrator.limits import Limits
    from orchestrator.session.later import LaterSubagents
    from orchestrator.tools.base import ToolContext
    from policies.pool import PoolConfig

    policy = load_session_policy(workspace, floor_proven=True)
    ctx = ToolContext(workspace=workspace, cwd=workspace)
    broker = ModelBroker(FunctionModel(probe_then_report()))
    async with open_subagents(ctx, policy, broker, Limits(), PoolConfig()) as later:
        assert isinstance(later, LaterSubagents)
        assert later.opened is None  # opened once the session's first request is on its way
        out = await later.run(request(PROBE, "s"), on_event=Collected(), permission=allow_all)
        assert out.reason == "completed"
        assert broker.usage.input_tokens == 20
        assert isinstance(later.opened, WorkerPool)
        assert later.opened.options.max_workers == 10
    assert descendants() == []


async def test_a_warm_start_that_fails_is_tried_again(workspace: Path) -> None:
    """The pool's first background start fails (a real sandboxed start of a program that exits
    at once, as a start that timed out would end): the pool tries again after a pause, so the
    worker is warm when the run comes, and the run takes it."""
    inner = SandboxedSpawner()
    spawned = 0

    def fails_first(launch: HostLaunch) -> AbstractAsyncContextManager[HostProcess]:
        nonlocal spawned
        spawned += 1
        if spawned == 1:
            return inner(dataclasses.replace(launch, argv=("/bin/false",)))
        return inner(launch)

    async with pool_for(
        workspace, probe_then_report(), spawner=fails_first, max_workers=1, start="eager"
    ) as (pool, _):
        with trio.fail_after(30):
            await pool.wait_idle(1)
        assert spawned == 2
        [pid] = pool.worker_pids()
        out = await run(pool, request(PROBE, "x"))
        assert (out.reason, out.worker_pid, spawned) == ("completed", pid, 2)
    assert descendants() == []
