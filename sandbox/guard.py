"""The workspace guard: protected names that do not exist yet are watched, not pre-created.

bwrap can only mount onto a path that exists, so a protected name that is missing (`.envrc`,
`.git/hooks`, `.github/workflows`, a nested `.git`) cannot be masked without creating a
placeholder in the user's tree. Placeholders were visible to the model, broke `Write .bashrc`
("is a directory"), confused git, and stayed after a crash. Instead, while a writable sandbox
runs, the guard watches the writable roots with inotify and undoes the creation of any
protected name, reporting it; existing protected paths are still mounted read-only (found by
the same walk, at any depth: see `Survey`).

Why inotify and not an overlay or a private mount arrangement: an overlay needs a writable
upper directory and would hide the agent's writes from the user until merged; bind tricks
need a mount point, which is the placeholder we are removing. inotify sees exactly what the
calls changed, so checking is proportional to the change, never a scan of the tree (except
after an event-queue overflow, where a bounded scan stands in for the lost events).

What runs when:

- `WorkspaceGuard.start` (in a thread, before the sandbox starts): one walk of each writable
  root (names and `d_type` via `os.scandir`, no symlink followed, `.git/objects` skipped,
  bounded), adding a watch per directory and noting existing protected paths and the
  gitlinks already in each git index. The watches exist before the sandbox does, so nothing
  it creates is missed.
- `drain()` (after every writable call, and when the sandbox ends): reads the queued events;
  a new directory gets its watch and is scanned (its content may predate the watch); each new
  path that is a protected name is removed, without following links, and reported; a changed
  `.git/index` is parsed (in Python: no git runs on the host) and new gitlinks are reported.

Removal opens every directory from the root down with `O_NOFOLLOW`, so a sandboxed process
that swaps a parent for a symlink cannot make the guard delete outside the root.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.libc import IN_IGNORED, IN_Q_OVERFLOW, inotify_events, libc

__all__ = [
    "GUARD_MESSAGE",
    "STALE_TEMPORARY",
    "ProtectedNames",
    "Survey",
    "WorkspaceGuard",
    "coordinator_writes",
    "find_denied",
    "list_gitlinks",
    "remove_abandoned_temporary",
    "survey",
]

GUARD_MESSAGE = (
    "Warren removed {path}: protected names cannot be created from the sandbox, because tools "
    "outside it ({tools}) would run it."
)
"""The note appended to a tool result for each undone creation."""

OWN_WRITE_WINDOW_S = 30.0
"""How long after `coordinator_writes` a guard leaves those paths alone."""

_own_writes: dict[Path, float] = {}


def coordinator_writes(path: Path) -> None:
    """This process (the coordinator, outside every sandbox) is about to create `path` in a
    workspace itself: an "always" rule saved to `.warren/policy.local.toml`, say. The guards
    of running sandboxes see the creation like any other; for `OWN_WRITE_WINDOW_S` they do
    not undo it, nor the directories leading to it, nor the write's temporary file (a new
    directory of ours is still watched)."""
    now = time.monotonic()
    for old in [p for p, at in _own_writes.items() if now - at > OWN_WRITE_WINDOW_S]:
        del _own_writes[old]
    _own_writes[Path(os.path.abspath(path))] = now


def _written_by_us(path: Path) -> bool:
    if not _own_writes:
        return False
    now = time.monotonic()
    for own, at in _own_writes.items():
        if now - at > OWN_WRITE_WINDOW_S:
            continue
        if path == own or path in own.parents:
            return True
        if path.parent == own.parent and path.name.startswith(f".{own.name[:40]}.warren-"):
            return True
    return False


STALE_TEMPORARY = re.compile(r"\..+\.warren-[0-9a-f]{12}\.tmp", re.S)
"""The name of an atomic write's temporary file (`policies.atomic.temporary_name`:
`.<name>.warren-<12 hex>.tmp`). The start-up walk removes those no writer holds
(`remove_abandoned_temporary`)."""


def remove_abandoned_temporary(path: Path) -> bool:
    """Remove the atomic write's temporary file `path` if no write is still at it; True when
    removed.

    A guard starts while writes go on in its roots: a pool starts a replacement warm writer
    (the whole workspace writable) as the scoped writers beside it write, another session
    works in the same tree. Each live write holds an exclusive `flock` on its temporary file
    from its creation to its rename (`policies.atomic.replace_file`), so only a file this can
    lock itself is one a killed write left; it is removed under that lock, and only while the
    name still is the file locked. A file locked elsewhere, or that cannot be opened, stays
    (the next start looks again). tests/policies/test_atomic.py sweeps in a write's middle.
    Never raises `OSError`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(held.st_mode) or not os.path.samestat(held, named):
            return False
        os.unlink(path)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


