"""Stopping a child we started, on a documented deadline (`stop_child`): end of its input,
SIGTERM, `KILL_GRACE_S` of grace, SIGKILL, reaped; and starting one in its own session that
is stopped so when the block that uses it is left (`open_child`).

Every long-lived process Warren starts ends this way: a sandbox (`sandbox.run`, whose
SIGTERM goes to the command inside and whose SIGKILL goes to the sandbox's init), a pool
worker forked from the zygote (`workers.zygote_spawner`), an unsandboxed tool host
(`workers.toolhost_runner.unsandboxed_spawner`), an MCP server the user runs outside the floor
(orchestrator/cli/wiring.py), a hook's process (orchestrator/hooks/process.py). What differs
between them is only whom a signal reaches (`StoppableChild.terminate` and `kill`, or the
child's whole process group) and how long each step may take.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import trio

__all__ = ["KILL_GRACE_S", "REAP_TIMEOUT_S", "StoppableChild", "open_child", "stop_child"]

KILL_GRACE_S = 2.0
"""Seconds a child (or its group) has between SIGTERM and SIGKILL."""

REAP_TIMEOUT_S = 5.0
"""Seconds we wait for a SIGKILLed child to be reaped before giving up on it (a process in
uninterruptible sleep; it is reaped by whoever waits for it later, or stays a zombie)."""


class StoppableChild(Protocol):
    """What `stop_child` needs of a process: `trio.Process` has it, and so have
    `sandbox.run.SandboxProcess` and `workers.zygote_spawner.ForkedWorker`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None:
        """None while it runs."""
        ...

    @property
    def stdin(self) -> trio.abc.SendStream | None: ...

    async def wait(self) -> int:
        """Until it has exited (and is reaped, when it is ours); its status."""
        ...

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to whatever stands for it)."""
        ...

    def kill(self) -> None:
        """Stop it now (SIGKILL to whatever stands for it)."""
        ...


async def stop_child(
    child: StoppableChild,
    *,
    grace_s: float | None = KILL_GRACE_S,
    eof_grace_s: float = 0.0,
    kill_wait_s: float = KILL_GRACE_S,
    group: bool = False,
) -> None:
    """Make sure `child` is gone: its stdin closed (end of input), `eof_grace_s` for it to
    leave by itself, SIGTERM, `grace_s` for it to go, SIGKILL, then up to `kill_wait_s` for
    it to be reaped. `grace_s=None`: no end of input and no SIGTERM, SIGKILL at once. A step
    is skipped once it has exited.

    `group`: the signals go to its whole process group (a child started in its own session
    leads one) instead of `terminate` and `kill`, and whatever is left of the group when the
    child has gone gets the SIGKILL too: a member that ignores SIGTERM does not outlive it
    (tests/sandbox/process/test_child.py). Its pid names the group while any member lives,
    so the signal reaches no one else; call it soon after the child was reaped, if it was.

    **Cancellation:** shielded: every step runs, and the whole is bounded by
    `eof_grace_s + grace_s + kill_wait_s`.
    **Errors:** none (a child that is already gone is no error).
    """
    with trio.CancelScope(shield=True):
        if child.returncode is None and grace_s is not None:
            if child.stdin is not None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await child.stdin.aclose()
            if eof_grace_s > 0:
                with trio.move_on_after(eof_grace_s):
                    await child.wait()
            if child.returncode is None:
                _send(child, signal.SIGTERM, group)
                with trio.move_on_after(grace_s):
                    await child.wait()
        if child.returncode is None or group:
            _send(child, signal.SIGKILL, group)
        if child.returncode is None:
            with trio.move_on_after(kill_wait_s):
                await child.wait()


def _send(child: StoppableChild, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(child.pid, sig)
        elif sig == signal.SIGTERM:
            child.terminate()
        else:
            child.kill()


@asynccontextmanager
async def open_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path | None,
    grace_s: float = KILL_GRACE_S,
) -> AsyncIterator[trio.Process]:
    """Start `argv` in a session of its own (out of the terminal's process group: Ctrl-C is
    ours to send) with piped stdin, stdout and stderr; on leaving the block stop it with its
    process group (`stop_child`: end of input and `grace_s` to leave, SIGTERM and `grace_s`,
    SIGKILL and `REAP_TIMEOUT_S`), then close its pipes. For a process outside the floor
    (an MCP server the user runs unsandboxed, a tool host with the sandbox off).

    **Cancellation:** the stop is shielded and bounded (`2 * grace_s + REAP_TIMEOUT_S`),
    then `Cancelled` propagates.
    **Errors:** `OSError` when it cannot start.
    """
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            await stop_child(
                process,
                eof_grace_s=grace_s,
                grace_s=grace_s,
                kill_wait_s=REAP_TIMEOUT_S,
                group=True,
            )
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()
