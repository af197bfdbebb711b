"""Resource limits beyond rlimits: a cgroup per sandbox where the host allows it, the process
watchdog, and telling from an exit status which limit stopped a command.

Why three mechanisms (pinned by tests/sandbox/test_limits.py):

- rlimits (`prlimit` inside the sandbox, see `sandbox.argv.prlimit_argv`) cover memory per
  process, CPU, file size and open files everywhere, with no privileges.
- RLIMIT_NPROC is *not* enforced for processes whose host uid is 0, whatever namespace they
  are in (the kernel exempts INIT_USER). Warren often runs as root (containers, CI), so the
  process limit also comes from a cgroup `pids.max` when we can create a cgroup, and from a
  watchdog in the runner that counts the sandbox's processes when we cannot.
- A cgroup also bounds the memory of the whole sandbox (cgroup v2 `memory.max`), which
  per-process RLIMIT_AS cannot: 64 processes x 4 GiB is not a limit.

Cgroups are created below our own cgroup (never elsewhere in the hierarchy), only when its
controllers are already enabled for children (v2) or the hierarchy is writable (v1 `pids`;
the v1 memory controller is left alone). Anything else is reported as a note, not an error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandbox.process.tree import children, family
from sandbox.spec import LimitName, Limits

__all__ = [
    "CgroupSupport",
    "SandboxCgroup",
    "classify_exit",
    "count_namespace_processes",
    "count_sandbox_processes",
    "detect_cgroups",
    "kill_sandbox_init",
    "sandbox_command_pids",
    "sandbox_init_pid",
    "tree_usage",
]


class CgroupSupport(BaseModel):
    """What cgroup control this host gives us (found once, see `detect_cgroups`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1, 2] | None
    pids_parent: Path | None
    """Directory under which per-sandbox `pids` cgroups are created."""
    memory_parent: Path | None
    """Directory under which per-sandbox `memory` cgroups are created (v2 only)."""
    note: str
    """One line for the doctor: what is used, or why nothing is."""

    @property
    def available(self) -> bool:
        return self.pids_parent is not None or self.memory_parent is not None


def detect_cgroups(
    *, proc_self: Path = Path("/proc/self"), probe_write: bool = True
) -> CgroupSupport:
    """Find a cgroup we may create children in, below our own cgroup.

    `probe_write` creates and removes one test cgroup, because write permission bits say
    little on cgroupfs (delegation, read-only mounts in containers).
    """
    try:
        own = _own_cgroups(proc_self / "cgroup")
        mounts = _cgroup_mounts(proc_self / "mountinfo")
    except OSError as exc:
        return CgroupSupport(
            version=None, pids_parent=None, memory_parent=None, note=f"cgroups not readable: {exc}"
        )
    v2_mount = mounts.get("cgroup2")
    if v2_mount is not None and "" in own:
        parent = _join(v2_mount, own[""])
        if parent is not None:
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = []
            pids = parent if "pids" in enabled else None
            memory = parent if "memory" in enabled else None
            if (pids or memory) and (not probe_write or _can_create(parent)):
                used = " and ".join(n for n, p in (("pids", pids), ("memory", memory)) if p)
                return CgroupSupport(
                    version=2,
                    pids_parent=pids,
                    memory_parent=memory,
                    note=f"cgroup v2 under {parent} ({used})",
                )
    v1_pids = mounts.get("pids")
    if v1_pids is not None and "pids" in own:
        parent = _join(v1_pids, own["pids"])
        if parent is not None and (not probe_write or _can_create(parent)):
            return CgroupSupport(
                version=1,
                pids_parent=parent,
                memory_parent=None,
                note=f"cgroup v1 pids under {parent}; memory: rlimits only",
            )
    return CgroupSupport(
        version=None,
        pids_parent=None,
        memory_parent=None,
        note="no writable cgroup below ours: process count by RLIMIT_NPROC (not for host "
        "root) and the runner's watchdog; memory by RLIMIT_AS per process",
    )


