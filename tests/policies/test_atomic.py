"""policies.atomic: files read and replaced where someone else controls the directory.

Each test attacks or faults the operation and then checks the host: the old bytes are intact,
nothing was written outside, nothing blocked.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies.atomic import (
    TEMPORARY_TRIES,
    AtomicWriteError,
    LinkRefused,
    ReplaceFailed,
    open_directory,
    read_regular,
    replace_file,
    temporary_name,
    write_atomic,
)
from sandbox.guard import STALE_TEMPORARY, WorkspaceGuard, remove_abandoned_temporary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory standing for the user's home: outside the tree and outside /tmp."""
    path = Path(tempfile.mkdtemp(prefix="warren-atomic-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_sigkill_at_any_moment_leaves_old_or_complete_new_bytes(tmp_path: Path) -> None:
    """A child rewrites a 16 MiB file in a loop, alternating two contents; it is killed once it
    reports writes under way. Each round the file holds one whole content, never a mix or a
    truncation, and at most the child's one temporary file is left beside it."""
    target = tmp_path / "policy.toml"
    size = 16 << 20
    target.write_bytes(b"A" * size)
    child_code = (
        "import sys; from pathlib import Path; from policies.atomic import write_atomic\n"
        f"target = Path({str(target)!r}); size = {size}\n"
        "for i in range(10**6):\n"
        "    print(i, flush=True)\n"
        "    write_atomic(target, (b'B' if i % 2 else b'A') * size)\n"
    )
    for round_ in range(6):
        child = subprocess.Popen(
            [sys.executable, "-c", child_code],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout is not None
        for _ in range(1 + round_ % 3):  # let it get 1..3 writes in
            assert child.stdout.readline()
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        data = target.read_bytes()
        assert len(data) == size
        assert data in (b"A" * size, b"B" * size)
        leftovers = [p for p in tmp_path.iterdir() if p != target]
        assert len(leftovers) <= 1 and all(p.name.startswith(".policy.toml.") for p in leftovers)
        for leftover in leftovers:
            leftover.unlink()


def test_a_link_on_the_way_is_refused_and_nothing_is_written_outside(
    tmp_path: Path, outside: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".warren").symlink_to(outside)
    with pytest.raises(LinkRefused):
        write_atomic(repo / ".warren" / "policy.local.toml", b"x", beneath=repo)
    with pytest.raises(LinkRefused):
        write_atomic(repo / ".warren" / "sub" / "f", b"x", beneath=repo)
    assert list(outside.iterdir()) == []
    with pytest.raises(LinkRefused):
        open_directory(repo / ".warren", beneath=repo)
    with pytest.raises(LinkRefused):
        open_directory(repo / ".." / "x", beneath=repo)


@pytest.mark.parametrize("kind", ["link", "fifo", "directory"])
def test_a_target_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, outside: Path, kind: str
) -> None:
    secret = outside / ".bashrc"
    secret.write_text("# mine\n")
    target = tmp_path / "f"
    if kind == "link":
        target.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    with pytest.raises(LinkRefused, match="nothing changed"):
        write_atomic(target, b"evil\n", beneath=tmp_path)
    assert secret.read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_mode_is_kept_and_a_new_file_gets_the_given_one(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("old")
    target.chmod(0o640)
    write_atomic(target, b"new")
    assert (target.read_bytes(), target.stat().st_mode & 0o777) == (b"new", 0o640)
    fresh = tmp_path / "d" / "g"
    write_atomic(fresh, b"x", mode=0o600, dir_mode=0o700)
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.parent.stat().st_mode & 0o777 == 0o700


def test_a_missing_directory_that_cannot_be_made_is_nothing_changed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AtomicWriteError, match="nothing changed"):
        write_atomic(blocker / "sub" / "f", b"x")


def test_read_regular_states(tmp_path: Path, outside: Path) -> None:
    (outside / "secret").write_text("s3cret")
    (tmp_path / "link").symlink_to(outside / "secret")
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_bytes(b"x" * 101)
    (tmp_path / "ok").write_bytes(b"x" * 100)
    (tmp_path / "dir").mkdir()
    (tmp_path / "linkdir").symlink_to(outside)

    def state(name: str, **kw: object) -> str:
        return read_regular(tmp_path / name, limit=100, **kw).state  # type: ignore[arg-type]

    assert state("link") == "link"
    assert read_regular(tmp_path / "link", limit=100).detail == str(outside / "secret")
    assert read_regular(tmp_path / "link", limit=100).content == b""
    assert state("zero") == "link"
    assert state("fifo") == "not a regular file"
    assert state("big") == "too large"
    assert read_regular(tmp_path / "ok", limit=100).content == b"x" * 100
    assert state("dir") == "not a regular file"
    assert state("missing") == "missing"
    assert state("linkdir/secret", beneath=tmp_path) == "link"
    assert state("link", follow_links=True) == "file"  # only for the user's own files
    assert state("zero", follow_links=True) == "not a regular file"


def test_every_atomic_writer_leaves_a_temporary_the_start_up_sweep_knows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Policy files and the tools' writes share one replace (`replace_file`): a write that
    dies before its rename leaves a temporary named as `sandbox.guard.STALE_TEMPORARY` says,
    and a failed one cleans it up and leaves the old bytes."""
    from policies.atomic import replace_file
    from sandbox.guard import STALE_TEMPORARY

    target = tmp_path / "policy.toml"
    target.write_bytes(b"old")
    seen: list[str] = []
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        seen.extend(name for name in os.listdir(tmp_path) if name != "policy.toml")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(AtomicWriteError, match="nothing changed"):
        write_atomic(target, b"new" * 1000, beneath=tmp_path)
    with pytest.raises(OSError, match="No space"):
        replace_file(target, b"new", old=target.stat())
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert len(seen) == 2 and all(STALE_TEMPORARY.fullmatch(name) for name in seen), seen
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["policy.toml"]


def test_a_sandbox_starting_in_the_middle_of_a_write_leaves_its_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every writable sandbox's guard, as it starts, sweeps the temporaries killed writes left
    in its roots, while writers beside it may be between their temporary's creation and its
    rename: a pool's replacement warm writer (the whole workspace writable) starting as a
    scoped writer writes lost that write, "No such file or directory" at the rename, in 1 of
    5-10 runs of tests/orchestrator/workflows/test_workflow_e2e.py. The live write's temporary
    is locked: the guard starting right then (here, as the write syncs) leaves it and the
    write lands; a killed write's, unlocked, is still swept."""
    ws = tmp_path / "ws"
    (ws / "catalog").mkdir(parents=True)
    target = ws / "catalog" / "out.txt"
    killed = ws / "billing" / temporary_name("out.txt")
    killed.parent.mkdir()
    killed.write_text("half a write")
    during: list[list[str]] = []
    real_fsync = os.fsync

    def a_sandbox_starts(fd: int) -> None:
        WorkspaceGuard.start([ws.resolve()], []).close()
        during.append(os.listdir(target.parent))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", a_sandbox_starts)
    replace_file(target, b"catalog\n", old=None)
    monkeypatch.setattr(os, "fsync", real_fsync)
    [[temporary]] = during
    assert STALE_TEMPORARY.fullmatch(temporary)
    assert target.read_bytes() == b"catalog\n"
    assert os.listdir(target.parent) == ["out.txt"]
    assert not killed.exists()


@pytest.mark.parametrize("sweep", ["removed it", "holds it", "every time"])
def test_a_sweep_between_a_temporarys_creation_and_its_lock_costs_a_new_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sweep: str
) -> None:
    """The sweep may come between the creation of a write's temporary and its lock: it has
    removed the file (the writer's lock then holds a file without a name) or holds the lock
    itself. The writer makes another temporary and the write lands; when that happens
    `TEMPORARY_TRIES` times, the write fails at its temporary file, the old bytes kept and
    no temporary left."""
    target = tmp_path / "out.txt"
    target.write_bytes(b"old")
    real_flock = fcntl.flock
    taken: list[str] = []
    holders: list[int] = []
    sweeping = False

    def swept_first(fd: int, operation: int) -> None:
        nonlocal sweeping
        if not sweeping and (sweep == "every time" or not taken):
            sweeping = True  # the sweep's own flock goes straight through
            [temporary] = [p for p in tmp_path.iterdir() if p.name != "out.txt"]
            taken.append(temporary.name)
            if sweep == "holds it":
                holders.append(os.open(temporary, os.O_RDONLY))
                real_flock(holders[-1], fcntl.LOCK_EX)
            else:
                assert remove_abandoned_temporary(temporary)
            sweeping = False
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", swept_first)
    try:
        if sweep == "every time":
            with pytest.raises(ReplaceFailed) as failed:
                replace_file(target, b"new", old=target.stat())
            assert failed.value.stage == "temporary file"
            assert len(taken) == TEMPORARY_TRIES
        else:
            replace_file(target, b"new", old=target.stat())
            assert len(taken) == 1
    finally:
        monkeypatch.setattr(fcntl, "flock", real_flock)
        for fd in holders:
            os.close(fd)
    assert target.read_bytes() == (b"old" if sweep == "every time" else b"new")
    assert os.listdir(tmp_path) == ["out.txt"]
