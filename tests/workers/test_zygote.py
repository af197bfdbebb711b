"""Workers forked from the zygote stay isolated from each other and from the zygote (issue 15,
item 4), checked by attack and on the host afterwards.

A victim subagent's Bash holds a `sleep` (a dumpable tool process) in one forked worker while
an attacker subagent's Bash, in a sibling forked worker, is given every pid the victim's tree
and the zygote's have in any pid namespace (from `NSpid` on the host), and tries kill -9,
ptrace, /proc/<pid>/mem and environ, and process_vm_readv on each. It also looks for the
victim in its /proc, in /tmp, and at the zygote's writable proc, and tries a nested user
namespace. The same attempts against its own child succeed (so the attack works), none
against the others, and the host sees the victim and the zygote still running.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

import psutil
import trio
from structlog.testing import capture_logs

from orchestrator.messages import ContentBlock
from orchestrator.model.base import ModelRequest
from sandbox.spec import Limits, SandboxSpec
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    Collected,
    FunctionModel,
    agent,
    allow_all,
    descendants,
    first_prompt,
    request,
    text,
    tool_use,
    turn_of,
    workspace_at,
)
from workers.broker import ModelBroker
from workers.pool import PoolOptions, open_worker_pool
from workers.toolhost_runner import SandboxedSpawner
from workers.zygote_spawner import ZygoteSpawner

pytestmark = needs_sandbox

ATTACK = textwrap.dedent(
    """
    import ctypes, json, os, signal, subprocess, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                      ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    def attempts(pid):
        got = []
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                f.read(16)
            got.append("environ")
        except OSError:
            pass
        try:
            os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
            got.append("mem")
        except OSError:
            pass
        if libc.ptrace(0x4206, pid, None, None) == 0:  # PTRACE_SEIZE
            got.append("ptrace")
        buf = ctypes.create_string_buffer(64)
        local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 64), iovec(0x400000, 64)
        if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
            got.append("vm_readv")
        try:
            os.kill(pid, signal.SIGKILL)
            got.append("kill")
        except OSError:
            pass
        return got
    def status(pid, key):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key + ":"):
                return line.split()[1]
    # Ours: this process, its shell, and the worker they run under (forked, so its command
    # line is the zygote's), with their threads.
    mine, pid = [], os.getpid()
    while pid:
        mine.append(pid)
        if b"workers.zygote" in open(f"/proc/{pid}/cmdline", "rb").read():
            break
        pid = int(status(pid, "PPid"))
    mine += [int(t) for p in mine for t in os.listdir(f"/proc/{p}/task")]
    visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    seen = []
    for pid in visible:
        try:
            seen.append(open(f"/proc/{pid}/cmdline", "rb").read())
        except OSError:
            pass
    child = subprocess.Popen(["sleep", "30"])
    control = attempts(child.pid)
    child.wait()
    hits = {t: attempts(t) for t in map(int, sys.argv[1:]) if t not in mine}
    print("ATTACK " + json.dumps({
        "control": control,
        "hits": {t: h for t, h in hits.items() if h},
        "tried": len(hits),
        "sees_victim": b"sleep\\x0099\\x00" in b"".join(seen),
        "tmp": os.listdir("/tmp"),
        "zygote_proc": os.listdir("/dev/.proc") if os.path.isdir("/dev/.proc") else [],
        "userns": libc.unshare(0x10000000),
    }))
    """
)


def _ns_pids(procs: Sequence[psutil.Process]) -> set[int]:
    """Every pid these processes have, in every pid namespace they are in."""
    found: set[int] = set()
    for proc in procs:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                found.update(int(p) for p in line.split()[1:])
    return found


def _victim_sleep() -> psutil.Process | None:
    for proc in descendants():
        try:
            if proc.name() == "sleep" and "99" in proc.cmdline():
                return proc
        except psutil.NoSuchProcess:
            pass
    return None


async def test_a_forked_worker_cannot_reach_its_sibling_or_the_zygote(tmp_path: Path) -> None:
    workspace = workspace_at(tmp_path)
    (workspace / "attack.py").write_text(ATTACK)
    shell = agent("shell", tools=("Bash",))
    victim_command = "echo victim > /tmp/victim-mark && sleep 99"
    targets: list[psutil.Process] = []

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if turn_of(req) > 1:
            return text("done")
        if first_prompt(req) == "victim":
            return tool_use("Bash", {"command": victim_command, "timeout": 120_000})
        pids = " ".join(map(str, sorted(_ns_pids(targets))))
        return tool_use("Bash", {"command": f"python3 -I -S attack.py {pids}"})

    model = FunctionModel(respond)
    async with (
        open_worker_pool(
            broker=ModelBroker(model),
            workspace=workspace,
            tools=FACTORY,
            options=PoolOptions(max_workers=2),
        ) as pool,
        trio.open_nursery() as nursery,
    ):
        victim = request(shell, "victim", "agent-victim")
        nursery.start_soon(lambda: pool.run(victim, on_event=Collected(), permission=allow_all))
        with trio.fail_after(60):
            while (sleep := _victim_sleep()) is None:  # noqa: ASYNC110 (a process: poll)
                await trio.sleep(0.05)
        # The victim's tool, its worker and the zygote (every ancestor up to the pool).
        ours = psutil.Process()
        targets += [sleep, *(p for p in sleep.parents() if p.pid != ours.pid)]
        targets = [p for p in targets if p.pid not in {a.pid for a in ours.parents()}]
        before = {p.pid: p.create_time() for p in targets}
        names = [p.name() for p in targets]
        # sleep, bash, the worker, then the zygote (not bwrap: a forked worker), its
        # waiting parent and the two bwrap processes of its sandbox.
        assert names[3].startswith("python") and names.count("bwrap") == 2, names
        with trio.fail_after(60):
            attack = await pool.run(
                request(shell, "attacker", "agent-attacker"),
                on_event=Collected(),
                permission=allow_all,
            )
        assert attack.reason == "completed", attack
        assert {p.pid: p.create_time() for p in targets if p.is_running()} == before
        assert all(p.status() != psutil.STATUS_ZOMBIE for p in targets)
        nursery.cancel_scope.cancel()
    result = next(
        r.messages[-1].tool_results()[0].text()
        for r in model.requests
        if first_prompt(r) == "attacker" and turn_of(r) == 2
    )
    assert "ATTACK " in result, result
    report = json.loads(result.split("ATTACK ", 1)[1])
    assert {"environ", "mem", "kill"} <= set(report["control"]), report  # the attack works
    assert report["tried"] > 5 and report["hits"] == {}, report
    assert not report["sees_victim"] and "victim-mark" not in report["tmp"], report
    assert report["zygote_proc"] == [] and report["userns"] == -1, report
    assert descendants() == []


async def test_without_a_zygote_workers_start_fresh_and_the_log_says_why_once(
    tmp_path: Path,
) -> None:
    workspace = workspace_at(tmp_path)

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        return text("done")

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            spawner = ZygoteSpawner(SandboxedSpawner(), nursery, module="tests.workers.no_zygote")
            async with open_worker_pool(
                broker=ModelBroker(FunctionModel(respond)),
                workspace=workspace,
                spawner=spawner,
                tools=FACTORY,
                options=PoolOptions(max_workers=2, start="eager"),
            ) as pool:
                await pool.wait_idle(2)
                out = await pool.run(
                    request(agent("probe"), "x"), on_event=Collected(), permission=allow_all
                )
                assert out.reason == "completed", out
                assert out.worker_pid is not None
                assert psutil.Process(out.worker_pid).name() == "bwrap"  # a fresh worker
            await spawner.aclose()
    assert spawner.unavailable is not None and "not permitted" in spawner.unavailable
    said = [e for e in logs if e["event"].startswith("no zygote for pool workers")]
    assert len(said) == 1, said
    assert descendants() == []


async def test_a_forked_worker_past_its_process_limit_is_killed(tmp_path: Path) -> None:
    """A forked worker has no cgroup of its own, and RLIMIT_NPROC does not bind host root:
    the spawner's watchdog counts its processes through its own proc."""
    workspace = workspace_at(tmp_path)
    bomb = "for i in $(seq 40); do sleep 60 & done; wait"

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if turn_of(req) == 1:
            return tool_use("Bash", {"command": bomb})
        return text("done")

    limits = Limits(wall_time_s=None, cpu_time_s=None, processes=16)
    async with open_worker_pool(
        broker=ModelBroker(FunctionModel(respond)),
        workspace=workspace,
        spawner=SandboxedSpawner(SandboxSpec(limits=limits)),
        tools=FACTORY,
        options=PoolOptions(max_workers=1),
    ) as pool:
        with trio.fail_after(60):
            out = await pool.run(
                request(agent("shell", tools=("Bash",)), "bomb"),
                on_event=Collected(),
                permission=allow_all,
            )
    assert out.reason == "worker_crashed", out
    assert descendants() == []
