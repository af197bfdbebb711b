"""Per-turn change sets: what each writing turn changed, seen from the sandbox's side.

The model's word about what it changed is not evidence (a Bash command names no files), so
the coordinator looks at the writable roots itself: a scan before the first read-write call
of a turn and after each one, the turn's change set being the difference. `warren undo`
(orchestrator/undo.py) restores a turn from it.

Restoring needs each changed file's content from before the turn, and which files a Bash
command will change is not known in advance. So every scan keeps the content of each regular
file it has not seen with this stat (size, mtime, ctime, inode, mode) in a content-addressed
store (`ContentStore`, `~/.local/state/warren/objects`): the first scan of a session reads the
whole tree once; later scans read only what changed since the previous one, and a file whose
stat did not change is not opened. Measured on a 10,000-file tree (tests/bench/bench_changes.py;
the README has the numbers).

Why not bwrap's `--overlay` (works here, ~1 ms per sandbox): the main agent's tools run in a
long-lived tool host with a persistent shell, and the read-only host, the user and writable
subagents must see a write at once, not when an upper layer is merged at the end of a turn.

Nothing in a workspace is trusted: the scan never follows a symlink (directories are opened
from the root down with `O_NOFOLLOW`, files with `O_NOFOLLOW | O_NONBLOCK` and checked to be
regular on the open descriptor, read up to `MAX_KEPT_BYTES`); a link is recorded by its target
text, a FIFO or device by its kind only. `.git` directories are not scanned (git's own state is
not restored by an undo).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
import stat
import struct
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Literal

import structlog
import trio

from orchestrator.aio import closing_iter
from orchestrator.events import Event, ToolResultsMessage
from orchestrator.pipeline import ToolRunner
from orchestrator.plan import CallPlan
from orchestrator.tools.base import ToolContext, ToolOutput, ToolProgress

__all__ = [
    "MAX_KEPT_BYTES",
    "MAX_SCAN_ENTRIES",
    "Change",
    "ChangeRecorder",
    "ContentStore",
    "Entry",
    "Key",
    "RecordingRunner",
    "Scan",
    "ScanStopped",
    "TreeState",
    "TurnRecord",
    "append_record",
    "change_log_path",
    "diff",
    "open_parent",
    "read_turns",
    "scan",
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

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


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


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    before: Entry | None
    """None: the turn created it."""
    after: Entry | None
    """None: the turn removed it."""

    @property
    def path(self) -> Path:
        return Path(self.key[0], self.key[1])

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.key[0],
            "path": self.key[1],
            "before": None if self.before is None else self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        root, path = str(data["root"]), str(data["path"])
        if not Path(root).is_absolute() or not _is_plain_relative(path):
            raise ValueError(f"not a path inside a root: {root!r} {path!r}")
        return cls((root, path), Entry.from_json(data["before"]), Entry.from_json(data["after"]))


def _is_plain_relative(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and all(part not in ("", ".", "..") for part in parts) and "\0" not in path


class ContentStore:
    """File contents by SHA-256 under one directory, shared by sessions: one file per blob
    (`ab/cdef...`), and packs (`packs/<name>.pack` with a JSON index beside it) for the
    thousands of files a whole scan keeps at once (creating one file per blob cost 1.2 ms a
    file on the dev box; appending to one pack costs what writing the bytes costs).

    Nothing is fsynced (a first scan keeps a whole tree); `get` checks the hash instead, so a
    blob torn by a crash reads as missing and an undo that needs it refuses instead of
    restoring wrong bytes. A pack whose index was never written (a crash mid-scan) is ignored.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._packed: dict[str, tuple[Path, int, int]] | None = None
        self._pack: tuple[Path, BinaryIO, dict[str, tuple[Path, int, int]]] | None = None

    def _path(self, sha: str) -> Path:
        return self.root / sha[:2] / sha[2:]

    def _index(self) -> dict[str, tuple[Path, int, int]]:
        if self._packed is None:
            self._packed = {}
            for idx in sorted((self.root / "packs").glob("*.idx")):
                with contextlib.suppress(OSError, ValueError, TypeError):
                    pack = idx.with_suffix(".pack")
                    for sha, (offset, size) in json.loads(idx.read_bytes()).items():
                        self._packed[sha] = (pack, int(offset), int(size))
        return self._packed

    def has(self, sha: str) -> bool:
        return self.locate(sha) is not None or self._path(sha).is_file()

    def locate(self, sha: str) -> tuple[Path, int, int] | None:
        """Where a packed blob is: (pack, offset, size); None when not packed."""
        if self._pack is not None and sha in self._pack[2]:
            return self._pack[2][sha]
        return self._index().get(sha)

    @contextlib.contextmanager
    def packing(self) -> Iterator[None]:
        """Blobs `put` inside the block go to one new pack, indexed when the block ends."""
        packs = self.root / "packs"
        packs.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = packs / f"{time.time_ns()}-{os.getpid()}-{threading.get_ident()}.pack"
        added: dict[str, tuple[Path, int, int]] = {}
        try:
            with path.open("xb") as out:
                self._pack = (path, out, added)
                try:
                    yield
                finally:
                    self._pack = None
        finally:
            # Also after a scan stopped half-way: what was written whole is indexed.
            self._index_pack(path, added)

    def _index_pack(self, path: Path, added: dict[str, tuple[Path, int, int]]) -> None:
        with contextlib.suppress(OSError):
            if not added:
                path.unlink()
                return
            idx = path.with_suffix(".idx")
            temp = idx.with_suffix(".tmp")
            temp.write_text(json.dumps({sha: [at, size] for sha, (_, at, size) in added.items()}))
            os.replace(temp, idx)
            self._index().update(added)

    def put(self, data: bytes) -> tuple[str, bool]:
        """Keep `data`; its hash and whether it was new to the store."""
        sha = hashlib.sha256(data).hexdigest()
        if self.has(sha):
            return sha, False
        if self._pack is not None:
            path, out, added = self._pack
            offset = out.tell()
            out.write(data)
            added[sha] = (path, offset, len(data))
            return sha, True
        path = self._path(sha)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return sha, True

    def get(self, sha: str) -> bytes | None:
        """The content with hash `sha`, or None when missing or damaged."""
        try:
            data = self._path(sha).read_bytes()
        except OSError:
            where = self.locate(sha)
            if where is None:
                return None
            try:
                with where[0].open("rb") as pack:
                    pack.seek(where[1])
                    data = pack.read(where[2])
            except OSError:
                return None
        return data if hashlib.sha256(data).hexdigest() == sha else None


