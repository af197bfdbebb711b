"""The writable roots as the coordinator sees them: scanned, then kept current by inotify.

The change sets of orchestrator/changes/recorder.py are differences between two `Scan`s. Restoring a
file needs its content from before the turn, and which files a Bash command will change is not
known in advance, so a scan keeps the content of each regular file it has not seen with this
stamp (size, mtime, ctime, inode; and mode) in the `ContentStore`: a whole scan reads the tree
once (a later session reuses the last one's stamps), and later refreshes look only at the names
inotify reports. Measured on a 10,000-file tree: tests/bench/bench_changes.py (numbers in the
README of orchestrator/).

Nothing in a workspace is trusted: no symlink is followed (directories are opened from the
root down with `O_NOFOLLOW`, files with `O_NOFOLLOW | O_NONBLOCK` and checked to be regular on
the open descriptor, read up to `MAX_KEPT_BYTES`); a link is recorded by its target text, a
FIFO or device by its kind only. `.git` directories are not scanned (an undo does not restore
git's own state), nor Warren's own state.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import termios
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, Literal

from orchestrator.changes.content_store import ContentStore
from sandbox.libc import IN_IGNORED, IN_Q_OVERFLOW, inotify_events, libc
from sandbox.safe_read import read_unchanged_at

__all__ = [
    "MAX_KEPT_BYTES",
    "MAX_SCAN_ENTRIES",
    "Entry",
    "Key",
    "Scan",
    "ScanStopped",
    "TreeState",
    "load_index",
    "open_parent",
    "scan",
    "walk",
    "watch_directory",
]

MAX_KEPT_BYTES = 16 * 1024 * 1024
"""Files larger than this (bytes) are tracked by their stat only: an undo refuses them."""

MAX_SCAN_ENTRIES = 200_000
"""Entries one scan looks at, at most (the rest is not tracked; the record says so)."""

MAX_NEW_BYTES_PER_SCAN = 256 << 20
"""Bytes one scan adds to the store at most (the first scan of a large tree); past it,
files are tracked by stat only."""

SKIPPED_DIRS = frozenset({".git"})

Kind = Literal["file", "link", "dir", "other"]
Key = tuple[str, str]
"""(root, path relative to it with `/` between parts)."""

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
"""Where `python -m orchestrator.changes.scan_child` finds this package."""

SCAN_NICENESS = 10
"""How much lower than the coordinator's the scan child's CPU priority is: behind the
coordinator and the user's own work."""


def _niced() -> list[str]:
    """`nice -n SCAN_NICENESS` by the system's own `nice` (never one `$PATH` finds: a
    workspace may be on it), so the scan child starts behind the coordinator; empty without
    one (the child then lowers its own priority once it runs: `orchestrator.changes.scan_child`)."""
    from sandbox.binary import find_system_tool  # not in the scan child's own imports

    nice = find_system_tool("nice")
    return [] if nice is None else [str(nice), "-n", str(SCAN_NICENESS)]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a writable root as a scan saw it."""

    kind: Kind
    mode: int
    """Permission bits (`st_mode & 0o7777`)."""
    sha: str | None = None
    """A file's SHA-256, its content kept in the store; None: not kept (too large, raced)."""
    target: str | None = None
    """A link's target text (never followed)."""
    stamp: tuple[int, int, int, int] = field(default=(0, 0, 0, 0), compare=False)
    """(size, mtime_ns, ctime_ns, inode): a later scan with the same stamp does not reopen it."""

    def same_content(self, other: Entry | None) -> bool:
        """Whether `other` holds what this does (a touch that changes only times does not
        count; a file whose content was not kept never equals anything)."""
        if other is None or other.kind != self.kind:
            return False
        match self.kind:
            case "file":
                return self.sha is not None and self.sha == other.sha and self.mode == other.mode
            case "link":
                return self.target == other.target
            case "dir":
                return True
            case _:
                return self.stamp == other.stamp

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "mode": self.mode}
        if self.kind == "file":
            data["sha"] = self.sha
            data["size"] = self.stamp[0]
        if self.target is not None:
            data["target"] = self.target
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Entry | None:
        if data is None:
            return None
        kind = data["kind"]
        if kind not in ("file", "link", "dir", "other"):
            raise ValueError(f"unknown kind {kind!r}")
        return cls(
            kind=kind,
            mode=int(data["mode"]),
            sha=data.get("sha"),
            target=data.get("target"),
            stamp=(int(data.get("size", 0)), 0, 0, 0),
        )