def _own_cgroups(path: Path) -> dict[str, str]:
    """controller -> our cgroup path; the v2 entry has controller ``""``."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                out[controller] = parts[2]
    return out


def _cgroup_mounts(path: Path) -> dict[str, tuple[Path, str]]:
    """ "cgroup2" or a v1 controller -> (mount point, root of the mount)."""
    out: dict[str, tuple[Path, str]] = {}
    for line in path.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        root, mount_point = fields[3], Path(_unescape(fields[4]))
        fstype, options = rfields[0], rfields[2].split(",")
        if fstype == "cgroup2":
            out.setdefault("cgroup2", (mount_point, root))
        elif fstype == "cgroup":
            for option in options:
                out.setdefault(option, (mount_point, root))
    return out


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")


def _join(mount: tuple[Path, str], own: str) -> Path | None:
    mount_point, root = mount
    if root == "/":
        relative = own.lstrip("/")
    elif own == root or own.startswith(root.rstrip("/") + "/"):
        relative = own[len(root) :].lstrip("/")
    else:
        return None
    parent = mount_point / relative
    return parent if parent.is_dir() else None


def _can_create(parent: Path) -> bool:
    probe = parent / f"warren-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


@dataclass
class SandboxCgroup:
    """The cgroup(s) of one sandbox. Created before bwrap starts (bwrap is started by a tiny
    shell that enters them first, so no process ever runs outside), removed after."""

    directories: list[Path]
    version: Literal[1, 2]
    caps_processes: bool = False
    """Its `pids.max` holds the sandbox's process limit: the kernel refuses a fork past it
    (`sandbox.run`'s watchdog then only has to notice a refusal)."""

    @classmethod
    def create(cls, support: CgroupSupport, limits: Limits) -> SandboxCgroup | None:
        """A fresh cgroup with `limits` applied, or None when the host offers none.

        Errors: none; a cgroup that cannot be made is skipped (the rlimits and the watchdog
        still hold) because the host changed under us, which is not the command's fault.
        """
        if support.version is None:
            return None
        name = f"warren-{uuid.uuid4().hex[:12]}"
        parents = {p for p in (support.pids_parent, support.memory_parent) if p is not None}
        created: list[Path] = []
        caps_processes = False
        try:
            for parent in sorted(parents):
                directory = parent / name
                directory.mkdir()
                created.append(directory)
                if parent == support.pids_parent and limits.processes is not None:
                    (directory / "pids.max").write_text(str(limits.processes))
                    caps_processes = True
                if parent == support.memory_parent and limits.memory_bytes is not None:
                    (directory / "memory.max").write_text(str(limits.memory_bytes))
                    with contextlib.suppress(OSError):
                        (directory / "memory.swap.max").write_text("0")
        except OSError:
            for directory in created:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            return None
        return cls(directories=created, version=support.version, caps_processes=caps_processes)

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.directories]

    def _read(self, filename: str) -> str | None:
        for directory in self.directories:
            path = directory / filename
            if path.exists():
                with contextlib.suppress(OSError):
                    return path.read_text()
        return None

    def pids_max_hit(self) -> bool:
        """The kernel refused a fork because of `pids.max`."""
        return _counter(self._read("pids.events"), "max") > 0

    def oom_killed(self) -> bool:
        """The memory controller killed a process (v2 `memory.events`)."""
        return _counter(self._read("memory.events"), "oom_kill") > 0

    def kill_all(self) -> None:
        """SIGKILL everything still inside (normally nothing: the pid namespace died with
        bwrap)."""
        for directory in self.directories:
            kill_file = directory / "cgroup.kill"
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
                continue
            with contextlib.suppress(OSError):
                for pid in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)

    def try_remove(self) -> bool:
        """rmdir every directory; False while processes are still leaving (try again)."""
        remaining = []
        for directory in self.directories:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(directory)
        self.directories = remaining
        return not remaining