WALK_LIMIT = 200_000
"""Entries the start-up walk (and an overflow scan) looks at before it stops."""
MOUNT_LIMIT = 256
"""Nested protected paths mounted read-only at most; beyond, a warning."""

_GIT_INNER = ("hooks", "config", "commondir", "config.worktree", "modules")
"""Names directly inside a `.git` directory that make git run code or follow elsewhere."""
_ROOT_ONLY = frozenset(
    {".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zshenv",
     ".zprofile"}
)  # fmt: skip
"""Shell start-up files: they matter where the root is a home, not in every subdirectory."""

_TOOLS = {
    ".envrc": "direnv",
    ".vscode": "editors",
    ".idea": "editors",
    ".git": "git",
    ".gitmodules": "git",
    ".github": "CI",
    ".gitlab-ci.yml": "CI",
    ".warren": "Warren",
}


@dataclass(frozen=True)
class ProtectedNames:
    """Which relative paths are protected, at any depth below a writable root.

    Built from the spec's protected entries: `.git/X` protects `X` in every git directory,
    `a/b` protects `b` in every directory named `a`, a single name protects it everywhere
    (shell start-up files only at the root).
    """

    names: frozenset[str]
    pairs: frozenset[tuple[str, str]]
    git_inner: frozenset[str]
    exact: frozenset[tuple[str, ...]] = frozenset()
    """Whole relative paths (a secret's missing `.ssh` in a writable home)."""

    @classmethod
    def of(cls, entries: Iterable[str]) -> ProtectedNames:
        names: set[str] = {".git"}
        pairs: set[tuple[str, str]] = set()
        inner: set[str] = set(_GIT_INNER)
        for entry in entries:
            parts = tuple(p for p in entry.strip("/").split("/") if p not in ("", "."))
            if not parts or entry.startswith("/"):
                continue
            if parts[0] == ".git" and len(parts) == 2:
                inner.add(parts[1])
            elif len(parts) == 1:
                names.add(parts[0])
            else:
                pairs.add((parts[-2], parts[-1]))
        return cls(frozenset(names), frozenset(pairs), frozenset(inner))

    def match(self, parts: Sequence[str]) -> bool:
        """Is the path (its parts below a writable root) a protected name?"""
        name = parts[-1]
        if self.exact and tuple(parts) in self.exact:
            return True
        if name in self.names:
            return len(parts) == 1 or name not in _ROOT_ONLY
        if len(parts) >= 2:
            parent = parts[-2]
            if parent == ".git":
                return name in self.git_inner
            return (parent, name) in self.pairs
        return False


@dataclass
class Survey:
    """What the start-up walk found in the writable roots."""

    protected: list[Path] = field(default_factory=list)
    """Existing protected paths below the root level (the root level is `masks`' job)."""
    root_level: list[Path] = field(default_factory=list)
    """Existing protected names directly in a root."""
    directories: list[Path] = field(default_factory=list)
    """Every directory walked (the guard watches each)."""
    git_dirs: list[Path] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    """Every non-directory seen (for read-deny matching), when asked for."""
    stale_temporaries: list[Path] = field(default_factory=list)
    """Regular files named like an atomic write's temporary file (`STALE_TEMPORARY`): what a
    write killed between creating it and renaming it left behind."""
    truncated: bool = False
    """The walk stopped at `WALK_LIMIT` entries."""
    warnings: list[str] = field(default_factory=list)


def survey(
    roots: Sequence[Path], names: ProtectedNames, *, files: bool = False, limit: int = WALK_LIMIT
) -> Survey:
    """Walk each root once (no links followed, `.git` directories looked into but not below,
    existing protected directories not entered)."""
    out = Survey()
    budget = [limit]
    for root in roots:
        _walk(root, (), names, out, budget, files=files)
    if len(out.protected) > MOUNT_LIMIT:
        out.warnings.append(
            f"{len(out.protected)} nested protected paths found; only the first {MOUNT_LIMIT} "
            "are mounted read-only (the guard still undoes new ones)"
        )
        out.protected = out.protected[:MOUNT_LIMIT]
    return out


