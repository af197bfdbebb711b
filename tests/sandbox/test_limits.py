"""Limits: exit classification, cgroup discovery, the process watchdog without cgroups."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from sandbox.host import SandboxHost
from sandbox.limits import (
    CgroupSupport,
    SandboxCgroup,
    classify_exit,
    count_sandbox_processes,
    detect_cgroups,
)
from sandbox.run import open_sandboxed_process, run_sandboxed
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

LIMITS = Limits()


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (0, None),
        (1, None),
        (128 + signal.SIGXCPU, "cpu_time"),
        (128 + signal.SIGXFSZ, "file_size"),
        (-signal.SIGXCPU, "cpu_time"),
        (128 + signal.SIGKILL, None),
        (128 + signal.SIGSEGV, None),
    ],
)
def test_classify_exit(code: int, expected: str | None) -> None:
    assert classify_exit(code, LIMITS) == expected


def test_classify_exit_ignores_signals_of_unset_limits() -> None:
    unlimited = Limits(cpu_time_s=None, file_size_bytes=None)
    assert classify_exit(128 + signal.SIGXCPU, unlimited) is None
    assert classify_exit(128 + signal.SIGXFSZ, unlimited) is None


def _fake_proc(root: Path, cgroup: str, mountinfo: str) -> Path:
    proc = root / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def test_detect_cgroup_v2_below_our_own(scratch: Path) -> None:
    mount = scratch / "cg2"
    own = mount / "user.slice" / "warren.service"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text("cpu memory pids\n")
    proc = _fake_proc(
        scratch,
        "0::/user.slice/warren.service\n",
        f"30 25 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n",
    )
    support = detect_cgroups(proc_self=proc, probe_write=False)
    assert support.version == 2
    assert support.pids_parent == own and support.memory_parent == own


def test_detect_cgroup_v2_without_delegated_controllers_falls_back(scratch: Path) -> None:
    mount, pids = scratch / "cg2", scratch / "pids"
    mount.mkdir()
    (mount / "cgroup.subtree_control").write_text("\n")
    pids.mkdir()
    proc = _fake_proc(
        scratch,
        "8:pids:/\n0::/\n",
        f"30 25 0:26 / {mount} rw - cgroup2 cgroup2 rw\n"
        f"31 25 0:27 / {pids} rw - cgroup cgroup rw,pids\n",
    )
    support = detect_cgroups(proc_self=proc, probe_write=False)
    assert (support.version, support.pids_parent, support.memory_parent) == (1, pids, None)


def test_detect_nothing_usable(scratch: Path) -> None:
    proc = _fake_proc(
        scratch,
        "0::/docker/abc\n",
        "30 25 0:26 /docker/other /sys/fs/cgroup ro - cgroup2 cgroup2 ro\n",
    )
    support = detect_cgroups(proc_self=proc, probe_write=False)
    assert not support.available
    assert "watchdog" in support.note


def test_sandbox_cgroup_is_created_limited_and_removed(host: SandboxHost) -> None:
    if not host.cgroups.available:
        pytest.skip(host.cgroups.note)
    cgroup = SandboxCgroup.create(host.cgroups, Limits(processes=33))
    assert cgroup is not None
    directories = list(cgroup.directories)
    if host.cgroups.pids_parent is not None:
        pids_dir = host.cgroups.pids_parent / directories[0].name
        assert (pids_dir / "pids.max").read_text().strip() == "33"
    assert not cgroup.pids_max_hit()
    assert cgroup.try_remove()
    assert not any(d.exists() for d in directories)


async def test_no_cgroup_left_behind(
    host: SandboxHost, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cgroups this run created (recorded as `SandboxCgroup.create` returns them) are gone
    after it; other processes on the machine may create and remove their own meanwhile."""
    if not host.cgroups.available:
        pytest.skip(host.cgroups.note)
    created: list[Path] = []
    real_create = SandboxCgroup.create.__func__  # type: ignore[attr-defined]

    def recording_create(
        cls: type[SandboxCgroup], support: CgroupSupport, limits: Limits
    ) -> SandboxCgroup | None:
        cgroup: SandboxCgroup | None = real_create(cls, support, limits)
        if cgroup is not None:
            created.extend(cgroup.directories)
        return cgroup

    monkeypatch.setattr(SandboxCgroup, "create", classmethod(recording_create))
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=scratch),))
    result = await run_sandboxed(spec, ["true"], host=host)
    assert result.exit_code == 0
    assert created, "the run made no cgroup although the host offers them"
    assert [d for d in created if d.exists()] == []


async def test_watchdog_leaves_counting_to_a_cgroup_that_caps_processes(
    host: SandboxHost, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the sandbox's cgroup holds its process limit (`pids.max`: the kernel refuses the
    forks past it), the watchdog only looks for a refusal: it never counts the sandbox's
    processes (ten counts a second cost a Ray node's actor, or the coordinator of local
    workers, 6-9 ms of CPU a second per sandbox). Both checks are the real ones, recorded."""
    if host.cgroups.pids_parent is None:
        pytest.skip(host.cgroups.note)
    import sandbox.run

    looks: list[str] = []
    looked_twice = trio.Event()
    real_hit = SandboxCgroup.pids_max_hit

    def recording_hit(self: SandboxCgroup) -> bool:
        looks.append("pids.events")
        if looks.count("pids.events") == 2:
            looked_twice.set()  # seen after the whole look: the watchdog awaits only its sleep
        return real_hit(self)

    def recording_count(bwrap_pid: int) -> int | None:
        looks.append("count")
        return count_sandbox_processes(bwrap_pid)

    monkeypatch.setattr(SandboxCgroup, "pids_max_hit", recording_hit)
    monkeypatch.setattr(sandbox.run, "count_sandbox_processes", recording_count)
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=scratch),), limits=Limits(processes=32))
    async with open_sandboxed_process(spec, ["sleep", "60"], host=host, private_pipes=True):
        with trio.fail_after(30):
            await looked_twice.wait()
    assert "count" not in looks, looks


async def test_watchdog_stops_a_fork_bomb_without_cgroups(host: SandboxHost, scratch: Path) -> None:
    """As host root RLIMIT_NPROC is not enforced, so without a cgroup only the watchdog
    stands between a fork bomb and the host (a bounded one here: 2**8 processes at most)."""
    no_cgroups = host.model_copy(
        update={
            "cgroups": CgroupSupport(
                version=None, pids_parent=None, memory_parent=None, note="disabled for the test"
            )
        }
    )
    script = (
        "import os, time\n"
        "def bomb(depth):\n"
        "    for _ in range(2):\n"
        "        try:\n"
        "            if os.fork() == 0:\n"
        "                if depth < 7:\n"
        "                    bomb(depth + 1)\n"
        "                time.sleep(60)\n"
        "                os._exit(0)\n"
        "        except OSError:\n"
        "            pass\n"
        "bomb(0)\n"
        "time.sleep(60)\n"
    )
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=scratch),), limits=Limits(processes=32, wall_time_s=30.0)
    )
    result = await run_sandboxed(spec, ["python3", "-I", "-S", "-c", script], host=no_cgroups)
    assert result.killed_by_limit == "processes", result
    assert result.duration_s < 20


def test_count_sandbox_processes_of_a_non_sandbox() -> None:
    """A child whose root is the host's must not be counted (its /proc is the host's: every
    process on the machine), which is also what a sandbox looks like before bwrap pivots."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert count_sandbox_processes(os.getpid()) is None
    finally:
        child.kill()
        child.wait()
