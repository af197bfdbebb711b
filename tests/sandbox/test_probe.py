"""The floor probe: proven on this host, and a diagnosis with a fix for each way it fails."""

# Host-side checks of small scratch trees after the sandbox ended; blocking is fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from sandbox.binary import BwrapBinary
from sandbox.host import SandboxHost, host_env
from sandbox.probe import (
    FLOOR_REUSE_S,
    Diagnosis,
    FloorReport,
    KernelFacts,
    KnownFloor,
    diagnose,
    floor_key,
    probe_floor,
    read_kernel_facts,
    reuse_floor,
    reuse_known,
)

CORE_CHECKS = {
    "sandbox_starts",
    "workspace_writable",
    "write_outside_fails",
    "network_fails",
    "no_capabilities",
    "no_new_privs",
    "protected_path_unwritable",
    "secret_unreadable",
}


async def test_floor_is_proven_here(host: SandboxHost, scratch: Path) -> None:
    report = await probe_floor(host=host, base_dir=scratch)
    assert report.proven, report.render()
    assert {c.name for c in report.checks} >= CORE_CHECKS
    assert report.bwrap_path == str(host.bwrap.path)
    assert report.bwrap_version == ".".join(map(str, host.bwrap.version))
    assert list(scratch.iterdir()) == []  # the probe cleans up after itself
    assert json.loads(report.model_dump_json())["proven"] is True


def _fake_bwrap(directory: Path, stderr: str) -> Path:
    """A 'bwrap' that reports a good version but fails to build any sandbox."""
    path = directory / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "bubblewrap 0.11.0"; exit 0; fi\n'
        f"echo '{stderr}' >&2\nexit 1\n"
    )
    path.chmod(0o755)
    return path


async def test_a_sandbox_that_cannot_start_is_diagnosed(host: SandboxHost, scratch: Path) -> None:
    (scratch / "bin").mkdir()
    (scratch / "probe").mkdir()
    fake = _fake_bwrap(scratch / "bin", "bwrap: setting up uid map: Permission denied")
    broken = host.model_copy(
        update={"bwrap": BwrapBinary(path=fake, version=(0, 11, 0), source="explicit")}
    )
    kernel = KernelFacts(apparmor_restrict_unprivileged_userns=1, is_root=False)
    report = await probe_floor(host=broken, base_dir=scratch / "probe", kernel=kernel)
    assert not report.proven
    assert [c.name for c in report.checks] == ["sandbox_starts"]
    assert [d.code for d in report.diagnoses] == ["apparmor_userns_restricted"]
    assert "deploy/apparmor/warren-bwrap" in report.diagnoses[0].fix
    assert "fix:" in report.render()


async def test_missing_bwrap_is_diagnosed(scratch: Path) -> None:
    report = await probe_floor(bwrap=scratch / "no-such-bwrap", base_dir=scratch)
    assert not report.proven
    assert [d.code for d in report.diagnoses] == ["bwrap_missing"]
    assert report.bwrap_path is None


DIAGNOSES = [
    ("wsl1", "", KernelFacts(wsl1=True)),
    ("userns_max_zero", "bwrap: No space left on device", KernelFacts(max_user_namespaces=0)),
    (
        "userns_disabled",
        "bwrap: No permissions to creating new namespace, likely because the kernel does not "
        "allow non-privileged user namespaces.",
        KernelFacts(unprivileged_userns_clone=0),
    ),
    (
        "apparmor_userns_restricted",
        "bwrap: setting up uid map: Permission denied",
        KernelFacts(apparmor_restrict_unprivileged_userns=1),
    ),
    (
        "container_without_userns",
        "bwrap: Creating new namespace failed: Operation not permitted",
        KernelFacts(in_container=True),
    ),
    ("unknown", "bwrap: something else", KernelFacts()),
    # Root is not subject to the unprivileged-userns switches:
    ("unknown", "bwrap: something else", KernelFacts(unprivileged_userns_clone=0, is_root=True)),
]


@pytest.mark.parametrize(
    ("code", "stderr", "kernel"),
    DIAGNOSES,
    ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(DIAGNOSES)],
)
def test_diagnose(code: str, stderr: str, kernel: KernelFacts) -> None:
    (diagnosis,) = diagnose(stderr, kernel)
    assert isinstance(diagnosis, Diagnosis)
    assert diagnosis.code == code
    assert diagnosis.fix