def _walk(
    directory: Path,
    rel: tuple[str, ...],
    names: ProtectedNames,
    out: Survey,
    budget: list[int],
    *,
    files: bool,
) -> None:
    stack = [(directory, rel)]
    while stack:
        path, parts = stack.pop()
        out.directories.append(path)
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        budget[0] -= len(entries)
        if budget[0] < 0:
            out.truncated = True
            return
        in_git = bool(parts) and parts[-1] == ".git"
        for entry in entries:
            sub = (*parts, entry.name)
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if names.match(sub):
                (out.protected if len(sub) > 1 else out.root_level).append(Path(entry.path))
                if entry.name == ".git" and is_dir:
                    out.git_dirs.append(Path(entry.path))
                    stack.append((Path(entry.path), sub))
                continue
            if in_git:
                continue  # only the direct children of a .git directory matter
            if is_dir:
                stack.append((Path(entry.path), sub))
                continue
            if STALE_TEMPORARY.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                out.stale_temporaries.append(Path(entry.path))
            elif files:
                out.files.append(Path(entry.path))


def find_denied(
    roots: Sequence[Path], denied: Callable[[str], bool], *, limit: int = WALK_LIMIT
) -> list[Path]:
    """Paths below `roots` that `denied` (an absolute path -> is it read-denied) covers, for
    masking: a denied directory is listed and not entered; no link is followed; `.git` is not
    entered (the repository's objects are not files a rule names)."""
    out: list[Path] = []
    stack = [os.fspath(root) for root in roots]
    budget = limit
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as scan:
                entries = list(scan)
        except OSError:
            continue
        budget -= len(entries)
        if budget < 0:
            break
        for entry in entries:
            if denied(entry.path):
                out.append(Path(entry.path))
            elif entry.name != ".git":
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return sorted(out)


# -- inotify -----------------------------------------------------------------------------

_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_ISDIR = 0x40000000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR | _IN_DONT_FOLLOW


