"""The command that starts a sandbox: the launch prefix (entering its cgroups, dropping to
`RunAs`), then bwrap's argv, and the seccomp program bwrap reads (`sandbox_command`).

One builder for both ways a sandbox starts: a cold start in the session that needs it
(`sandbox.run`) and a spare the warm server starts from a session's recipe (`sandbox.spare`),
which must be exactly the sandbox the session would have started. Neither of those imports
the other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox.argv import bwrap_argv
from sandbox.host import SandboxHost
from sandbox.limits import SandboxCgroup
from sandbox.masks import HostFacts
from sandbox.process.handover import PIPE_FDS_ENV, StdioPipes
from sandbox.seccomp import build_filter, program_fd
from sandbox.spec import SandboxSpec

__all__ = ["RunAs", "launch_prefix", "name_pipes", "sandbox_command"]

# Enter the cgroups named by the first N arguments, then exec the rest (bwrap). A shell and
# not a preexec_fn: preexec_fn is unsafe in a process with threads (trio has some).
_ENTER_CGROUP = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
    'n=$((n - 1)); done; exec "$@"'
)


class RunAs(BaseModel):
    """Drop to this uid/gid (with no supplementary groups) before bwrap starts. Needs root.
    Used to run sandboxes as an unprivileged account, and by the escape suite."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uid: int
    gid: int


def launch_prefix(
    *,
    shell: Path,
    cgroup_procs: Sequence[Path],
    setpriv: Path | None,
    run_as: RunAs | None,
) -> list[str]:
    """What runs before bwrap: a shell entering the cgroups, then setpriv dropping to
    `run_as`; each execs the next, so bwrap keeps the pid we spawned."""
    out: list[str] = []
    if cgroup_procs:
        out += [str(shell), "-c", _ENTER_CGROUP, "warren-enter-cgroup", str(len(cgroup_procs))]
        out += [str(p) for p in cgroup_procs]
    if run_as is not None:
        if setpriv is None:
            raise RuntimeError("run_as needs util-linux setpriv, which was not found")
        out += [
            str(setpriv),
            f"--reuid={run_as.uid}",
            f"--regid={run_as.gid}",
            "--clear-groups",
            "--",
        ]
    return out


def name_pipes(facts: HostFacts, pipes: StdioPipes) -> HostFacts:
    """`facts` whose environment names the child's ends of `pipes` (`PIPE_FDS_ENV`): a
    sandbox with private pipes finds its protocol there, never on bwrap's stdio."""
    return facts.model_copy(update={"env": (*facts.env, (PIPE_FDS_ENV, pipes.named()))})


def sandbox_command(
    spec: SandboxSpec,
    argv: Sequence[str],
    *,
    host: SandboxHost,
    facts: HostFacts,
    cgroup: SandboxCgroup | None,
    run_as: RunAs | None,
    cwd: Path | None,
    nested_uid: int | None = None,
) -> tuple[list[str], int | None]:
    """The command that starts `spec`'s sandbox running `argv` (the launch prefix: cgroup,
    setpriv; then bwrap), and the descriptor of its seccomp program for bwrap to read (None
    without seccomp), which the caller passes to the command and closes.

    **Errors:** `SandboxConfigError` (the spec cannot be built on this host), `RuntimeError`
    (`run_as` without setpriv), `OSError`; nothing is left open."""
    program = (
        build_filter(allow_unix_sockets=spec.allow_unix_sockets, machine=host.machine)
        if host.seccomp_supported
        else None
    )
    seccomp_fd = program_fd(program) if program is not None else None
    try:
        command = launch_prefix(
            shell=host.shell,
            cgroup_procs=cgroup.procs_files if cgroup else [],
            setpriv=host.setpriv,
            run_as=run_as,
        ) + bwrap_argv(
            spec,
            argv,
            bwrap=host.bwrap.path,
            facts=facts,
            prlimit=host.prlimit,
            seccomp_fd=seccomp_fd,
            cwd=cwd,
            nested_uid=nested_uid,
        )
    except BaseException:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        raise
    return command, seccomp_fd
