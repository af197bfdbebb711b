"""Spare sandboxes: a long-lived sandbox started ahead of need by one process (the warm
server, orchestrator/cli/warm/spares.py) and adopted by another (a session), which then runs it
exactly as if it had started it (`sandbox.run.open_sandboxed_process(spares=...)`).

The starter never decides what the sandbox is: a session that started a sandbox itself
reports the `SpareRecipe` it used (the spec, the host facts its masks came from, the command,
the working directory, the host's tools), and the starter starts the next one from exactly
that recipe with the same pure argv builder (`sandbox.argv.bwrap_argv`), the same cgroup,
seccomp filter and private pipes, and no environment of its own (`env={}`; bwrap's
`--clearenv` and the recipe's scrubbed variables). A session adopts a spare only when the
recipe it would start now, gathered afresh (the masks of files that exist now, the guard's
survey, its scrubbed environment), has the same `SpareRecipe.key()`; anything different starts
cold. Nothing is gathered by the starter, so nothing a repository holds is read by it.

What travels on adoption (`Adopted`): the sandbox's pid, a pidfd (the adopter signals and
waits on it; the starter is bwrap's parent and reaps it), the ends of the private pipes and
the stderr pipe, and the cgroup's directories. The adopter removes the cgroup when it is done;
the starter does too when it reaps (whichever comes second finds nothing).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from sandbox.host import SandboxHost
from sandbox.launch import name_pipes, sandbox_command
from sandbox.limits import SandboxCgroup, kill_sandbox_init
from sandbox.masks import HostFacts
from sandbox.process.handover import StdioPipes, close_all, handing_over
from sandbox.process.held import HeldProcess
from sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from sandbox.process.zygote import ForkedProcess

__all__ = [
    "Adopted",
    "ForkedSpare",
    "SpareChild",
    "SpareRecipe",
    "SpareSource",
    "spawn_spare",
]


class SpareRecipe(BaseModel):
    """Everything that decides what a long-lived sandbox with private pipes is: two equal
    recipes start sandboxes that cannot be told apart (same mounts, masks, limits,
    environment, command, working directory)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: SandboxSpec
    facts: HostFacts
    """The host facts its mounts came from, without the private pipes' names (each
    sandbox gets its own descriptors)."""
    argv: tuple[str, ...]
    cwd: Path | None
    host: SandboxHost
    identities: tuple[tuple[str, int, int], ...] = ()
    """(path, st_dev, st_ino) of every host path the mounts name, when the recipe was
    gathered: a workspace, `.git` or protected file replaced since (a re-clone, git's
    rename-into-place) gives another key, so no spare shows a stale inode. A spare holds
    its mounted inodes, so their numbers cannot be reused while it lives."""

    @classmethod
    def gather(
        cls,
        spec: SandboxSpec,
        facts: HostFacts,
        argv: Sequence[str],
        cwd: Path | None,
        host: SandboxHost,
    ) -> SpareRecipe:
        """The recipe of a start from these values, with the identities of its paths now."""
        paths = [b.source or b.path for b in facts.binds]
        paths += [*facts.pins, *facts.protected, *facts.deny_dirs, *facts.deny_files]
        paths += [source for source, _ in facts.file_binds]
        identities = []
        for path in dict.fromkeys(paths):
            try:
                info = os.stat(path)
                identities.append((str(path), info.st_dev, info.st_ino))
            except OSError:
                identities.append((str(path), -1, -1))
        return cls(
            spec=spec,
            facts=facts,
            argv=tuple(argv),
            cwd=cwd,
            host=host,
            identities=tuple(identities),
        )

    @property
    def is_read_write_host(self) -> bool:
        """Whether this starts a read-write tool host (`workers.toolhost --role read_write`)."""
        if "workers.toolhost" not in self.argv or "--role" not in self.argv:
            return False
        at = self.argv.index("--role")
        return self.argv[at + 1 : at + 2] == ("read_write",)

    def as_read_only(self) -> SpareRecipe | None:
        """The recipe a session gathers for the read-only tool host beside the read-write
        one this recipe starts (`SandboxSpec.read_only`: every workspace and bind read-only,
        so no protected path, pin or watched name of its own; `--role read_only`); None when
        this is not a read-write tool host's recipe. A template started from this recipe can
        fork that host: the same mounts, with the writable ones made read-only
        (workers/zygote.py)."""
        if not self.is_read_write_host:
            return None
        at = self.argv.index("--role")
        facts = self.facts.model_copy(
            update={
                "binds": tuple(b.model_copy(update={"mode": "ro"}) for b in self.facts.binds),
                "pins": (),
                "protected": (),
                "watched": (),
            }
        )
        kept = {str(b.source or b.path) for b in facts.binds}
        kept |= {str(p) for p in (*facts.deny_dirs, *facts.deny_files)}
        kept |= {str(source) for source, _ in facts.file_binds}
        return self.model_copy(
            update={
                "spec": self.spec.read_only(),
                "facts": facts,
                "argv": (*self.argv[: at + 1], "read_only", *self.argv[at + 2 :]),
                "identities": tuple(i for i in self.identities if i[0] in kept),
            }
        )

    def writable_paths(self) -> tuple[Path, ...]:
        """The mount points this recipe's sandbox has writable (workspaces and binds) besides
        its private /tmp and /dev/shm."""
        return tuple(b.path for b in self.facts.binds if b.mode == "rw")

    def key(self) -> str:
        """A digest of the whole recipe: spares are kept and claimed by it."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    @property
    def slot(self) -> tuple[str, ...]:
        """What a spare stands in for: a sandbox on this workspace and working directory
        with these mount modes (a read-write or a read-only tool host). A newer recipe of
        the same slot supersedes an older one."""
        modes = tuple(f"{w.path}:{w.mode}" for w in self.spec.workspaces)
        return (str(self.workspace), str(self.cwd), *modes)

    @property
    def workspace(self) -> Path:
        """The first workspace (spares are kept for a bounded number of them)."""
        if self.spec.workspaces:
            return self.spec.workspaces[0].path
        return self.cwd or Path("/")


@dataclass(frozen=True)
class Adopted:
    """A spare handed to its adopter: descriptors it now owns (`stdin`: the write end of the
    sandbox's input pipe, `stdout` / `stderr`: read ends), and what it needs to stop it."""

    pid: int
    pidfd: int
    stdin: int
    stdout: int
    stderr: int
    cgroup: tuple[Path, ...] = ()
    cgroup_version: int | None = None
    forked: bool = False
    """Forked from a template inside a sandbox (`ForkedSpare`), not a bwrap: `pid` is the
    process itself, pid 1 of its own pid namespace, with no cgroup of its own."""


class SpareSource(Protocol):
    """Where a session gets spares from and reports what it started (the server link)."""

    async def claim(self, recipe: SpareRecipe) -> Adopted | None:
        """A spare started from an equal recipe, now the caller's alone; None: start cold."""
        ...

    def report(self, recipe: SpareRecipe) -> None:
        """The caller started a sandbox from `recipe` itself (a spare may follow)."""
        ...


class _HandedOver:
    """The descriptors a spare hands its adopter (pidfd, stdin, stdout, stderr), open until
    handed or stopped."""

    pidfd: int
    stdin: int
    stdout: int
    stderr: int
    fds_open: bool

    def descriptors(self) -> list[int]:
        """What an adopter receives, in `Adopted`'s order (pidfd, stdin, stdout, stderr)."""
        return [self.pidfd, self.stdin, self.stdout, self.stderr] if self.fds_open else []

    def close_descriptors(self) -> None:
        if self.fds_open:
            close_all((self.pidfd, self.stdin, self.stdout, self.stderr))
            self.fds_open = False


@dataclass(eq=False)
class SpareChild(_HandedOver):
    """A spare as its starter holds it: the process (the starter reaps it), the descriptors
    it hands over (closed here once handed), and its cgroup."""

    popen: subprocess.Popen[bytes]
    pidfd: int
    stdin: int
    stdout: int
    stderr: int
    cgroup: SandboxCgroup | None
    handed: bool = False
    fds_open: bool = field(default=True)
    forked: ClassVar[bool] = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kept_fds(self) -> list[int]:
        """Descriptors kept after handing it out (none: we are its parent)."""
        return []

    def kill(self) -> None:
        """SIGKILL the sandbox's init (the kernel kills its pid namespace), else bwrap."""
        if self.popen.poll() is not None or kill_sandbox_init(self.popen.pid):
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGKILL)

    def reaped(self) -> bool:
        """Reap it if it exited (and remove its cgroup); True once it is gone."""
        if self.popen.poll() is None:
            return False
        if self.cgroup is not None:
            self.cgroup.kill_all()
            self.cgroup.try_remove()
        self.close_descriptors()
        return True

    def wait(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout)


