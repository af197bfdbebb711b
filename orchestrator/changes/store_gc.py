"""Pruning the content store (orchestrator/changes/content_store.py): what no undo can need goes.

Every session's first scan copies the writable roots into the store, so without pruning a
user's disk fills with copies of their repositories. An object is kept when it is
referenced by

- the change log of a session not older than `MAX_AGE_DAYS` (what its undo restores, and
  what it checks the files against), or
- a workspace's latest stamps (`<state>/scans/*.json`: the content each file had when last
  scanned, which the next session's first turn undoes to);

and then, if the kept objects still exceed `MAX_STORE_BYTES`, the oldest workspaces' stamps
are dropped first (their files are read again by their next session), then the oldest
sessions' references (their undo then refuses: "its old content was not kept"). Loose
objects are deleted; a pack is deleted when nothing in it is kept, rewritten with what is
kept when at least half of it is not.

It runs only while no session uses the store (sessions hold a shared `flock` on
`objects/.lock`, the collector an exclusive one, never waiting): at a session's end at most
once per `INTERVAL_SECONDS`, and on demand (`warren undo --gc`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GRACE_SECONDS",
    "INTERVAL_SECONDS",
    "MAX_AGE_DAYS",
    "MAX_STORE_BYTES",
    "Collected",
    "collect",
    "collect_when_due",
    "hold",
    "inventory",
    "sweep",
]

MAX_AGE_DAYS = 30
"""Sessions older than this (their change log's last write) lose their undo's content."""

MAX_STORE_BYTES = 1 << 30
"""What the store keeps at most (bytes); past it, the oldest workspaces' stamps go first."""

INTERVAL_SECONDS = 24 * 3600
"""How often a session's end collects (`warren undo --gc` collects at once)."""

GRACE_SECONDS = 3600
"""Loose objects and unindexed packs younger than this are left (a session that started
during a collection writes them)."""

_LOCK = ".lock"
_STAMP = ".collected"


@dataclass(frozen=True)
class Collected:
    """What one collection did."""

    ran: bool
    """False: a session was using the store (nothing was removed)."""
    removed: int = 0
    """Objects removed."""
    freed: int = 0
    """Bytes freed."""
    kept: int = 0
    """Bytes of the contents kept."""

    def line(self) -> str:
        if not self.ran:
            return "the content store is in use by a session; nothing removed (try again later)"
        return (
            f"removed {self.removed} stored contents ({_mib(self.freed)}); "
            f"{_mib(self.kept)} of contents kept"
        )


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


@contextlib.contextmanager
def hold(objects: Path) -> Iterator[None]:
    """A session's shared hold on the store: no collection runs while it lasts. Best effort
    (a state directory that cannot be written has no store to protect)."""
    fd = _lock_fd(objects)
    try:
        if fd >= 0:
            # Never waiting (a launch must not wait for a collection): during one, what this
            # session writes is younger than `GRACE_SECONDS`, which a collection leaves.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _lock_fd(objects: Path) -> int:
    try:
        objects.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(objects / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1


def collect_when_due(state: Path, objects: Path, sessions: Path) -> Collected | None:
    """`collect` when the last one is older than `INTERVAL_SECONDS` (a stat otherwise);
    never raises (a failed collection is tried again next time)."""
    try:
        if time.time() - (objects / _STAMP).stat().st_mtime < INTERVAL_SECONDS:
            return None
    except FileNotFoundError:
        if not objects.is_dir():
            return None
    except OSError:
        return None
    with contextlib.suppress(OSError, ValueError):
        return collect(state, objects, sessions)
    return None


def collect(
    state: Path,
    objects: Path,
    sessions: Path,
    *,
    max_age_days: float = MAX_AGE_DAYS,
    max_bytes: int = MAX_STORE_BYTES,
    now: float | None = None,
) -> Collected:
    """Remove what no kept reference needs (the module's rules), unless a session holds
    the store.

    **Errors:** `OSError` from the file system.
    """
    fd = _lock_fd(objects)
    if fd < 0:
        raise OSError(f"cannot open {objects / _LOCK}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Collected(ran=False)
        now = time.time() if now is None else now
        result = _collect(state, objects, sessions, now - max_age_days * 86400, max_bytes)
        (objects / _STAMP).touch()
        return result
    finally:
        os.close(fd)


def _collect(
    state: Path, objects: Path, sessions: Path, oldest: float, max_bytes: int
) -> Collected:
    sizes = inventory(objects)
    # (mtime, shas, index file or None): the oldest go first when over the cap.
    holders: list[tuple[float, set[str], Path | None]] = []
    for stamps in (state / "scans").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, KeyError):
            files = json.loads(stamps.read_bytes())["files"].values()
            holders.append((stamps.stat().st_mtime, {str(f[1]) for f in files}, stamps))
    for log in sessions.glob("*.changes.jsonl"):
        with contextlib.suppress(OSError, ValueError):
            mtime = log.stat().st_mtime
            if mtime >= oldest:
                holders.append((mtime, _log_shas(log), None))
    holders.sort(key=lambda holder: (holder[2] is None, holder[0]))  # stamps first, oldest first
    counts: dict[str, int] = {}
    for _, shas, _ in holders:
        for sha in shas:
            counts[sha] = counts.get(sha, 0) + 1
    kept = sum(size for sha, size in sizes.items() if sha in counts)
    for _, shas, index in holders:
        if kept <= max_bytes:
            break
        for sha in shas:
            counts[sha] -= 1
            if counts[sha] == 0:
                del counts[sha]
                kept -= sizes.get(sha, 0)
        if index is not None:
            with contextlib.suppress(OSError):
                index.unlink()  # its next session reads the files again
    removed, freed = sweep(objects, set(counts), time.time() - GRACE_SECONDS)
    return Collected(ran=True, removed=removed, freed=freed, kept=kept)


def _log_shas(log: Path) -> set[str]:
    shas: set[str] = set()
    with log.open(encoding="utf-8") as lines:
        for line in lines:
            with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
                record = json.loads(line)
                if record.get("type") != "turn":
                    continue
                for change in record["changes"]:
                    for side in (change.get("before"), change.get("after")):
                        if isinstance(side, dict) and isinstance(side.get("sha"), str):
                            shas.add(side["sha"])
    return shas


def inventory(objects: Path) -> dict[str, int]:
    """Every stored object's size, loose or packed (also what a Ray node's snapshot cache
    weighs: `workers.remote.snapshot.NodeCache.collect`)."""
    sizes: dict[str, int] = {}
    for shard in objects.glob("[0-9a-f][0-9a-f]"):
        for blob in shard.iterdir():
            if not blob.name.startswith("."):
                with contextlib.suppress(OSError):
                    sizes[shard.name + blob.name] = blob.stat().st_size
    for sha, (_, _, size) in _packed(objects).items():
        sizes.setdefault(sha, size)
    return sizes


def _packed(objects: Path) -> dict[str, tuple[Path, int, int]]:
    where: dict[str, tuple[Path, int, int]] = {}
    for idx in sorted((objects / "packs").glob("*.idx")):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            pack = idx.with_suffix(".pack")
            for sha, (offset, size) in json.loads(idx.read_bytes()).items():
                where.setdefault(str(sha), (pack, int(offset), int(size)))
    return where


def sweep(objects: Path, live: set[str], young: float) -> tuple[int, int]:
    """Delete what is not `live` (loose objects and unindexed packs changed since `young`
    excepted): (objects removed, bytes freed). The caller holds the store exclusively."""
    removed = freed = 0
    for shard in objects.glob("[0-9a-f][0-9a-f]"):
        for blob in shard.iterdir():
            sha = shard.name + blob.name
            if blob.name.startswith(".tmp-") or sha not in live:
                with contextlib.suppress(OSError):
                    info = blob.stat()
                    if info.st_mtime >= young:
                        continue
                    size = info.st_size
                    blob.unlink()
                    removed, freed = removed + 1, freed + size
    packs = objects / "packs"
    for pack in packs.glob("*.pack"):
        idx = pack.with_suffix(".idx")
        try:
            index = {
                str(sha): (int(at), int(size))
                for sha, (at, size) in json.loads(idx.read_bytes()).items()
            }
        except (OSError, ValueError, TypeError, AttributeError):
            # Never indexed: its scan was stopped, or is still running.
            with contextlib.suppress(OSError):
                if pack.stat().st_mtime >= young:
                    continue
            index = {}
        dead = {sha: size for sha, (_, size) in index.items() if sha not in live}
        total = pack.stat().st_size
        if len(dead) == len(index):
            for path in (idx, pack):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            removed, freed = removed + len(dead), freed + total
        elif sum(dead.values()) * 2 >= total:
            kept = _repack(pack, {sha: at for sha, at in index.items() if sha not in dead})
            removed, freed = removed + len(dead), freed + total - kept
    return removed, freed


def _repack(pack: Path, keep: dict[str, tuple[int, int]]) -> int:
    """Write what `pack` keeps to a new pack (indexed before the old one goes): its size."""
    new = pack.with_name(f"{time.time_ns()}-{os.getpid()}-gc.pack")
    index: dict[str, list[int]] = {}
    with pack.open("rb") as old, new.open("xb") as out:
        for sha, (at, size) in sorted(keep.items(), key=lambda item: item[1][0]):
            old.seek(at)
            index[sha] = [out.tell(), size]
            out.write(old.read(size))
        written = out.tell()
    temp = new.with_suffix(".tmp")
    temp.write_text(json.dumps(index))
    os.replace(temp, new.with_suffix(".idx"))
    pack.with_suffix(".idx").unlink()
    pack.unlink()
    return written
