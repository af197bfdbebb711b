"""A tool-host template: the warm server's source of forked tool hosts for one workspace.

Two fresh tool hosts share almost none of their pages (each is its own interpreter that
imported trio, pydantic and the tools: about 21 MB PSS each). A template is one such
interpreter, started by the server from a session's read-write tool-host recipe under that
host's floor (the same mounts, masks, environment and seccomp filter; `nested_uid`, since it
makes namespaces) running `workers.zygote --serves toolhost`; it has imported and warmed
everything a host needs, and forks hosts that share its pages copy-on-write.

Each forked host enters namespaces of its own (user, mount, pid, IPC, UTS, network, cgroup;
its own proc, /tmp and /dev/shm), drops every capability, stacks the seccomp filter that
refuses nested user namespaces and is non-dumpable, as a pool worker forked from the pool's
zygote is (workers/README.md "Zygote"): a host cannot see or signal the template or another
host. The read-only host is forked from the same template with the recipe's writable mounts
(the workspaces and binds) made read-only, recursively, in its own mount namespace before it
drops its capabilities (`sandbox.nsfork.make_read_only`): the sandbox a session would start
from `SpareRecipe.as_read_only()`, which is what the server checks before it forks one for a
session's read-only recipe.

What differs from a fresh host: no cgroup of its own (its limits are rlimits set in its own
user namespace, and the session's process watchdog counts its pid namespace); its proc is
read-only.

Synchronous (the server runs no event loop): the server watches `fds()` and calls
`readable()`; `fork` waits for the template's answer (a fork, a few milliseconds).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.process.zygote import ZygoteLink
    from sandbox.spare import ForkedSpare, SpareChild, SpareRecipe

__all__ = ["HostTemplate"]

_FORK_TIMEOUT_S = 5.0


class HostTemplate:
    """One template (see the module docstring), started from `recipe`, a read-write tool
    host's. `ready` once it has warmed; `pending` are the spares waiting for that."""

    module = "workers.zygote"
    """The template's entry point (tests name one that cannot start, to see the fallback)."""

    def __init__(self, key: str, recipe: SpareRecipe) -> None:
        """Start it. **Errors:** `OSError` or `ValueError` when it cannot start."""
        from sandbox import nsfork
        from sandbox.process.zygote import ZygoteLink
        from sandbox.spare import spawn_spare

        read_only = recipe.as_read_only()
        if read_only is None:
            raise ValueError("not a read-write tool host's recipe")
        self.key = key
        self.recipe = recipe
        self.read_only_key = read_only.key()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        uid = os.getuid()
        argv = [recipe.argv[0], "-I", "-m", self.module, "--serves", "toolhost"]
        argv += ["--control-fd", str(theirs.fileno()), "--worker-uid", str(uid)]
        # Each host sets the process limit in its own user namespace (as the pool's zygote
        # does); counted on the template's sandbox, it would bind every host together.
        limits = recipe.spec.limits.model_copy(update={"processes": None})
        try:
            self.child: SpareChild = spawn_spare(
                recipe,
                argv=argv,
                spec=recipe.spec.model_copy(update={"limits": limits}),
                nested_uid=nsfork.NESTED_UID if uid == 0 else uid,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        for fd in (self.child.stdin, self.child.stdout):  # it speaks on `control` only
            os.close(fd)
        self.child.stdin = self.child.stdout = -1
        os.set_blocking(self.child.stderr, False)
        self.link: ZygoteLink = ZygoteLink(ours)
        self.retired = False
        self._reaped = False
        self.pending: dict[str, SpareRecipe] = {}
        self.used = time.monotonic()

    @property
    def ready(self) -> bool:
        """It has warmed and forks hosts."""
        return self.link.ready

    @property
    def dead(self) -> bool:
        """It is gone (it closed its end, or was reaped): it forks no more."""
        return self.link.gone or self._reaped

    def fds(self) -> list[int]:
        """What the server watches (and a forked session closes)."""
        out = [] if self.link.fileno() < 0 else [self.link.fileno()]
        return out + ([self.child.stderr] if self.child.stderr >= 0 else [])

    def inherited_fds(self) -> list[int]:
        """What a session forked from the server closes: `fds()` and its pidfd."""
        return self.fds() + ([self.child.pidfd] if self.child.fds_open else [])

    def readable(self) -> bool:
        """Read what it said; True when it just became ready."""
        was = self.ready
        self._drain_stderr()
        self.link.read_waiting()
        return self.ready and not was

    def fork(self, recipe: SpareRecipe, *, read_only: bool) -> ForkedSpare:
        """A host from `recipe` (this template's, or its read-only recipe with `read_only`).
        **Errors:** `OSError` when the template cannot make it (the caller starts a fresh
        spare instead)."""
        from sandbox.process.zygote import ForkRequest
        from sandbox.spare import ForkedSpare

        if not self.ready or self.dead or self.retired:
            raise OSError("the template is not ready")
        at = recipe.argv.index("workers.toolhost")
        request = ForkRequest(
            argv=recipe.argv[at + 1 :],
            limits=recipe.spec.limits.model_dump(),
            tmp_bytes=recipe.spec.limits.tmp_bytes,
            read_only=tuple(str(p) for p in self.recipe.writable_paths()) if read_only else (),
        )
        try:
            forked = self.link.fork(request, timeout_s=_FORK_TIMEOUT_S)
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                self.kill()  # wedged: its hosts go with it
            raise OSError(f"the template could not fork a host: {exc}") from exc
        self.used = time.monotonic()
        return ForkedSpare.of(forked)

    def _drain_stderr(self) -> None:
        """Its own output (a failure to start, a host it could not make) is read and
        dropped: a host's goes to its own stderr pipe, which its session relays."""
        if self.child.stderr < 0:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                try:
                    chunk = os.read(self.child.stderr, 65_536)
                except OSError:
                    chunk = b""
                if not chunk:
                    os.close(self.child.stderr)
                    self.child.stderr = -1
                    return

    def retire(self) -> None:
        """Fork no more: it leaves once the hosts it forked have (handed-out hosts serve
        their sessions to the end)."""
        self.retired = True
        self.link.close()

    def kill(self) -> None:
        """Stop it and every host it forked (its sandbox's pid namespace goes)."""
        self.retire()
        self.child.kill()

    def reaped(self) -> bool:
        """Reap it if it exited; True once it is gone."""
        if not self.child.reaped():
            return False
        self._reaped = True
        self.link.close()
        if self.child.stderr >= 0:
            with contextlib.suppress(OSError):
                os.close(self.child.stderr)
            self.child.stderr = -1
        return True

    def wait(self, timeout: float) -> None:
        self.child.wait(timeout)