class WorkspaceGuard:
    """Watches writable roots and undoes protected creations. Not thread-safe: one drainer."""

    def __init__(
        self, roots: Sequence[Path], names: ProtectedNames, quarantine: Path | None = None
    ) -> None:
        self.roots = tuple(roots)
        self.denied: Callable[[str], bool] | None = None
        """The policy's read deny rules (an absolute path -> is it denied), when set: `drain`
        then also collects new paths they cover in `new_denied`, since the sandboxes' masks
        were computed when they started (workers/toolhost_runner.py restarts them)."""
        self.new_denied: list[Path] = []
        self.quarantine = quarantine
        """Where removed paths are moved (Warren's state directory, masked in sandboxes)."""
        self.names = names
        self._fd = -1
        self._paths: dict[int, Path] = {}
        self._gitlinks: dict[Path, frozenset[str]] = {}
        self._adopted: set[Path] = set()
        """Protected directories the coordinator made itself while this sandbox ran (not
        mounted read-only in it): what the sandbox creates inside them is undone."""
        self.survey = Survey()
        self.degraded = False
        """Watches could not be added (limit reached): each drain scans instead (bounded)."""

    @classmethod
    def start(
        cls,
        roots: Sequence[Path],
        protected: Iterable[str],
        *,
        files: bool = False,
        quarantine: Path | None = None,
    ) -> WorkspaceGuard:
        """Watch `roots` (resolved directories) and walk them once. Never raises for the
        file system: a guard that cannot use inotify scans at each drain instead."""
        guard = cls(roots, ProtectedNames.of(protected), quarantine)
        fd = libc().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            guard.degraded = True
        guard._fd = fd
        # Watch before walking: whatever appears during the walk is an event, not a miss.
        for root in guard.roots:
            guard._watch(root)
        guard.survey = survey(guard.roots, guard.names, files=files)
        for temporary in guard.survey.stale_temporaries:
            # Left by a write killed mid-way, the target kept its bytes; or a live write's,
            # of a sandbox that runs already: that one is locked, and stays.
            remove_abandoned_temporary(temporary)
        for directory in guard.survey.directories:
            guard._watch(directory)
        for git_dir in guard.survey.git_dirs:
            guard._gitlinks[git_dir] = frozenset(list_gitlinks(git_dir / "index") or ())
        return guard

    def watch_paths(self, paths: Iterable[Path]) -> None:
        """Also undo the creation of these exact paths (missing secrets and absolute protected
        paths inside a writable root, from `HostFacts.watched`)."""
        extra: set[tuple[str, ...]] = set()
        for path in paths:
            located = self._relative(path)
            if located is not None:
                extra.add(located[1])
        if extra:
            self.names = dataclasses.replace(self.names, exact=self.names.exact | extra)

    def close(self) -> None:
        """Stop watching. Closing an inotify descriptor waits for the kernel to retire its
        watches (about 12 ms here: a one-shot writable sandbox took 58 ms instead of 46), so
        the close happens in a thread of its own and nobody waits for it."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            threading.Thread(target=os.close, args=(fd,), name="inotify-close", daemon=True).start()

    def _watch(self, path: Path) -> None:
        if self._fd < 0:
            return
        wd = libc().inotify_add_watch(self._fd, os.fsencode(path), _MASK)
        if wd < 0:
            if ctypes.get_errno() == errno.ENOSPC:
                self.degraded = True
            return
        self._paths[wd] = path

    # -- draining ----------------------------------------------------------------------

    def drain(self) -> list[str]:
        """Undo what the calls since the last drain created; one message per removal or
        refused gitlink. Cheap when nothing changed (one non-blocking read)."""
        created: list[tuple[Path, bool]] = []
        index_changed: set[Path] = set()
        overflow = self.degraded
        for wd, mask, name in inotify_events(self._fd) if self._fd >= 0 else ():
            if mask & IN_Q_OVERFLOW:
                overflow = True
                continue
            if mask & IN_IGNORED:
                self._paths.pop(wd, None)
                continue
            parent = self._paths.get(wd)
            if parent is None or not name:
                continue
            path = parent / os.fsdecode(name)
            if parent.name == ".git" and path.name == "index":
                index_changed.add(parent)
                continue
            if mask & (_IN_CREATE | _IN_MOVED_TO):
                created.append((path, bool(mask & _IN_ISDIR)))
        messages: list[str] = []
        if overflow:
            created.extend((path, False) for path in self._rescan())
        for path, is_dir in created:
            messages.extend(self._check_created(path, is_dir=is_dir))
            if self.denied is not None:
                self._note_denied(path, is_dir=is_dir)
        for git_dir in sorted(index_changed):
            messages.extend(self._check_index(git_dir))
        return messages

    def _note_denied(self, path: Path, *, is_dir: bool) -> None:
        """Collect `path` (or, for a new directory, what it already holds) when read-denied."""
        assert self.denied is not None
        if not os.path.lexists(path):
            return
        if self.denied(str(path)):
            self.new_denied.append(path)
        elif is_dir:
            self.new_denied.extend(find_denied([path], self.denied, limit=WALK_LIMIT // 10))

    def _relative(self, path: Path) -> tuple[Path, tuple[str, ...]] | None:
        for root in self.roots:
            parts = root.parts
            if path.parts[: len(parts)] == parts and len(path.parts) > len(parts):
                return root, path.parts[len(parts) :]
        return None

    def _check_created(self, path: Path, *, is_dir: bool) -> list[str]:
        located = self._relative(path)
        if _written_by_us(path):
            if is_dir:
                self._watch(path)
                if located is not None and self.names.match(located[1]):
                    self._adopted.add(path)
            return []
        if located is not None and path.parent in self._adopted:
            return self._undo(*located)
        if located is None:
            return []
        root, parts = located
        if any(p == ".git" for p in parts[:-1]) and not self.names.match(parts):
            return []  # inside a git directory: only its protected children matter
        if self.names.match(parts):
            return self._undo(root, parts)
        if not is_dir:
            return []
        # A new (or moved-in) directory: watch it, then look inside, since its content may
        # have been made before the watch existed.
        found = Survey()
        budget = [WALK_LIMIT]
        _walk(path, parts, self.names, found, budget, files=False)
        for directory in found.directories:
            self._watch(directory)
        messages: list[str] = []
        for protected in found.protected:
            sub = self._relative(protected)
            if sub is not None:
                messages.extend(self._undo(*sub))
        return messages

    def _rescan(self) -> list[Path]:
        """Events were lost: look at the whole tree (bounded) for protected names that were
        not there at start."""
        known = set(self.survey.protected)
        found = survey(self.roots, self.names)
        for directory in found.directories:
            if directory not in self._paths.values():
                self._watch(directory)
        known.update(self.survey.root_level)
        return [p for p in (*found.protected, *found.root_level) if p not in known]

    def _undo(self, root: Path, parts: tuple[str, ...]) -> list[str]:
        rel = "/".join(parts)
        try:
            kept = _remove_below(root, parts, self.quarantine)
            if kept is None:
                return []
        except OSError as exc:
            return [f"Warren could not remove {rel} ({exc.strerror}): protected names must not "
                    "be created from the sandbox; remove it before using git, direnv or an "
                    "editor here."]  # fmt: skip
        tool = next((_TOOLS[p] for p in reversed(parts) if p in _TOOLS), "shells, git")
        note = f" (moved to {kept}, in case someone outside the sandbox made it)" if kept else ""
        return [GUARD_MESSAGE.format(path=rel, tools=tool).removesuffix(".") + note + "."]

    def _check_index(self, git_dir: Path) -> list[str]:
        links = list_gitlinks(git_dir / "index")
        if links is None:
            return []
        before = self._gitlinks.get(git_dir, frozenset())
        new = sorted(set(links) - before)
        self._gitlinks[git_dir] = frozenset(links)
        located = self._relative(git_dir)
        where = "" if located is None or len(located[1]) == 1 else "/".join(located[1][:-1]) + "/"
        return [
            f"Warren found a new gitlink {where}{link} in the git index: git would run code of "
            f"that nested repository later. Remove it with `git rm --cached {where}{link}` "
            "(the user's git must not see it)."
            for link in new
        ]


def _remove_below(root: Path, parts: tuple[str, ...], quarantine: Path | None) -> str | None:
    """Take `root/parts...` (a file, link or whole directory) away, with every directory on the
    way opened `O_NOFOLLOW`: moved into `quarantine` when it is on the same file system (an
    event does not say who made the path: it may be the user's), else deleted. Returns where
    it went ("" when deleted), None when it was already gone."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return None
            os.close(fd)
            fd = next_fd
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if quarantine is not None:
            kept = _move_aside(fd, name, quarantine)
            if kept is not None:
                return kept
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
        return ""
    finally:
        os.close(fd)


def _move_aside(dir_fd: int, name: str, quarantine: Path) -> str | None:
    """Rename `name` into a fresh directory under `quarantine`; None when that is not possible
    (another file system, no state directory)."""
    try:
        quarantine.mkdir(parents=True, exist_ok=True, mode=0o700)
        slot = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=quarantine))
        os.rename(name, slot / name, src_dir_fd=dir_fd)
    except OSError:
        return None
    return str(slot / name)