@dataclass
class Scan:
    """The writable roots at one moment: every name (below `.git` excepted) with its entry."""

    entries: dict[Key, Entry]
    complete: bool = True
    """False when `MAX_SCAN_ENTRIES` stopped the walk (changes past it are not seen)."""
    touched: frozenset[Key] | None = None
    """The names that may differ from the previous refresh's (the ones inotify named and
    what lies below them); None: any may (a whole scan)."""


def scan(
    roots: Sequence[Path],
    store: ContentStore,
    known: Mapping[Key, Entry] | None = None,
    *,
    max_entries: int = MAX_SCAN_ENTRIES,
    on_dir: Callable[[Path, str, int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    skip: Sequence[Path] = (),
) -> Scan:
    """Scan `roots` (absolute directories) without following any link; the content of a
    regular file is read (and kept in `store`) only when `known` has no entry with the same
    stamp; `on_dir(root, prefix, fd)` sees each directory; the directories in `skip`
    (Warren's own state, when a root holds it) are left out. Blocking: run it in a thread.

    **Errors:** `ScanStopped` as soon as `stop()` says so.
    """
    known = known or {}
    entries: dict[Key, Entry] = {}
    budget = [MAX_NEW_BYTES_PER_SCAN]
    complete = True
    for root in _distinct(roots):
        try:
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue  # a root that is gone has nothing to record
        try:
            seen = None if on_dir is None else partial(on_dir, root)
            left_out = _below(root, skip)
            for rel, fd_name, info, parent_fd in walk(root_fd, "", seen, left_out):
                if len(entries) >= max_entries:
                    complete = False
                    break
                if stop is not None and stop():
                    raise ScanStopped
                key = (str(root), rel)
                old = known.get(key)
                entries[key] = _entry(parent_fd, fd_name, info, old, store, budget)
        finally:
            os.close(root_fd)
    return Scan(entries, complete)


class ScanStopped(Exception):
    """A scan was told to stop (its session is closing)."""


def _below(root: Path, skip: Sequence[Path]) -> frozenset[str]:
    """The paths of `skip` inside `root`, relative to it."""
    return frozenset(str(p.relative_to(root)) for p in skip if p.is_relative_to(root) and p != root)


def _distinct(roots: Sequence[Path]) -> list[Path]:
    """The roots, each once, leaving out one that lies inside another (scanned with it)."""
    unique = sorted({Path(os.path.abspath(root)) for root in roots}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for root in unique:
        if not any(root.is_relative_to(other) for other in kept):
            kept.append(root)
    return kept


def walk(
    root_fd: int,
    prefix: str = "",
    on_dir: Callable[[str, int], None] | None = None,
    skip: frozenset[str] = frozenset(),
    *,
    enter: Callable[[str], bool] | None = None,
    skipped_dirs: frozenset[str] = SKIPPED_DIRS,
) -> Iterator[tuple[str, str, os.stat_result, int]]:
    """(relative path, name, lstat, parent directory fd) for every name below `root_fd`
    (whose own path is `prefix`, empty or ending in `/`), directories opened with
    `O_NOFOLLOW` from their parent's descriptor; `on_dir(prefix, fd)` for each directory
    before it is listed. The parent fd is valid only until the next item.

    Left out: the paths in `skip`, and directories named in `skipped_dirs` (`.git`) with
    what is below them; a directory for whose path `enter` says False is yielded but not
    listed (workers/remote/snapshot.py lists only the directories git named files in)."""
    stack: list[tuple[str, int]] = [(prefix, os.dup(root_fd))]
    try:
        while stack:
            prefix, dir_fd = stack.pop()
            try:
                if on_dir is not None:
                    on_dir(prefix, dir_fd)
                with os.scandir(dir_fd) as names:
                    listed = list(names)
                for item in listed:
                    rel = f"{prefix}{item.name}"
                    if rel in skip or (
                        item.name in skipped_dirs and item.is_dir(follow_symlinks=False)
                    ):
                        continue
                    try:
                        info = os.stat(item.name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        continue  # gone since the listing
                    if stat.S_ISDIR(info.st_mode) and (enter is None or enter(rel)):
                        try:
                            child = os.open(item.name, _DIR_FLAGS, dir_fd=dir_fd)
                        except OSError:
                            child = -1
                        if child >= 0:
                            stack.append((rel + "/", child))
                    yield rel, item.name, info, dir_fd
            except OSError:
                pass  # unreadable directory: its names are not tracked
            finally:
                os.close(dir_fd)
    finally:
        for _, fd in stack:
            os.close(fd)


def _stamp(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


def _entry(
    dir_fd: int,
    name: str,
    info: os.stat_result,
    old: Entry | None,
    store: ContentStore,
    budget: list[int],
) -> Entry:
    mode = stat.S_IMODE(info.st_mode)
    stamp = _stamp(info)
    if stat.S_ISDIR(info.st_mode):
        return Entry("dir", mode, stamp=stamp)
    if stat.S_ISLNK(info.st_mode):
        if old is not None and old.kind == "link" and old.stamp == stamp:
            return old
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return Entry("link", mode, target=target, stamp=stamp)
    if not stat.S_ISREG(info.st_mode):
        return Entry("other", mode, stamp=stamp)
    if old is not None and old.kind == "file" and old.stamp == stamp and old.mode == mode:
        return old
    return Entry("file", mode, sha=_keep(dir_fd, name, info, store, budget), stamp=stamp)


def _keep(
    dir_fd: int, name: str, info: os.stat_result, store: ContentStore, budget: list[int]
) -> str | None:
    """Read the regular file `name` (never a link, FIFO or device) and keep its content; its
    hash, or None when too large, over the budget, or changed while read."""
    if info.st_size > MAX_KEPT_BYTES or info.st_size > budget[0]:
        return None
    try:
        data = read_unchanged_at(dir_fd, name, info, MAX_KEPT_BYTES)
    except OSError:
        return None
    if data is None:
        return None  # swapped or changed since the stat, or grown past the limit
    try:
        sha, new = store.put(data)
    except OSError:
        return None  # a full state directory: tracked by stat, an undo refuses it
    if new:
        budget[0] -= len(data)
    return sha


# -- watching --------------------------------------------------------------------------------

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_ONLYDIR = 0x01000000
_IN_EXCL_UNLINK = 0x04000000
_WATCHED = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
    | _IN_DELETE | _IN_ONLYDIR | _IN_EXCL_UNLINK
)  # fmt: skip


class TreeState:
    """The writable roots as last seen, kept current by inotify instead of rescanning.

    The first `refresh` scans everything and puts a watch on every directory; later ones read
    the queued events and look again only at the names they mention (a new or replaced
    directory is scanned whole). Where inotify is unavailable, its watch limit is reached or
    its queue overflowed, `refresh` scans everything again (what `scan` alone costs).
    One refresher at a time (a lock): `start` runs the first, whole scan in a child process
    (orchestrator/changes/scan_child.py) while the session waits for the model, and the first
    writing call waits for it; its watches were set before each directory was read, so what
    changed while it ran is in the events the first refresh drains.

    The stamps and hashes of the last whole scan are kept per root in `index_dir` (a cache: a
    file whose stamp matches is not read again), so a later session in the same workspace
    reads only what changed since; the first session reads every file once.

    What inotify does not report: writes through a shared `mmap` (no event is generated).
    """

    def __init__(
        self,
        roots: Sequence[Path],
        store: ContentStore,
        index_dir: Path | None = None,
        skip: Sequence[Path] = (),
    ) -> None:
        """`skip`: directories never scanned (Warren's state: scanning its own store would
        grow it without end when the workspace holds it, as a home directory does)."""
        self.roots = _distinct(roots)
        self.store = store
        self.index_dir = index_dir
        self.skip = tuple(Path(os.path.abspath(p)) for p in skip)
        self.entries: dict[Key, Entry] = {}
        self.complete = True
        self._touched: set[Key] | None = None
        """The names set or dropped since the last refresh; None after a whole scan."""
        self._origin: dict[Key, Entry | None] | None = None
        """Since `mark`: each name set or dropped, with its entry at the mark (None: absent)."""
        self._origin_whole: dict[Key, Entry] | None = None
        """Since `mark`, once a whole scan replaced the entries: all of them at the mark."""
        self.full_scans = 0
        """How many whole scans ran (tests/bench/bench_changes.py reports it)."""
        self._fd = -1
        self._watches: dict[int, tuple[Path, str]] = {}
        self._degraded = False
        self._lock = threading.Lock()
        self._closed = False
        self._child: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None
        self._adopted: bool | None = None
        """Whether the child's answer was taken over (None: not tried yet; False: it failed,
        the first refresh scans in this process)."""
        """The first scan's process and its answer file, until adopted."""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Begin the first, whole scan now, in a child process (orchestrator/changes/scan_child.py):
        reading and hashing the tree there leaves the coordinator's loop and GIL alone. The
        first `refresh` waits for it; without `start`, that refresh starts it. Once started,
        returns at once (it never waits on the lock, which taking over the scan holds)."""
        if self._process is not None or self._closed:
            return  # set once, never unset: read without the lock
        with self._lock:
            if not self._closed and self._child is None and self.full_scans == 0:
                self._spawn()

    def _spawn(self) -> None:
        self._fd = libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        indexes = (
            []
            if self.index_dir is None
            else [[str(root), str(self._index_path(root))] for root in self.roots]
        )
        spec = {
            "roots": [str(root) for root in self.roots],
            "store": str(self.store.root),
            "indexes": indexes,
            "skip": [str(path) for path in self.skip],
            "inotify": self._fd,
        }
        answer = tempfile.TemporaryFile()  # noqa: SIM115 - kept open until adopted
        try:
            child = subprocess.Popen(
                [
                    *_niced(),
                    sys.executable,
                    "-m",
                    "orchestrator.changes.scan_child",
                    json.dumps(spec),
                ],
                stdin=subprocess.DEVNULL,
                stdout=answer,
                stderr=subprocess.DEVNULL,
                pass_fds=(self._fd,) if self._fd >= 0 else (),
                cwd=_PACKAGE_PARENT,
            )
        except OSError:
            answer.close()
            return  # the first refresh scans in this process
        self._child, self._process = (child, answer), child
        # Reaped and taken over as soon as it ends, not at the first writing call: a session
        # that never writes would keep a zombie, and that call would pay for reading the
        # answer (a table of every file).
        threading.Thread(
            target=self._adopt_when_done, args=(child,), name="scan-child", daemon=True
        ).start()

    def _adopt_when_done(self, child: subprocess.Popen[bytes]) -> None:
        child.wait()
        with self._lock:
            if self._closed or self._child is None or self._child[0] is not child:
                return  # closed, or a refresh took it over already
            with contextlib.suppress(ScanStopped):
                self._adopted = self._adopt()

    def _adopt(self) -> bool:
        """Wait for the child's scan and take it over; False when there is none to take (it
        failed or was never started: the caller scans in this process).

        **Errors:** `ScanStopped` when `close` stopped the child.
        """
        if self._child is None:
            return False
        child, answer = self._child
        self._child = None
        with answer:
            code = child.wait()
            if self._closed:
                raise ScanStopped
            if code != 0:
                return False
            try:
                answer.seek(0)
                data = json.loads(answer.read())
                entries: dict[Key, Entry] = {}
                for root, rel, kind, mode, sha, target, size, mtime, ctime, ino in data["entries"]:
                    if kind not in ("file", "link", "dir", "other"):
                        raise ValueError(f"unknown kind {kind!r}")
                    stamp = (int(size), int(mtime), int(ctime), int(ino))
                    entries[(str(root), str(rel))] = Entry(kind, int(mode), sha, target, stamp)
                watches = {
                    int(wd): (Path(root), str(prefix)) for wd, root, prefix in data["watches"]
                }
                complete, degraded = bool(data["complete"]), bool(data["degraded"])
            except (OSError, ValueError, TypeError, KeyError):
                return False
        self.full_scans += 1
        self._replace(entries, complete)
        self._watches, self._degraded = watches, degraded
        return True

    def refresh(self) -> Scan:
        """The roots now (a copy: later refreshes do not change it). Blocking.

        **Errors:** `ScanStopped` once closed; `OSError` from the file system.
        """
        with self._lock:
            self._update()
            touched, self._touched = self._touched, set()
            return Scan(
                dict(self.entries),
                self.complete,
                None if touched is None else frozenset(touched),
            )

    def mark(self) -> bool:
        """Bring the entries up to date and remember them as they are now, for `since_mark`
        (a turn's start), without copying them: from here each name's entry is noted the
        first time a refresh sets or drops it. Whether the scan was complete. Blocking.

        **Errors:** as `refresh`.
        """
        with self._lock:
            self._update()
            self._touched = set()
            self._origin, self._origin_whole = {}, None
            return self.complete

    def unmark(self) -> None:
        """Stop noting entries for `since_mark` (a turn's end)."""
        with self._lock:
            self._origin, self._origin_whole = None, None

    def mark_if_quiet(self) -> bool | None:
        """`mark` without blocking, when nothing is left to read: the first scan was taken
        over, no event is queued and no refresh is running (a turn's first call then starts
        without a trip to a thread). None otherwise: call `mark` (in a thread)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed or self._child is not None or self.full_scans == 0:
                return None
            if self._fd < 0 or self._degraded or _queued(self._fd) != 0:
                return None
            if self._touched is not None:
                self._touched.clear()
            self._origin, self._origin_whole = {}, None
            return self.complete
        finally:
            self._lock.release()

    def since_mark(
        self, *, remark: bool = False
    ) -> tuple[dict[Key, Entry], dict[Key, Entry], frozenset[Key] | None, bool]:
        """Refresh, then (before, after, names, complete): the entries at the last `mark` and
        now, only for the names set or dropped in between (`names`; None: all of them, after
        a whole scan), and whether this scan was complete. With `remark`, the mark moves to
        now in the same step (nothing can change in between). Blocking.

        **Errors:** as `refresh`; `ValueError` without a `mark`.
        """
        with self._lock:
            self._update()
            self._touched = set()
            if self._origin is None:
                raise ValueError("since_mark without a mark")
            found: tuple[dict[Key, Entry], dict[Key, Entry], frozenset[Key] | None, bool]
            if self._origin_whole is not None:
                found = self._origin_whole, dict(self.entries), None, self.complete
            else:
                before = {key: old for key, old in self._origin.items() if old is not None}
                after = {key: self.entries[key] for key in self._origin if key in self.entries}
                found = before, after, frozenset(self._origin), self.complete
            if remark:
                self._origin, self._origin_whole = {}, None
            return found

    def _update(self) -> None:
        """Apply what changed since the last refresh (the lock held)."""
        if self._closed:
            raise ScanStopped
        if self.full_scans == 0 and self._child is None and self._adopted is None:
            self._spawn()
        if self._child is not None:
            self._adopt()  # without an answer, the scan below is the first
        if self.full_scans == 0 or self._fd < 0 or self._degraded or not self._drain():
            self._full()

    def close(self) -> None:
        """Stop watching, after a scan in progress stopped; keep the stamps for next time."""
        self._closed = True
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(OSError):
                self._process.kill()  # its pack stays unindexed: ignored (content_store.py)
        with self._lock:
            if self._child is not None:
                self._child[0].wait()
                self._child[1].close()
                self._child = None
            self._unwatch()
            if self.index_dir is not None and self.entries:
                with contextlib.suppress(OSError):
                    self._save_index()

    def _unwatch(self) -> None:
        # Closing an inotify fd waits for the kernel to retire its watches: not our wait.
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            threading.Thread(target=os.close, args=(fd,), name="inotify-close", daemon=True).start()

    def _full(self) -> None:
        self.full_scans += 1
        self._unwatch()
        self._watches.clear()
        self._degraded = False
        known = self.entries
        if not known and self.index_dir is not None:
            known = self._load_index()
        self._fd = libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        on_dir = self._watch if self._fd >= 0 else None
        with self.store.packing():
            result = scan(
                self.roots, self.store, known, on_dir=on_dir, stop=self._stopping, skip=self.skip
            )
        self._replace(result.entries, result.complete)

    def _replace(self, entries: dict[Key, Entry], complete: bool) -> None:
        """Take a whole scan's entries; a mark's entries are kept whole first (the mark's
        view, put back from what changed since)."""
        if self._origin is not None and self._origin_whole is None:
            whole = dict(self.entries)
            for key, old in self._origin.items():
                if old is None:
                    whole.pop(key, None)
                else:
                    whole[key] = old
            self._origin_whole = whole
        self.entries, self.complete, self._touched = entries, complete, None

    def _stopping(self) -> bool:
        return self._closed

    def _index_path(self, root: Path) -> Path:
        assert self.index_dir is not None
        return self.index_dir / (hashlib.sha256(os.fsencode(root)).hexdigest()[:32] + ".json")

    def _load_index(self) -> dict[Key, Entry]:
        assert self.index_dir is not None
        known: dict[Key, Entry] = {}
        for root in self.roots:
            known.update(load_index(root, self._index_path(root)))
        return known

    def _save_index(self) -> None:
        assert self.index_dir is not None
        self.index_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for root in self.roots:
            files = {
                rel: [e.mode, e.sha, *e.stamp]
                for (owner, rel), e in self.entries.items()
                if owner == str(root) and e.kind == "file" and e.sha is not None
            }
            path = self._index_path(root)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temp.write_text(json.dumps({"root": str(root), "files": files}))
            os.replace(temp, path)

    def _watch(self, root: Path, prefix: str, dir_fd: int) -> None:
        if self._fd < 0 or self._degraded:
            return
        wd = watch_directory(self._fd, dir_fd)
        if wd < 0:
            self._degraded = True  # ENOSPC (the watch limit) or worse: scan every time
            return
        self._watches[wd] = (root, prefix)

    def _drain(self) -> bool:
        """Apply the queued events; False when they cannot be trusted (overflow)."""
        dirty: set[Key] = set()
        try:
            for wd, mask, name in inotify_events(self._fd):
                if mask & IN_Q_OVERFLOW:
                    return False
                if mask & IN_IGNORED:
                    self._watches.pop(wd, None)
                    continue
                where = self._watches.get(wd)
                if where is not None and name:
                    dirty.add((str(where[0]), where[1] + os.fsdecode(name)))
        except OSError:
            return False
        if len(self.entries) + len(dirty) > MAX_SCAN_ENTRIES:
            return False
        budget = [MAX_NEW_BYTES_PER_SCAN]
        for key in sorted(dirty, key=lambda key: key[1].count("/")):
            self._look_again(key, budget)
        return not self._degraded

    def _look_again(self, key: Key, budget: list[int]) -> None:
        root, rel = key
        if any(rel == left or rel.startswith(left + "/") for left in _below(Path(root), self.skip)):
            return
        old = self.entries.get(key)
        try:
            parent = open_parent(Path(root), rel)
        except OSError:
            parent = None  # a directory on the way was removed or replaced by a link
        if parent is None:
            self._forget(key)
            return
        dir_fd, name = parent
        try:
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                self._forget(key)
                return
            if name in SKIPPED_DIRS and stat.S_ISDIR(info.st_mode):
                return
            entry = _entry(dir_fd, name, info, old, self.store, budget)
            if entry.kind == "dir" and (
                old is None or old.kind != "dir" or old.stamp[3] != entry.stamp[3]
            ):
                self._forget(key)  # a directory new here: what is below it is new too
                self._scan_below(key, dir_fd, name, budget)
            elif entry.kind != "dir" and old is not None and old.kind == "dir":
                self._forget(key)
            self._set(key, entry)
        finally:
            os.close(dir_fd)

    def _scan_below(self, key: Key, parent_fd: int, name: str, budget: list[int]) -> None:
        root, rel = key
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError:
            return
        try:
            on_dir = partial(self._watch, Path(root))
            left_out = _below(Path(root), self.skip)
            for sub, sub_name, info, sub_parent in walk(fd, rel + "/", on_dir, left_out):
                sub_key = (root, sub)
                old = self.entries.get(sub_key)
                self._set(sub_key, _entry(sub_parent, sub_name, info, old, self.store, budget))
        finally:
            os.close(fd)

    def _set(self, key: Key, entry: Entry) -> None:
        if self._origin is not None and key not in self._origin:
            self._origin[key] = self.entries.get(key)
        self.entries[key] = entry
        if self._touched is not None:
            self._touched.add(key)

    def _forget(self, key: Key) -> None:
        """Drop `key` and, when it was a directory, everything below it."""
        old = self.entries.pop(key, None)
        if old is not None:
            below = key[1] + "/"
            gone = [k for k in self.entries if k[0] == key[0] and k[1].startswith(below)]
            if self._origin is not None:
                self._origin.setdefault(key, old)
                for other in gone:
                    self._origin.setdefault(other, self.entries[other])
            for other in gone:
                del self.entries[other]
            if self._touched is not None:
                self._touched.add(key)
                self._touched.update(gone)


def _queued(fd: int) -> int:
    """Bytes of events waiting on the inotify descriptor `fd` (-1 when it cannot be told)."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return -1
    return count[0]


def load_index(root: Path, index: Path) -> dict[Key, Entry]:
    """The stamps a former session kept for `root` in `index` (empty when absent or damaged:
    the scan then reads the files)."""
    known: dict[Key, Entry] = {}
    try:
        data = json.loads(index.read_bytes())
        if data.get("root") != str(root):
            return {}
        for rel, (mode, sha, size, mtime, ctime, ino) in data["files"].items():
            if isinstance(sha, str):  # a blob gone since: an undo refuses it
                stamp = (int(size), int(mtime), int(ctime), int(ino))
                known[(str(root), rel)] = Entry("file", int(mode), sha, stamp=stamp)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}
    return known


def watch_directory(inotify_fd: int, dir_fd: int) -> int:
    """Watch the directory open as `dir_fd` (whatever its path became since it was opened)
    on `inotify_fd`: its watch descriptor, negative on failure (ENOSPC: the watch limit)."""
    wd: int = libc().inotify_add_watch(inotify_fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCHED)
    return wd


def open_parent(root: Path, rel: str, *, create: bool = False) -> tuple[int, str] | None:
    """A descriptor of `rel`'s directory, opened from `root` down without following links
    (and made, when `create`), with the last name; None when a directory on the way is absent.

    **Errors:** `OSError` when a name on the way is a link or not a directory.
    """
    *dirs, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, name