def test_read_kernel_facts(scratch: Path) -> None:
    proc = scratch / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "user").mkdir(parents=True)
    (proc / "1").mkdir()
    (proc / "sys/kernel/unprivileged_userns_clone").write_text("0\n")
    (proc / "sys/user/max_user_namespaces").write_text("15000\n")
    (proc / "sys/kernel/apparmor_restrict_unprivileged_userns").write_text("1\n")
    (proc / "sys/kernel/osrelease").write_text("4.4.0-19041-Microsoft\n")
    (proc / "1/cgroup").write_text("0::/docker/abc\n")
    facts = read_kernel_facts(proc=proc, root=scratch, environ={})
    assert facts.unprivileged_userns_clone == 0
    assert facts.max_user_namespaces == 15000
    assert facts.apparmor_restrict_unprivileged_userns == 1
    assert facts.wsl1 and facts.in_container


def test_report_renders_every_check() -> None:
    report = FloorReport(
        proven=False,
        checks=(),
        bwrap_path=None,
        bwrap_version=None,
        bwrap_source=None,
        notes=("no cgroup",),
    )
    assert report.render().startswith("floor: NOT PROVEN")
    assert "note: no cgroup" in report.render()


def test_a_known_floor_stands_in_only_for_the_same_host(host: SandboxHost, scratch: Path) -> None:
    """What the warm server proved is reused only for a host with the same bwrap (by path
    and file identity: a binary replaced in place is probed again), while proven and fresh."""
    bwrap = scratch / "bwrap"
    shutil.copy(host.bwrap.path, bwrap)
    copied = host.model_copy(update={"bwrap": host.bwrap.model_copy(update={"path": bwrap})})
    report = FloorReport(
        proven=True, checks=(), bwrap_path=str(bwrap), bwrap_version="0.11.0",
        bwrap_source="system", notes=("no cgroups",),
    )  # fmt: skip
    known = KnownFloor(key=floor_key(copied), report=report, proven_at=time.time())
    reused = reuse_floor(known, copied)
    assert reused is not None and reused.proven
    assert reused.notes[0] == "no cgroups" and "warm server" in reused.notes[-1]
    assert reuse_floor(known, host) is None  # another bwrap
    stale = known.model_copy(update={"proven_at": time.time() - FLOOR_REUSE_S - 1})
    assert reuse_floor(stale, copied) is None
    unproven = known.model_copy(update={"report": report.model_copy(update={"proven": False})})
    assert reuse_floor(unproven, copied) is None
    assert reuse_floor(None, copied) is None
    with bwrap.open("ab") as file:  # replaced in place: same path, another file
        file.write(b"\0")
    assert reuse_floor(known, copied) is None


def test_a_known_floor_lends_its_host_only_to_the_same_environment(
    host: SandboxHost, scratch: Path
) -> None:
    """A session takes the server's host instead of detecting its own (a `bwrap --version`
    on its way to the first request) only where `detect_host` would read the same
    environment, and only with the proof: a replaced bwrap is detected and probed again."""
    bwrap = scratch / "bwrap"
    shutil.copy(host.bwrap.path, bwrap)
    copied = host.model_copy(update={"bwrap": host.bwrap.model_copy(update={"path": bwrap})})
    report = FloorReport(
        proven=True, checks=(), bwrap_path=str(bwrap), bwrap_version="0.11.0",
        bwrap_source="system",
    )  # fmt: skip
    env = {"HOME": "/home/u", "XDG_STATE_HOME": "/s", "PATH": "/bin"}
    known = KnownFloor(
        key=floor_key(copied), report=report, proven_at=time.time(), host=copied,
        host_env=host_env(env),
    )  # fmt: skip
    reused = reuse_known(known, {**env, "PATH": "/elsewhere", "LANG": "C"})  # not read
    assert reused is not None and reused[0] == copied and reused[1].proven
    for name, value in (("HOME", "/home/v"), ("XDG_STATE_HOME", ""), ("WARREN_BWRAP", "/b")):
        assert reuse_known(known, {**env, name: value}) is None, name
    assert reuse_known(known.model_copy(update={"host": None}), env) is None
    assert reuse_known(None, env) is None
    with bwrap.open("ab") as file:
        file.write(b"\0")
    assert reuse_known(known, env) is None
