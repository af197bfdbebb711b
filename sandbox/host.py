"""`SandboxHost`: the machine-level facts every sandbox needs, found once and reused.

Which bwrap, where `prlimit` and `setpriv` are, what cgroup control we have, where the stub
registry lives, whether we can build a seccomp filter for this machine. A session detects
these once (`await detect_host()`) and passes the value to every `run_sandboxed` call; the
runner only detects on its own when given none (about 2 ms: one `bwrap --version`).
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping
from pathlib import Path

import trio
from pydantic import BaseModel, ConfigDict

from sandbox.binary import BwrapBinary, find_bwrap, find_system_tool
from sandbox.limits import CgroupSupport, detect_cgroups
from sandbox.seccomp import SUPPORTED_ARCHES
from sandbox.stubs import StubRegistry

__all__ = ["HOST_ENV", "SandboxHost", "default_state_dir", "detect_host", "host_env"]

HOST_ENV = ("WARREN_BWRAP", "XDG_STATE_HOME", "HOME")
"""The environment variables `detect_host` reads (its other inputs are the machine's)."""


class SandboxHost(BaseModel):
    """Host-side tools and capabilities for running sandboxes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bwrap: BwrapBinary
    prlimit: Path | None
    """util-linux `prlimit`, run inside the sandbox to set rlimits; None: rlimits unenforced."""
    setpriv: Path | None
    """util-linux `setpriv`, for `run_as` (dropping to another uid before bwrap)."""
    shell: Path
    """`/bin/sh`, used to enter the sandbox's cgroup before exec'ing bwrap."""
    cgroups: CgroupSupport
    stub_dir: Path
    """Directory of the stub registry (see `sandbox.stubs`)."""
    machine: str
    """`platform.machine()`; decides whether a seccomp filter can be built."""

    @property
    def seccomp_supported(self) -> bool:
        return self.machine in SUPPORTED_ARCHES

    def notes(self) -> list[str]:
        """Weaknesses of this host, one line each, for the doctor."""
        out = [self.cgroups.note]
        if self.prlimit is None:
            out.append(
                "prlimit not found: memory, CPU, file-size and open-file limits are "
                "not enforced (install util-linux)"
            )
        if not self.seccomp_supported:
            out.append(
                f"no seccomp filter for {self.machine}: Unix sockets, setuid bits and "
                "TIOCSTI are not blocked"
            )
        return out


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Warren's state directory: `$XDG_STATE_HOME/warren`, else `~/.local/state/warren`."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME", "")
    if state and Path(state).is_absolute():
        return Path(state) / "warren"
    return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "warren"


def host_env(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values of `HOST_ENV` in `environ` (default: this process's), "" for unset."""
    env = os.environ if environ is None else environ
    return tuple(env.get(name) or "" for name in HOST_ENV)


async def detect_host(
    *,
    bwrap: Path | None = None,
    stub_dir: Path | None = None,
    use_cgroups: bool = True,
    environ: Mapping[str, str] | None = None,
) -> SandboxHost:
    """Find everything once, and sweep the mount placeholders older Warren versions left in
    repositories when they were killed (`sandbox.stubs`; today's sandboxes make none).

    Errors: `SandboxUnavailable` when no usable bwrap exists (see `find_bwrap`).
    """
    binary = await find_bwrap(explicit=bwrap)
    cgroups = (
        detect_cgroups()
        if use_cgroups
        else CgroupSupport(
            version=None,
            pids_parent=None,
            memory_parent=None,
            note="cgroups disabled by configuration",
        )
    )
    host = SandboxHost(
        bwrap=binary,
        prlimit=find_system_tool("prlimit"),
        setpriv=find_system_tool("setpriv"),
        shell=Path("/bin/sh"),
        cgroups=cgroups,
        stub_dir=stub_dir or default_state_dir(environ) / "stubs",
        machine=platform.machine(),
    )
    with contextlib.suppress(OSError):
        await trio.to_thread.run_sync(StubRegistry(host.stub_dir).sweep)
    return host