@dataclass(eq=False)
class ForkedSpare(_HandedOver):
    """A spare forked from a template inside a sandbox (a tool host forked by the warm
    server's template, workers/zygote.py): the same surface as `SpareChild`, but the process
    is not our child (the template reaps it): we hold a pidfd of our own to signal it and
    see it end."""

    pid: int
    pidfd: int
    stdin: int
    stdout: int
    stderr: int
    handed: bool = False
    fds_open: bool = field(default=True)
    cgroup: None = None
    held: HeldProcess = field(init=False)
    """It, by a pidfd kept for ourselves (the one in `descriptors` goes to the adopter)."""
    forked: ClassVar[bool] = True

    def __post_init__(self) -> None:
        own = os.dup(self.pidfd)
        os.set_inheritable(own, False)
        self.held = HeldProcess(own, self.pid)

    @classmethod
    def of(cls, forked: ForkedProcess) -> ForkedSpare:
        """What the template forked (`sandbox.process.zygote.ZygoteLink.fork`), as a spare."""
        return cls(forked.pid, forked.pidfd, forked.stdin, forked.stdout, forked.stderr)

    def kept_fds(self) -> list[int]:
        """Our own pidfd, kept after handing it out, to see it end."""
        return [self.held.fd] if self.held.fd >= 0 else []

    def kill(self) -> None:
        """SIGKILL it: it is pid 1 of its pid namespace, so everything it started goes too."""
        self.held.signal(signal.SIGKILL)

    def reaped(self) -> bool:
        """True once it has exited (its pidfd readable)."""
        if not self.held.ended():
            return False
        self.close_descriptors()
        self.held.close()
        return True

    def wait(self, timeout: float) -> None:
        self.held.wait_ended(timeout)


