"""Write scopes: the directories a scoped writer subagent may change, checked, made and hashed.

A writable `dispatch_agent` call may name `write_paths`; the kernel then lets its worker
write only beneath them (Landlock in a warm worker, or a fresh worker whose sandbox mounts only
them writable: workers/pool.py says which and why), and the scheduler runs writers whose
scopes are disjoint at once (orchestrator/calls/plan.py, `may_overlap`). This module is the
coordinator's side of that:

- `lexical_scope`: the scope as absolute paths, from the input alone (no file system), for the
  plan; None when it cannot be one (then the call is scheduled like any writer);
- `check_scope` / `open_scope`: the checks `validate` makes (inside a writable root, not the
  root itself, no `..`, no protected name, no symlink on the way, directories only) and, once
  the call is allowed, the missing directories made. Both walk from the root with
  `O_NOFOLLOW` directory descriptors, so a repository symlink is never followed on the host;
- `hash_scope` / `scope_changes`: the files of a scope before and after the run, by sha256,
  read without following links and bounded (tests/orchestrator/test_scopes.py).

The coordinator never writes the workspace on a tool's behalf except here: making an empty
scope directory the user's policy allowed, before the sandbox that needs it as a mount point.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "HASH_FILE_LIMIT",
    "HASH_TOTAL_LIMIT",
    "FileChange",
    "ScopeError",
    "ScopeHashes",
    "check_scope",
    "hash_scope",
    "lexical_scope",
    "open_scope",
    "overlaps",
    "scope_changes",
]

HASH_FILE_LIMIT = 100_000
"""Files hashed per scope; beyond it the record says it is incomplete."""
HASH_TOTAL_LIMIT = 512 * 1024**2
"""Bytes hashed per scope (512 MiB); beyond it the record says it is incomplete."""


class ScopeError(Exception):
    """A write scope that cannot be used; the message is for the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def lexical_scope(raw: Sequence[str], workspace: Path) -> tuple[Path, ...] | None:
    """Each path absolute and normalised (relative ones against `workspace`), or None when
    one has a `..` part or is empty, or there is none (such a call is refused by
    `check_scope` anyway, and must not be scheduled as if it wrote nothing)."""
    if not raw:
        return None
    out: list[Path] = []
    for text in raw:
        if not text or ".." in PurePosixPath(text).parts:
            return None
        out.append(Path(os.path.normpath(workspace / text)))
    return tuple(dict.fromkeys(out))


def overlaps(a: Path, b: Path) -> bool:
    """Whether two resolved paths share anything: equal, or one inside the other (by whole
    parts: `/repo/src-evil` is not inside `/repo/src`)."""
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def check_scope(
    raw: Sequence[str], *, workspace: Path, roots: Sequence[Path], protected: Iterable[str]
) -> tuple[Path, ...]:
    """The scope's directories, checked on the host without creating anything: each inside
    a writable root and not the root itself, no `..`, no protected name on the way or inside,
    no symlink and no file on the way (a missing tail is fine: `open_scope` makes it).

    **Errors:** `ScopeError` saying which path and why.
    """
    if not raw:
        raise ScopeError(
            "write_paths is empty. Name the directories the agent may change, or leave "
            "write_paths out for an agent that may write the whole workspace."
        )
    scope = lexical_scope(raw, workspace)
    if scope is None:
        raise ScopeError("write_paths may not contain '..' or empty paths. Name each directory.")
    protected = tuple(protected)
    checked = []
    for path in scope:
        root, rel = _split(path, roots)
        _check_protected(path, rel, protected)
        _walk(root, rel, create=False)
        checked.append(path)
    for i, a in enumerate(checked):
        for b in checked[i + 1 :]:
            if overlaps(a, b):
                raise ScopeError(f"write_paths {a} and {b} overlap; name each directory once.")
    return tuple(checked)


def open_scope(scope: Sequence[Path], roots: Sequence[Path]) -> list[Path]:
    """Make the missing directories of a checked scope (mode 0755), walking from its root
    with `O_NOFOLLOW`: a symlink put on the way since `check_scope` fails the call rather than
    being followed. Returns the directories it made.

    **Errors:** `ScopeError` when a part is a symlink or a file, or cannot be made.
    """
    made: list[Path] = []
    for path in scope:
        root, rel = _split(path, roots)
        made += _walk(root, rel, create=True)
    return made


def _split(path: Path, roots: Sequence[Path]) -> tuple[Path, tuple[str, ...]]:
    for root in sorted(roots, key=lambda r: len(r.parts), reverse=True):
        if path.is_relative_to(root):
            rel = path.relative_to(root).parts
            if not rel:
                raise ScopeError(
                    f"{path} is a whole writable root; leave write_paths out to let the agent "
                    "write all of it, or name directories inside it."
                )
            return root, rel
    where = ", ".join(str(r) for r in roots)
    raise ScopeError(f"{path} is not inside a writable root ({where}); write_paths must be.")