# -- scanning --------------------------------------------------------------------------------


@dataclass
class Scan:
    """The writable roots at one moment: every name (below `.git` excepted) with its entry."""

    entries: dict[Key, Entry]
    complete: bool = True
    """False when `MAX_SCAN_ENTRIES` stopped the walk (changes past it are not seen)."""


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
            for rel, fd_name, info, parent_fd in _walk(root_fd, "", seen, left_out):
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


def _walk(
    root_fd: int,
    prefix: str = "",
    on_dir: Callable[[str, int], None] | None = None,
    skip: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, str, os.stat_result, int]]:
    """(relative path, name, lstat, parent directory fd) for every name below `root_fd`
    (whose own path is `prefix`, empty or ending in `/`), directories opened with
    `O_NOFOLLOW` from their parent's descriptor; `on_dir(prefix, fd)` for each directory
    before it is listed. The parent fd is valid only until the next item."""
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
                        item.name in SKIPPED_DIRS and item.is_dir(follow_symlinks=False)
                    ):
                        continue
                    try:
                        info = os.stat(item.name, dir_fd=dir_fd, follow_symlinks=False)
                    except OSError:
                        continue  # gone since the listing
                    if stat.S_ISDIR(info.st_mode):
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
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or _stamp(before) != _stamp(info):
            return None  # swapped or changed since the stat
        data = _read_at_most(fd, MAX_KEPT_BYTES + 1)
        if len(data) > MAX_KEPT_BYTES or _stamp(os.fstat(fd)) != _stamp(info):
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        sha, new = store.put(data)
    except OSError:
        return None  # a full state directory: tracked by stat, an undo refuses it
    if new:
        budget[0] -= len(data)
    return sha


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    want = limit
    while want > 0:
        chunk = os.read(fd, min(want, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        want -= len(chunk)
    return b"".join(chunks)


def diff(before: Mapping[Key, Entry], after: Mapping[Key, Entry]) -> list[Change]:
    """What changed from `before` to `after`, sorted by root and path."""
    changes = []
    for key, new in after.items():
        old = before.get(key)
        if old is new:
            continue  # the scan reused the entry: same stamp, same content
        if old is None or not old.same_content(new):
            changes.append(Change(key, old, new))
    changes.extend(Change(key, before[key], None) for key in before.keys() - after.keys())
    changes.sort(key=lambda change: change.key)
    return changes


# -- watching --------------------------------------------------------------------------------

_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_FROM = 0x040
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_EXCL_UNLINK = 0x04000000
_WATCHED = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE
    | _IN_DELETE | _IN_ONLYDIR | _IN_EXCL_UNLINK
)  # fmt: skip
_EVENT = struct.Struct("iIII")


class TreeState:
    """The writable roots as last seen, kept current by inotify instead of rescanning.

    The first `refresh` scans everything and puts a watch on every directory; later ones read
    the queued events and look again only at the names they mention (a new or replaced
    directory is scanned whole). Where inotify is unavailable, its watch limit is reached or
    its queue overflowed, `refresh` scans everything again (what `scan` alone costs).
    One refresher at a time (a lock): `start` runs the first, whole scan in a thread of its
    own while the session waits for the model, and the first writing call waits for it.

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
        self.full_scans = 0
        """How many whole scans ran (tests/bench/bench_changes.py reports it)."""
        self._fd = -1
        self._watches: dict[int, tuple[Path, str]] = {}
        self._degraded = False
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Make the first, whole scan now in a daemon thread (`close` stops it)."""

        def first() -> None:
            with contextlib.suppress(ScanStopped, OSError):
                self.refresh()

        threading.Thread(target=first, name="change-scan", daemon=True).start()

    def refresh(self) -> Scan:
        """The roots now (a copy: later refreshes do not change it). Blocking.

        **Errors:** `ScanStopped` once closed; `OSError` from the file system.
        """
        with self._lock:
            if self._closed:
                raise ScanStopped
            if self._fd < 0 or self._degraded or not self._drain():
                self._full()
            return Scan(dict(self.entries), self.complete)

    def close(self) -> None:
        """Stop watching, after a scan in progress stopped; keep the stamps for next time."""
        self._closed = True
        with self._lock:
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
        self._fd = _inotify().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        on_dir = self._watch if self._fd >= 0 else None
        with self.store.packing():
            result = scan(
                self.roots, self.store, known, on_dir=on_dir, stop=self._stopping, skip=self.skip
            )
        self.entries, self.complete = result.entries, result.complete

    def _stopping(self) -> bool:
        return self._closed

    def _index_path(self, root: Path) -> Path:
        assert self.index_dir is not None
        return self.index_dir / (hashlib.sha256(os.fsencode(root)).hexdigest()[:32] + ".json")

    def _load_index(self) -> dict[Key, Entry]:
        known: dict[Key, Entry] = {}
        for root in self.roots:
            try:
                data = json.loads(self._index_path(root).read_bytes())
                if data.get("root") != str(root):
                    continue
                for rel, (mode, sha, size, mtime, ctime, ino) in data["files"].items():
                    if isinstance(sha, str):  # a blob gone since: an undo refuses it
                        stamp = (int(size), int(mtime), int(ctime), int(ino))
                        known[(str(root), rel)] = Entry("file", int(mode), sha, stamp=stamp)
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # no cache, or a damaged one: the scan reads the files
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
        # The descriptor's own directory, whatever its path became since it was opened.
        wd = _inotify().inotify_add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCHED)
        if wd < 0:
            self._degraded = True  # ENOSPC (the watch limit) or worse: scan every time
            return
        self._watches[wd] = (root, prefix)

    def _drain(self) -> bool:
        """Apply the queued events; False when they cannot be trusted (overflow)."""
        dirty: set[Key] = set()
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                return False
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0")
                offset += 16 + size
                if mask & _IN_Q_OVERFLOW:
                    return False
                if mask & _IN_IGNORED:
                    self._watches.pop(wd, None)
                    continue
                where = self._watches.get(wd)
                if where is not None and name:
                    dirty.add((str(where[0]), where[1] + os.fsdecode(name)))
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
            self.entries[key] = entry
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
            for sub, sub_name, info, sub_parent in _walk(fd, rel + "/", on_dir, left_out):
                sub_key = (root, sub)
                self.entries[sub_key] = _entry(
                    sub_parent, sub_name, info, self.entries.get(sub_key), self.store, budget
                )
        finally:
            os.close(fd)

    def _forget(self, key: Key) -> None:
        """Drop `key` and, when it was a directory, everything below it."""
        if self.entries.pop(key, None) is not None:
            below = key[1] + "/"
            for other in [k for k in self.entries if k[0] == key[0] and k[1].startswith(below)]:
                del self.entries[other]


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