def spawn_spare(
    recipe: SpareRecipe,
    *,
    argv: Sequence[str] | None = None,
    spec: SandboxSpec | None = None,
    nested_uid: int | None = None,
    pass_fds: Sequence[int] = (),
) -> SpareChild:
    """Start a sandbox from `recipe` as `sandbox.run.open_sandboxed_process(private_pipes=
    True)` would: its cgroup first, the seccomp filter, bwrap from the same argv builder
    (`sandbox.launch`), the pipes passed as extra descriptors and named in `PIPE_FDS_ENV`.
    Synchronous (the server runs no event loop); a vfork and an exec. `argv`, `spec`,
    `nested_uid`, `pass_fds`: a template's start from a recipe (another command and limits in
    the same sandbox, one that makes namespaces, its control socket; see `sandbox.argv`).

    **Errors:** `OSError` when it cannot start (nothing is left behind).
    """
    host, spec = recipe.host, spec or recipe.spec
    pipes = StdioPipes.open(stderr=True)
    cgroup: SandboxCgroup | None = None
    try:
        with handing_over(pipes) as also_handed:
            cgroup = SandboxCgroup.create(host.cgroups, spec.limits)
            command, seccomp_fd = sandbox_command(
                spec,
                recipe.argv if argv is None else argv,
                host=host,
                facts=name_pipes(recipe.facts, pipes),
                cgroup=cgroup,
                run_as=None,
                cwd=recipe.cwd,
                nested_uid=nested_uid,
            )
            program = [] if seccomp_fd is None else [seccomp_fd]
            also_handed += program
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=pipes.child_err,
                stderr=pipes.child_err,
                pass_fds=[pipes.child_in, pipes.child_out, *pass_fds, *program],
                env={},
                cwd="/",
                start_new_session=True,
            )
    except BaseException:
        if cgroup is not None:
            cgroup.try_remove()
        raise
    try:
        pidfd = os.pidfd_open(popen.pid)
    except OSError:
        popen.kill()
        popen.wait()
        pipes.close()
        if cgroup is not None:
            cgroup.try_remove()
        raise
    for fd in (pidfd, *pipes.ours()):
        os.set_inheritable(fd, False)
    return SpareChild(popen, pidfd, pipes.ours_in, pipes.ours_out, pipes.ours_err, cgroup)