def _check_protected(path: Path, rel: tuple[str, ...], protected: tuple[str, ...]) -> None:
    if ".git" in rel:
        raise ScopeError(f"{path} is inside a .git directory, which stays read-only.")
    for entry in protected:
        parts = PurePosixPath(entry).parts
        if PurePosixPath(entry).is_absolute():
            target = Path(entry)
            if overlaps(target, path):
                raise ScopeError(f"{path} holds or is inside the protected path {entry}.")
            continue
        # Protected names hold in any directory of the scope, and at the root's top level.
        inside = any(rel[i : i + len(parts)] == parts for i in range(len(rel)))
        holds = parts[: len(rel)] == rel
        if inside or holds:
            raise ScopeError(
                f"{path} holds or is inside the protected path {entry}, which stays read-only; "
                "name a directory beside it."
            )


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(root: Path, rel: tuple[str, ...], *, create: bool) -> list[Path]:
    made: list[Path] = []
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise ScopeError(f"the writable root {root} cannot be opened: {exc.strerror}") from exc
    try:
        here = root
        for name in rel:
            here = here / name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    return made  # the rest is missing: made after the call is allowed
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    made.append(here)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise ScopeError(f"cannot make {here}: {exc.strerror}") from exc
            else:
                _must_be_dir(here, st)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ScopeError(f"{here} is not a directory (or is a symlink).") from exc
                raise ScopeError(f"cannot open {here}: {exc.strerror}") from exc
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return made


def _must_be_dir(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ScopeError(
            f"{path} is a symlink; a write scope is never reached through a link. Name the "
            "real directory."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ScopeError(f"{path} is not a directory; write_paths name directories only.")


# --- what a scoped writer changed -------------------------------------------------------------


@dataclass(frozen=True)
class ScopeHashes:
    """The regular files of a scope by path, with their sha256 (a symlink: `link:<target>`)."""

    files: dict[Path, str]
    complete: bool
    """False when a limit stopped the walk (`HASH_FILE_LIMIT`, `HASH_TOTAL_LIMIT`)."""


@dataclass(frozen=True)
class FileChange:
    path: Path
    before: str | None
    """sha256 before the run; None: the file did not exist."""
    after: str | None
    """sha256 after the run; None: the file is gone."""


def hash_scope(scope: Sequence[Path]) -> ScopeHashes:
    """Hash every file under the scope's directories, following no link (a link is recorded
    by its target text, never opened), skipping what is not a regular file or link, bounded.
    Run it in a thread: it reads file contents."""
    files: dict[Path, str] = {}
    budget = [HASH_FILE_LIMIT, HASH_TOTAL_LIMIT]
    complete = True
    for top in scope:
        try:
            fd = os.open(top, _DIR_FLAGS)
        except OSError:
            continue
        complete = _hash_dir(fd, top, files, budget) and complete
    return ScopeHashes(files, complete)


def _hash_dir(fd: int, path: Path, files: dict[Path, str], budget: list[int]) -> bool:
    """Hash one directory (consumes `fd`); False when a limit was reached."""
    try:
        names = os.listdir(fd)
        for name in sorted(names):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                if not _hash_dir(child, path / name, files, budget):
                    return False
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return False
            if stat.S_ISLNK(st.st_mode):
                with contextlib.suppress(OSError):
                    files[path / name] = "link:" + os.readlink(name, dir_fd=fd)
            elif stat.S_ISREG(st.st_mode):
                budget[1] -= st.st_size
                if budget[1] < 0:
                    return False
                digest = _hash_file(fd, name, st.st_size)
                if digest is not None:
                    files[path / name] = digest
        return True
    finally:
        os.close(fd)


def _hash_file(dir_fd: int, name: str, size: int) -> str | None:
    """sha256 of a regular file's first `size` bytes (its size when it was listed: a file
    that still grows cannot keep the hashing going)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # swapped for a FIFO or device since the stat
        digest = hashlib.sha256()
        left = size
        while left > 0 and (chunk := os.read(fd, min(left, 1024 * 1024))):
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def scope_changes(before: ScopeHashes, after: ScopeHashes) -> list[FileChange]:
    """The files created, changed or removed between two hashings, by path."""
    paths = sorted(set(before.files) | set(after.files))
    return [
        FileChange(p, before.files.get(p), after.files.get(p))
        for p in paths
        if before.files.get(p) != after.files.get(p)
    ]
