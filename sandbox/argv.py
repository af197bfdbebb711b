"""The pure function from a spec (plus host facts) to a bwrap command line.

Pure so that it can be golden-tested (tests/sandbox/golden/) and reviewed as text: every
flag that makes up the floor is visible in one list. Host knowledge arrives as `HostFacts`
(see `sandbox.masks`); file descriptors (the seccomp program) are numbers chosen by the runner.

Order matters because bwrap applies mounts in order, each on top of the previous ones:

1. `--ro-bind / /` (everything read-only), then fresh `/proc` and `/dev` (made read-only
   again after a sized `/dev/shm` is mounted in it);
2. a private, sized `/tmp` *before* the workspace binds, so a workspace under /tmp is still
   the host's directory;
3. the hidden home's empty tmpfs and the workspace, extra, home-allow and runtime binds,
   parents before children (a workspace under the home is bound after the tmpfs hides the
   rest of it), the sanitised git configuration, then the home's tmpfs made read-only;
4. pins (directories bound onto themselves so they cannot be renamed), then protected paths
   read-only, then secrets masked — masks last, so no bind can uncover them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sandbox.masks import HostFacts
from sandbox.spec import Limits, SandboxSpec

__all__ = ["MANDATORY_FLAGS", "bwrap_argv", "prlimit_argv"]

MANDATORY_FLAGS: tuple[str, ...] = (
    "--new-session",  # no controlling terminal: TIOCSTI cannot push keys into ours
    "--die-with-parent",
    "--unshare-user",
    "--disable-userns",  # no nested user namespace, so no way to regain capabilities
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--cap-drop",
    "ALL",  # as root on the host this matters: the sandbox must gain nothing from it
)
"""Flags every sandbox gets, whatever the spec says (pinned by test_argv), but one:
`--unshare-net` is left out for a spec whose `network` is `host`."""


def bwrap_argv(
    spec: SandboxSpec,
    argv: Sequence[str],
    *,
    bwrap: Path,
    facts: HostFacts,
    prlimit: Path | None = None,
    seccomp_fd: int | None = None,
    cwd: Path | None = None,
    nested_uid: int | None = None,
) -> list[str]:
    """The full command line: `bwrap <floor> <mounts> -- [prlimit <limits> --] argv...`.

    `prlimit` (util-linux) applies the rlimits inside the sandbox, after the user namespace
    exists, so RLIMIT_NPROC counts only the sandbox's own processes. `seccomp_fd` is an fd
    the runner passes to bwrap holding the program from `sandbox.seccomp`. `cwd` defaults to
    the first workspace (`/` without one).

    `nested_uid` (a zygote's sandbox, workers/zygote.py): the process inside makes namespaces
    of its own, so no `--disable-userns`; it runs as that uid; bwrap's proc is at
    `sandbox.nsfork.RW_PROC` and the host's read-only one stays at /proc, for the zygote to
    mount its own on (sandbox/nsfork.py says why).
    """
    if not argv:
        raise ValueError("argv must name a command to run")
    floor = MANDATORY_FLAGS
    if spec.network == "host":
        floor = tuple(flag for flag in floor if flag != "--unshare-net")
    if nested_uid is not None:
        floor = tuple(flag for flag in floor if flag != "--disable-userns")
        floor += ("--uid", str(nested_uid), "--gid", str(nested_uid))
    out = [str(bwrap), *floor, "--clearenv"]
    for name, value in facts.env:
        out += ["--setenv", name, value]

    limits = spec.limits
    out += ["--ro-bind", "/", "/"]
    out += ["--proc", "/proc"] if nested_uid is None else []
    out += ["--dev", "/dev"]
    out += [] if nested_uid is None else ["--proc", _RW_PROC]
    out += [*_size(limits), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    out += [*_size(limits), "--tmpfs", "/tmp"]

    mounts: list[tuple[Path, list[str]]] = []
    if facts.home_mask is not None:
        home = str(facts.home_mask)
        mounts.append((facts.home_mask, ["--size", str(_HOME_TMPFS_BYTES), "--tmpfs", home]))
    for bind in facts.binds:
        flag = "--bind" if bind.mode == "rw" else "--ro-bind"
        mounts.append((bind.path, [flag, str(bind.source or bind.path), str(bind.path)]))
    for _, args in sorted(mounts, key=lambda m: _depth_key(m[0])):
        out += args
    for source, inside in facts.file_binds:
        out += ["--ro-bind", str(source), str(inside)]
    if facts.home_mask is not None:
        out += ["--remount-ro", str(facts.home_mask)]
    for pin in facts.pins:
        out += ["--bind", str(pin), str(pin)]
    for path in facts.protected:
        out += ["--ro-bind", str(path), str(path)]
    for path in facts.deny_dirs:
        out += ["--tmpfs", str(path), "--remount-ro", str(path)]
    for path in facts.deny_files:
        out += ["--ro-bind", "/dev/null", str(path)]

    if cwd is None:
        cwd = spec.workspaces[0].path if spec.workspaces else Path("/")
    out += ["--chdir", str(cwd)]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    out.append("--")
    if prlimit is not None:
        out += prlimit_argv(limits, prlimit)
    out += list(argv)
    return out


def prlimit_argv(limits: Limits, prlimit: Path) -> list[str]:
    """`prlimit --as=... -- ` for the rlimits in `limits` (soft = hard, except CPU).

    CPU gets a hard limit one second above the soft one so the process first sees SIGXCPU
    (how the runner tells a CPU kill from any other SIGKILL). Core dumps are off: a crash
    must not write a core file into the workspace.
    """
    out = [str(prlimit), "--core=0"]
    if limits.memory_bytes is not None:
        out.append(f"--as={limits.memory_bytes}")
    if limits.processes is not None:
        out.append(f"--nproc={limits.processes}")
    if limits.file_size_bytes is not None:
        out.append(f"--fsize={limits.file_size_bytes}")
    if limits.open_files is not None:
        out.append(f"--nofile={limits.open_files}")
    if limits.cpu_time_s is not None:
        out.append(f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 1}")
    out.append("--")
    return out


_RW_PROC = "/dev/.proc"
"""`sandbox.nsfork.RW_PROC` (pinned equal by tests/sandbox/test_argv.py)."""

_HOME_TMPFS_BYTES = 1024**2
"""Size of the hidden home's tmpfs: it only holds mount points, and is read-only anyway."""


def _size(limits: Limits) -> list[str]:
    return [] if limits.tmp_bytes is None else ["--size", str(limits.tmp_bytes)]


def _depth_key(path: Path) -> tuple[int, str]:
    return (len(path.parts), str(path))
