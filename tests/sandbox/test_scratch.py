"""`private_scratch`: a /tmp is emptied only inside a sandbox that says it is its own, never
the machine's. `empty_scratch` on plain directories: what a run can leave in a worker's /tmp
goes, links are not followed, and what it cannot remove is said. That a real worker finds its
scratch private and keeps a mount below /tmp (a workspace) is tests/workers/test_pool.py's
`test_read_only_workers_are_reused_bash_included_and_keep_nothing_of_a_run`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.scratch import MAX_DEPTH, PRIVATE_SCRATCH_ENV, SCRATCH, empty_scratch, private_scratch

SANDBOX_UID_MAP = "         0       1000          1\n"
HOST_UID_MAP = "         0          0 4294967295\n"
TMPFS = (
    "300 299 0:60 / /tmp rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=1048576k\n"
    "301 299 0:61 / /dev/shm rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=1048576k\n"
)
DISK_TMP = "41 1 8:1 /tmp /tmp rw,relatime - ext4 /dev/sda1 rw\n"
WORKSPACE_BELOW = "302 300 8:1 /home/u/ws /tmp/ws rw,relatime - ext4 /dev/sda1 rw\n"
OVER_TMP = "303 300 8:1 /home/u/x /tmp rw,relatime - ext4 /dev/sda1 rw\n"


@pytest.mark.parametrize(
    ("env", "uid_map", "mounts", "says"),
    [
        ({PRIVATE_SCRATCH_ENV: "1"}, SANDBOX_UID_MAP, TMPFS + WORKSPACE_BELOW, None),
        ({}, SANDBOX_UID_MAP, TMPFS, "is not set"),
        ({PRIVATE_SCRATCH_ENV: "yes"}, SANDBOX_UID_MAP, TMPFS, "is not set"),
        ({PRIVATE_SCRATCH_ENV: "1"}, HOST_UID_MAP, TMPFS, "machine's own user namespace"),
        ({PRIVATE_SCRATCH_ENV: "1"}, SANDBOX_UID_MAP, DISK_TMP + TMPFS[TMPFS.index("301"):],
         "/tmp is not a tmpfs"),
        ({PRIVATE_SCRATCH_ENV: "1"}, SANDBOX_UID_MAP, TMPFS + OVER_TMP, "/tmp is not a tmpfs"),
        ({PRIVATE_SCRATCH_ENV: "1"}, SANDBOX_UID_MAP, TMPFS[: TMPFS.index("301")],
         "/dev/shm is not a tmpfs"),
    ],
)  # fmt: skip
def test_only_a_sandboxs_own_scratch_is_found(
    tmp_path: Path, env: dict[str, str], uid_map: str, mounts: str, says: str | None
) -> None:
    (tmp_path / "uid_map").write_text(uid_map)
    (tmp_path / "mountinfo").write_text(mounts)
    found = private_scratch(env, proc=tmp_path)
    if says is None:
        assert found == SCRATCH
    else:
        assert isinstance(found, str) and says in found, found


def test_this_process_finds_no_scratch_of_its_own() -> None:
    """The test process is no pool worker's sandbox: its /tmp is everyone's."""
    assert PRIVATE_SCRATCH_ENV not in os.environ
    assert isinstance(private_scratch(os.environ), str)
    assert isinstance(private_scratch({PRIVATE_SCRATCH_ENV: "1"}, proc=Path("/nonexistent")), str)


def test_everything_a_run_left_goes_and_links_are_not_followed(tmp_path: Path) -> None:
    tmp, shm, outside = tmp_path / "tmp", tmp_path / "shm", tmp_path / "outside"
    for directory in (tmp, shm, outside):
        directory.mkdir()
    (outside / "kept.txt").write_text("kept")
    (tmp / "file").write_text("x")
    (tmp / "a" / "b").mkdir(parents=True)
    (tmp / "a" / "b" / "c").write_text("x")
    (tmp / "a" / "b").chmod(0)
    (tmp / "a").chmod(0o100)
    (tmp / "to-outside").symlink_to(outside)
    (tmp / "to-file").symlink_to(outside / "kept.txt")
    os.mkfifo(tmp / "fifo")
    (shm / "segment").write_bytes(b"\0" * 64)

    assert empty_scratch([tmp, shm, tmp_path / "missing"]) is None
    assert list(tmp.iterdir()) == [] and list(shm.iterdir()) == []
    assert (outside / "kept.txt").read_text() == "kept"


def test_what_cannot_be_emptied_is_said(tmp_path: Path) -> None:
    deep = tmp_path / "tmp"
    deep.joinpath(*["n"] * (MAX_DEPTH + 2)).mkdir(parents=True)
    left = empty_scratch([deep])
    assert left is not None and f"nested deeper than {MAX_DEPTH} directories" in left
    assert (deep / "n").exists()

    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "file").write_text("x")
    left = empty_scratch([slow], time_limit_s=0)
    assert left is not None and "longer than the time limit" in left
    assert empty_scratch([slow]) is None and not (slow / "file").exists()
