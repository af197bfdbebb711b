"""A process held by a pidfd (`HeldProcess`): signalled through it, so a pid reused meanwhile is
never hit, and seen to end when it becomes readable, whoever reaps it.

For the processes that are not our children: a spare sandbox the warm server started and a
session adopted (`sandbox.run`), a tool host a template forked (`sandbox.spare.ForkedSpare`), a
pool worker the zygote forked (`workers.zygote_spawner`), a sandbox's init handed to us
(`sandbox.process.reaper`); and for our own children, to wait for their end on the event loop
(`sandbox.run.SandboxProcess`). Their exit status is their parent's to read: the holder only
learns that they ended.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal

__all__ = ["HeldProcess"]


class HeldProcess:
    """A pidfd we own (closed by `close`) and what it tells us."""

    def __init__(self, pidfd: int, pid: int) -> None:
        self.fd = pidfd
        """The pidfd; -1 once closed."""
        self.pid = pid
        """Its pid in our pid namespace."""
        self._waited = False

    @classmethod
    def open(cls, pid: int) -> HeldProcess:
        """Hold the process `pid` (of ours or not).

        **Errors:** `OSError` when it is gone, or the kernel has no pidfds (before 5.3)."""
        return cls(os.pidfd_open(pid), pid)

    def signal(self, sig: int) -> None:
        """Send `sig`, unless it has ended (or the pidfd is closed)."""
        if self.fd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.fd, sig)

    def ended(self) -> bool:
        """Whether it has exited, now (a closed hold counts as ended)."""
        return self.wait_ended(0)

    def wait_ended(self, timeout_s: float | None) -> bool:
        """Block this thread until it exits (True) or `timeout_s` passes (False); None: no
        limit. For a process without an event loop (the warm server)."""
        if self.fd < 0:
            return True
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        return bool(ready)

    async def wait(self) -> None:
        """Wait until it exits.

        **Cancellation:** safe: nothing is lost, wait again.
        **Errors:** none; a closed hold returns at once."""
        import trio  # the warm server, which never runs trio, holds processes too

        if self.fd >= 0:
            self._waited = True
            await trio.lowlevel.wait_readable(self.fd)

    def close(self) -> None:
        """Close the pidfd (after telling trio, if it was waited on: from the event loop's
        thread then)."""
        if self.fd < 0:
            return
        if self._waited:
            import trio

            trio.lowlevel.notify_closing(self.fd)
        os.close(self.fd)
        self.fd = -1