# -- the git index -------------------------------------------------------------------------

_GITLINK = 0o160000


def list_gitlinks(index: Path, *, limit: int = 64 * 1024 * 1024) -> list[str] | None:
    """Paths of gitlink entries (mode 160000) in a git index, parsed in Python (versions 2-4,
    SHA-1). None when there is no index or it cannot be parsed."""
    try:
        fd = os.open(index, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit)
    finally:
        os.close(fd)
    return _parse_gitlinks(data)


def _parse_gitlinks(data: bytes) -> list[str] | None:
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        return None
    offset = 12
    previous = b""
    links: list[str] = []
    try:
        for _ in range(count):
            start = offset
            (mode,) = struct.unpack_from(">I", data, start + 24)
            (flags,) = struct.unpack_from(">H", data, start + 60)
            offset = start + 62
            if version >= 3 and flags & 0x4000:
                offset += 2
            if version == 4:
                strip, offset = _varint(data, offset)
                end = data.index(b"\0", offset)
                name = previous[: len(previous) - strip] + data[offset:end]
                offset = end + 1
                previous = name
            else:
                end = data.index(b"\0", offset)
                name = data[offset:end]
                offset = start + ((end - start) // 8 + 1) * 8
            if mode & 0o170000 == _GITLINK:
                links.append(os.fsdecode(name))
    except (struct.error, ValueError):
        return None
    return links


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    """git's offset encoding (varint.c)."""
    byte = data[offset]
    offset += 1
    value = byte & 0x7F
    while byte & 0x80:
        byte = data[offset]
        offset += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, offset
