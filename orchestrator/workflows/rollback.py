"""A scoped writer that did not finish is rolled back before it runs again.

Before a workflow's scoped writer runs, its scope is kept (`keep_scope`): every file's mode
and content hash, its contents in the session's content store (orchestrator/changes/
content_store.py), its directories and links, noted in the run's `writers.jsonl` (fsynced)
before the writer starts. When the writer ends, the note is closed. A run stopped while a
writer wrote (Ctrl-C, `kill -9` of the coordinator, a lost node) leaves the note open, and the
run that resumes it first puts the scope back as it was (`roll_back`): files the writer created
are removed, files it changed or removed are written back (temp file, fsync, rename; mode
restored), directories it made are removed. Only the scope is touched, no link is followed,
and a scope larger than `KEEP_LIMIT_BYTES` is not kept (the writer runs, and its note says it
cannot be rolled back).

Nothing here runs anything of the workspace's: the coordinator only reads and writes bytes
inside the scope, as the change recorder and undo do.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import structlog

from orchestrator.changes.content_store import ContentStore
from orchestrator.workflows.journal import WriterStart

__all__ = ["KEEP_LIMIT_BYTES", "keep_scope", "roll_back"]

KEEP_LIMIT_BYTES = 256 * 1024 * 1024
"""Bytes of a writer's scope kept before it runs; a larger scope is not kept."""
_DIR = "dir"
_LINK = "link"


def keep_scope(key: str, scope: tuple[Path, ...], workspace: Path, objects: Path) -> WriterStart:
    """The scope as it is now (see the module docstring); `files` empty and `scope` empty
    when it is too large to keep."""
    store = ContentStore(objects)
    files: dict[str, list[Any]] = {}
    total = 0
    for root in scope:
        for path, st in _walk(root):
            rel = str(path.relative_to(workspace))
            if stat.S_ISDIR(st.st_mode):
                files[rel] = [_DIR, stat.S_IMODE(st.st_mode)]
            elif stat.S_ISLNK(st.st_mode):
                files[rel] = [_LINK, os.readlink(path)]
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > KEEP_LIMIT_BYTES:
                    structlog.get_logger().warning("writer scope too large to keep", key=key)
                    return WriterStart(key, [], {})
                data = _read(path)
                if data is None:
                    continue
                sha, _ = store.put(data)
                files[rel] = [sha, stat.S_IMODE(st.st_mode)]
    return WriterStart(key, [str(p.relative_to(workspace)) for p in scope], files)


def roll_back(workspace: Path, writer: WriterStart, objects: Path) -> list[str]:
    """Put a writer's scope back as `keep_scope` found it; the paths changed. A scope that
    was not kept is left as it is (logged)."""
    if not writer.scope:
        structlog.get_logger().warning("writer scope was not kept", key=writer.key)
        return []
    store = ContentStore(objects)
    changed: list[str] = []
    for rel_root in writer.scope:
        root = workspace / rel_root
        if not _inside(root, workspace):
            continue
        now = {str(p.relative_to(workspace)): st for p, st in _walk(root)}
        # What it made: deepest first, so a directory is empty when its turn comes.
        for rel in sorted(now, key=lambda r: r.count("/"), reverse=True):
            if rel in writer.files and _same_kind(writer.files[rel], now[rel]):
                continue
            _remove(workspace / rel, now[rel])
            changed.append(rel)
    for rel, (what, detail) in sorted(writer.files.items()):
        path = workspace / rel
        if not _inside(path, workspace):
            continue
        if what == _DIR:
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=detail)
            os.chmod(path, detail, follow_symlinks=False)
        elif what == _LINK:
            if not path.is_symlink():
                os.symlink(detail, path)
                changed.append(rel)
        else:
            changed += _restore_file(path, rel, what, detail, store)
    return sorted(set(changed))


def _restore_file(path: Path, rel: str, sha: str, mode: int, store: ContentStore) -> list[str]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        current = _read(path)
        if current is not None and hashlib.sha256(current).hexdigest() == sha:
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)
                return [rel]
            return []
    data = store.get(sha)
    if data is None:
        structlog.get_logger().warning("kept content missing", path=rel)
        return []
    tmp = path.with_name(f".{path.name}.warren-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fchmod(out.fileno(), mode)
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return [rel]


def _same_kind(kept: list[Any], st: os.stat_result) -> bool:
    what = kept[0]
    if what == _DIR:
        return stat.S_ISDIR(st.st_mode)
    if what == _LINK:
        return stat.S_ISLNK(st.st_mode)
    return stat.S_ISREG(st.st_mode)


def _remove(path: Path, st: os.stat_result) -> None:
    with contextlib.suppress(FileNotFoundError, OSError):
        if stat.S_ISDIR(st.st_mode):
            path.rmdir()
        else:
            path.unlink()


def _walk(root: Path) -> list[tuple[Path, os.stat_result]]:
    """Everything beneath `root` (not `root` itself), no link followed."""
    found: list[tuple[Path, os.stat_result]] = []
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return found
    except FileNotFoundError:
        return found
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in (*dirnames, *filenames):
            path = base / name
            with contextlib.suppress(FileNotFoundError):
                found.append((path, os.lstat(path)))
    return found


def _read(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as source:
        return source.read()


def _inside(path: Path, workspace: Path) -> bool:
    resolved = Path(os.path.normpath(path))
    return resolved != workspace and resolved.is_relative_to(workspace)