@functools.cache
def _inotify() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


# -- recording -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnRecord:
    """One writing turn's change set as the change log holds it."""

    number: int
    changes: list[Change]
    tool_use_ids: list[str]
    complete: bool
    undone: bool = False


def change_log_path(transcript: Path) -> Path:
    """The change log beside a session's transcript (`<id>.changes.jsonl`)."""
    return transcript.with_suffix(".changes.jsonl")


def read_turns(log: Path) -> list[TurnRecord]:
    """The turns of a change log, oldest first, each marked undone or not.

    **Errors:** `OSError` when the log cannot be read; `ValueError` for a damaged record.
    """
    turns: dict[int, TurnRecord] = {}
    with log.open(encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("type") == "turn":
                number = int(record["turn"])
                turns[number] = TurnRecord(
                    number,
                    [Change.from_json(change) for change in record["changes"]],
                    [str(tool_use_id) for tool_use_id in record.get("tool_use_ids", [])],
                    bool(record.get("complete", True)),
                )
            elif record.get("type") == "undone":
                number = int(record["turn"])
                if number in turns:
                    done = turns[number]
                    turns[number] = TurnRecord(
                        done.number, done.changes, done.tool_use_ids, done.complete, undone=True
                    )
    return [turns[number] for number in sorted(turns)]


class ChangeRecorder:
    """The session's recorder: scans around read-write calls, one record per writing turn.

    `before_call` scans when a turn's first read-write call is about to run (catching what
    the user changed since); `after_call` scans after each read-write call. When the turn's
    results are in (`ToolResultsMessage`, this object is an event sink), the difference
    between the turn's first and last scan is appended to the change log, when not empty.
    """

    def __init__(
        self,
        roots: Sequence[Path],
        store: ContentStore,
        log: Path,
        write: Callable[[Callable[[], None]], None] | None = None,
        index_dir: Path | None = None,
        skip: Sequence[Path] = (),
    ) -> None:
        """`write` runs a state write (the session's I/O guard; by default, directly);
        `index_dir` keeps the stamps for the next session, `skip` names directories never
        scanned (`TreeState`)."""
        self.roots = tuple(roots)
        self.store = store
        self.log = log
        self._write = write or (lambda step: step())
        self._lock = trio.Lock()
        self.tree = TreeState(roots, store, index_dir, skip)
        self._last: Scan | None = None
        self._turn_start: Scan | None = None
        self._tool_use_ids: list[str] = []
        self._changes: list[Change] = []
        self._turns = 0
        self.scan_seconds = 0.0
        """Time spent scanning, summed (tests/bench/bench_changes.py reads it)."""

    def close(self) -> None:
        self.tree.close()

    async def _scan(self) -> Scan:
        started = time.perf_counter()
        result, changes = await trio.to_thread.run_sync(self._refresh, self._turn_start)
        self.scan_seconds += time.perf_counter() - started
        self._last, self._changes = result, changes
        return result

    def _refresh(self, start: Scan | None) -> tuple[Scan, list[Change]]:
        """A refresh, and the turn's changes so far (worked out here, off the event loop)."""
        result = self.tree.refresh()
        return result, [] if start is None else diff(start.entries, result.entries)

    async def before_call(self, tool_use_id: str) -> None:
        async with self._lock:
            self._tool_use_ids.append(tool_use_id)
            if self._turn_start is None:
                try:
                    self._turn_start = await self._scan()
                except (OSError, ScanStopped) as exc:  # this turn is not recorded
                    structlog.get_logger().warning("change scan failed", error=str(exc))

    async def after_call(self) -> None:
        async with self._lock:
            try:
                await self._scan()
            except (OSError, ScanStopped) as exc:
                structlog.get_logger().warning("change scan failed", error=str(exc))
                self._turn_start = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, ToolResultsMessage):
            self.end_turn()

    def end_turn(self) -> None:
        """Append the current turn's change set to the log (if anything changed)."""
        start, end, ids, changes = self._turn_start, self._last, self._tool_use_ids, self._changes
        self._turn_start, self._tool_use_ids, self._changes = None, [], []
        if start is None or end is None or not changes:
            return
        if self._turns == 0 and self.log.exists():  # a resumed session continues its numbers
            with contextlib.suppress(OSError, ValueError):
                self._turns = max((turn.number for turn in read_turns(self.log)), default=0)
        self._turns += 1
        record = {
            "type": "turn",
            "turn": self._turns,
            "ts": round(time.time(), 3),
            "tool_use_ids": ids,
            "complete": start.complete and end.complete,
            "changes": [change.to_json() for change in changes],
        }
        self._write(lambda: append_record(self.log, record))


def append_record(log: Path, record: Mapping[str, Any]) -> None:
    """One JSON line, appended and fsynced (an undo must find the record after a crash)."""
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        while data:
            written = os.write(fd, data)
            data = data[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


class RecordingRunner:
    """A `ToolRunner` that hands every call to `inner`, with read-write ones recorded."""

    def __init__(self, inner: ToolRunner, recorder: ChangeRecorder) -> None:
        self.inner = inner
        self.recorder = recorder

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        result: str | None = await self.inner.validate(plan, ctx)
        return result

    async def call(
        self, plan: CallPlan, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        if plan.sandbox != "rw":
            async with closing_iter(self.inner.call(plan, ctx)) as items:
                async for item in items:
                    yield item
            return
        await self.recorder.before_call(plan.block.id)
        try:
            async with closing_iter(self.inner.call(plan, ctx)) as items:
                async for item in items:
                    yield item
        finally:
            # Cancelled or not, what the call changed is recorded (bounded: one scan).
            with trio.CancelScope(shield=True), trio.move_on_after(60):
                await self.recorder.after_call()
