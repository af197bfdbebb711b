"""Reaping the sandboxes' inits that were handed to us: no zombie under a coordinator that is
PID 1 (of a container, or of `unshare --pid --fork`) or a child subreaper.

bwrap's outer process can exit a moment before its child, the sandbox's init (pid 1 of the
sandbox's pid namespace), has finished exiting. The init is then an orphan, reparented to the
nearest subreaper or to PID 1 of our namespace. When that is us, nobody else will reap it,
and a zombie would stay for every sandbox the session ran.

We reap only what cannot be a child we (or trio, or a library) forked and will wait for: a
child whose `NSpid` has more levels than ours is the init of a nested pid namespace, which
only bwrap forks. Everything else is left to whoever started it, so no exit status is stolen.

Part of the process room (sandbox/process/): run by `sandbox.run` after every sandbox.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import trio

from sandbox.process.held import HeldProcess
from sandbox.process.tree import our_children

__all__ = ["adopted_sandbox_inits", "reap_adopted_sandbox_inits"]


def _nspid_depth(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 1
    return None


def adopted_sandbox_inits() -> list[int]:
    """Our children (pids in our namespace) that are the init of a nested pid namespace: a
    sandbox's init, adopted after its bwrap exited. Empty unless we are PID 1 or a subreaper."""
    own = _nspid_depth(Path("/proc/self/status").read_text())
    if own is None:  # kernels before 4.1 do not say; nothing is reaped then
        return []
    adopted = []
    for pid in our_children():
        try:
            depth = _nspid_depth(Path(f"/proc/{pid}/status").read_text())
        except OSError:
            continue
        if depth is not None and depth > own:
            adopted.append(pid)
    return adopted


async def reap_adopted_sandbox_inits(timeout_s: float) -> list[int]:
    """Wait (at most `timeout_s` each) for every adopted sandbox init to exit, and reap it.
    The kernel killed the rest of its namespace when bwrap went, so this is brief. Returns
    the pids reaped.

    **Cancellation:** stops waiting; the rest is reaped by a later call.
    **Errors:** none."""
    reaped = []
    for pid in adopted_sandbox_inits():
        try:
            held: HeldProcess | None = HeldProcess.open(pid)
        except OSError:  # gone (reaped by a concurrent call), or no pidfd: try once
            held = None
        try:
            if held is not None:
                with trio.move_on_after(timeout_s):
                    await held.wait()
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:  # noqa: ASYNC222 (WNOHANG)
                    reaped.append(pid)
        finally:
            if held is not None:
                held.close()
    return reaped