def _counter(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def sandbox_init_pid(bwrap_pid: int) -> int | None:
    """Host pid of the sandbox's init (bwrap's child, pid 1 in the sandbox), if running (a
    raw read: the sandbox watchdog asks ten times a second per sandbox, from the
    coordinator's trio thread)."""
    found = children(bwrap_pid)
    return found[0] if found else None


def kill_sandbox_init(bwrap_pid: int) -> bool:
    """SIGKILL the sandbox's init, which kills its whole pid namespace at once (bwrap sees its
    child die and exits by itself; killing bwrap first would orphan the init to the host's
    init, to be reaped there). False when there is no init (not started yet, or gone): then
    kill bwrap itself."""
    init = sandbox_init_pid(bwrap_pid)
    if init is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(init, signal.SIGKILL)
    return True


def sandbox_command_pids(bwrap_pid: int) -> list[int]:
    """Host pids of the init's children: the command we asked the sandbox to run."""
    init = sandbox_init_pid(bwrap_pid)
    if init is None:
        return []
    return children(init)


def count_sandbox_processes(bwrap_pid: int) -> int | None:
    """Processes in the sandbox's pid namespace (bwrap's child is the namespace's init);
    None when they cannot be counted (`count_namespace_processes`)."""
    init = sandbox_init_pid(bwrap_pid)
    return None if init is None else count_namespace_processes(init)


def count_namespace_processes(init: int) -> int | None:
    """Processes in the pid namespace whose init has host pid `init`, counted through the
    namespace's own /proc: it lists exactly them.

    None when it cannot be read: not set up yet (the init's root is still the host's, whose
    /proc would count every process on the machine), or already gone.
    """
    own_proc = f"/proc/{init}/root/proc"
    try:
        if os.stat(own_proc).st_dev == os.stat("/proc").st_dev:
            return None
        names = os.listdir(own_proc)
    except OSError:
        return None
    return sum(1 for name in names if name.isdigit())


def tree_usage(pid: int) -> tuple[int, float] | None:
    """Resident memory (bytes) and CPU time (seconds, reaped children included) of `pid` and
    all its descendants; None when `pid` is gone.

    Read from each process's `/proc/PID/stat` (one read gives both), not through psutil: the
    pool measures every worker's tree twice a second in the coordinator's trio thread (a
    remote worker's, in its Ray actor on the node: workers/remote/actor.py), and psutil's
    objects cost 0.3 ms per process there; the tree is walked the same way
    (`sandbox.process.tree.family`). Here, not in workers.pool, so that the actor measures
    without importing the coordinator's modules."""
    rss, cpu = 0, 0.0
    for member in family(pid):
        usage = _stat_usage(member)
        if usage is None:
            if member == pid:
                return None
            continue  # exited meanwhile
        rss += usage[0]
        cpu += usage[1]
    return rss, cpu


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_usage(pid: int) -> tuple[int, float] | None:
    """(resident bytes, CPU seconds of the process and its reaped children) of one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # After the command name (in parentheses, which may hold anything): field 3 onwards.
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) < 22:
        return None
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[21]) * _PAGE_BYTES, (utime + stime + cutime + cstime) / _TICKS_PER_S


def classify_exit(
    returncode: int, limits: Limits, *, cgroup: SandboxCgroup | None = None
) -> LimitName | None:
    """Which limit (if any) explains this exit status of bwrap.

    bwrap exits with 128+N when the command dies of signal N. SIGXCPU and SIGXFSZ are only
    ever sent for RLIMIT_CPU and RLIMIT_FSIZE, so they are unambiguous when those limits are
    set; a cgroup adds the OOM killer and pids.max.
    """
    if cgroup is not None and cgroup.oom_killed():
        return "memory"
    if cgroup is not None and cgroup.pids_max_hit():
        return "processes"
    signo = returncode - 128 if returncode > 128 else -returncode if returncode < 0 else 0
    if signo == signal.SIGXCPU and limits.cpu_time_s is not None:
        return "cpu_time"
    if signo == signal.SIGXFSZ and limits.file_size_bytes is not None:
        return "file_size"
    return None
