"""The runner: results, streaming, long-lived processes, teardown and cancellation."""

# Host-side checks of small scratch trees after the sandbox ended; blocking is fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest
import trio

from sandbox.errors import SandboxConfigError
from sandbox.host import SandboxHost
from sandbox.run import RunAs, launch_prefix, open_sandboxed_process, run_sandboxed
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot


def _spec(ws: Path, **kwargs: object) -> SandboxSpec:
    values: dict[str, object] = {"workspaces": (WorkspaceRoot(path=ws),), "home": ws}
    values.update(kwargs)
    return SandboxSpec.model_validate(values)


def _our_bwraps() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "bwrap" in p.name()]


async def test_exit_code_output_and_stdin(host: SandboxHost, scratch: Path) -> None:
    result = await run_sandboxed(
        _spec(scratch),
        ["sh", "-c", 'read line; echo "got $line"; echo oops >&2; pwd; echo "$HOME"; exit 7'],
        stdin=b"hello\n",
        host=host,
    )
    assert result.exit_code == 7
    assert result.stdout.decode().splitlines() == ["got hello", str(scratch), str(scratch)]
    assert result.stderr == b"oops\n"
    assert not result.ok and result.killed_by_limit is None and not result.timed_out
    assert result.sandbox.startswith("bwrap ")


async def test_streaming_callback_sees_everything(host: SandboxHost, scratch: Path) -> None:
    seen: list[tuple[str, bytes]] = []
    result = await run_sandboxed(
        _spec(scratch),
        ["sh", "-c", "echo a; echo b >&2"],
        on_output=lambda name, data: seen.append((name, data)),
        host=host,
    )
    assert b"".join(d for n, d in seen if n == "stdout") == result.stdout == b"a\n"
    assert b"".join(d for n, d in seen if n == "stderr") == result.stderr == b"b\n"


async def test_cwd_and_read_only(host: SandboxHost, scratch: Path) -> None:
    (scratch / "sub").mkdir()
    spec = _spec(scratch).read_only()
    result = await run_sandboxed(spec, ["sh", "-c", "pwd; touch x"], cwd=scratch / "sub", host=host)
    assert result.stdout.decode().strip() == str(scratch / "sub")
    assert b"Read-only file system" in result.stderr
    assert not (scratch / "sub" / "x").exists()


async def test_config_errors_are_raised_before_anything_runs(
    host: SandboxHost, scratch: Path
) -> None:
    with pytest.raises(SandboxConfigError):
        await run_sandboxed(_spec(scratch / "missing"), ["true"], host=host)


async def test_cancellation_kills_and_cleans_up(host: SandboxHost, scratch: Path) -> None:
    with trio.move_on_after(0.5) as scope:
        await run_sandboxed(_spec(scratch), ["sleep", "60"], host=host)
    assert scope.cancelled_caught
    assert _our_bwraps() == []
    assert sorted(p.name for p in scratch.iterdir()) == []  # nothing left in the tree


async def test_long_lived_process_round_trip_and_teardown(host: SandboxHost, scratch: Path) -> None:
    async with open_sandboxed_process(_spec(scratch), ["cat"], host=host) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send_all(b"ping\n")
        assert await proc.stdout.receive_some(100) == b"ping\n"
        pid = proc.pid
        assert proc.returncode is None
    assert proc.returncode is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _our_bwraps() == []


async def test_teardown_sends_sigterm_to_the_command_first(
    host: SandboxHost, scratch: Path
) -> None:
    script = "trap 'echo bye > got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    async with open_sandboxed_process(_spec(scratch), ["sh", "-c", script], host=host) as proc:
        assert proc.stdout is not None
        assert await proc.stdout.receive_some(100) == b"ready\n"
    assert (scratch / "got-term").read_text() == "bye\n"
    assert proc.returncode == 0


async def test_teardown_kills_a_child_that_ignores_sigterm(
    host: SandboxHost, scratch: Path
) -> None:
    marker = f"ignore-term-{os.getpid()}"
    script = f"trap '' TERM; exec -a {marker} sleep 60 || sleep 60"
    with trio.fail_after(15):
        async with open_sandboxed_process(
            _spec(scratch), ["bash", "-c", script], host=host
        ) as proc:
            await trio.sleep(0.2)
    assert proc.returncode is not None
    assert _our_bwraps() == []


async def test_cancellation_inside_a_long_lived_block(host: SandboxHost, scratch: Path) -> None:
    with trio.move_on_after(0.3) as scope:
        async with open_sandboxed_process(_spec(scratch), ["sleep", "60"], host=host) as proc:
            await proc.wait()
    assert scope.cancelled_caught
    assert proc.returncode is not None
    assert _our_bwraps() == []


async def test_wall_time_applies_to_long_lived_processes(host: SandboxHost, scratch: Path) -> None:
    spec = _spec(scratch, limits=Limits(wall_time_s=0.3))
    async with open_sandboxed_process(spec, ["sleep", "60"], host=host) as proc:
        await proc.wait()
    assert proc.killed_by_limit == "wall_time"


async def test_outlives_thread_cache(
    host: SandboxHost, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap's --die-with-parent fires when the *thread* that spawned it exits. trio's worker
    threads exit after 10 s idle, so a sandbox spawned from one dies 10 s in; ours must not.
    The idle timeout is cut to 0.3 s here, so every worker thread has exited within a second."""
    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.3)
    spec = _spec(scratch, limits=Limits(wall_time_s=None, processes=None))
    async with open_sandboxed_process(spec, ["cat"], host=host) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        await trio.to_thread.run_sync(lambda: None)  # make sure a worker thread exists
        await trio.sleep(1.5)
        idle = [t.name for t in threading.enumerate() if t.name.startswith("Trio thread")]
        assert idle == []  # every thread that could have spawned the sandbox has exited
        assert proc.returncode is None
        await proc.stdin.send_all(b"still here\n")
        assert await proc.stdout.receive_some(100) == b"still here\n"


def test_launch_prefix_enters_cgroups_then_drops_privileges() -> None:
    prefix = launch_prefix(
        shell=Path("/bin/sh"),
        cgroup_procs=[Path("/cg/pids/w/cgroup.procs")],
        setpriv=Path("/usr/bin/setpriv"),
        run_as=RunAs(uid=1000, gid=1000),
    )
    assert prefix[:2] == ["/bin/sh", "-c"]
    assert prefix[3:6] == ["warren-enter-cgroup", "1", "/cg/pids/w/cgroup.procs"]
    assert prefix[6:] == [
        "/usr/bin/setpriv",
        "--reuid=1000",
        "--regid=1000",
        "--clear-groups",
        "--",
    ]
    assert launch_prefix(shell=Path("/bin/sh"), cgroup_procs=[], setpriv=None, run_as=None) == []
