"""Undoing a session's last writing turn (`warren undo`, `/undo`), from its change log.

A turn is undone only when every file it changed is still as the turn left it: anything that
touched one of them later (the user, a later turn) makes the undo refuse, naming those files,
and change nothing. No byte of the user's may be lost, so:

- every restored file is first written whole beside its target (a temporary name, fsynced);
- each current file is renamed aside before its old content is renamed in, and the asides
  are deleted only when every rename succeeded; a failure renames them back (the outcome says
  nothing changed); a crash in between leaves `.warren-undo-*` files holding the later content;
- directories are opened from the root down with `O_NOFOLLOW`, so a link planted in the tree
  cannot send a write or a delete outside it, and a link or FIFO the turn created is removed,
  never opened.

The last writing turn not undone yet is the one undone; undoing again goes one turn further
back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.recorder import Change, TurnRecord, append_record, read_turns
from orchestrator.changes.tree_state import MAX_KEPT_BYTES, Entry, open_parent

__all__ = ["UndoOutcome", "undo_last_turn"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_LISTED = 8
"""Paths a one-line message names before `and N more`."""


@dataclass(frozen=True)
class UndoOutcome:
    undone: bool
    message: str
    """One line for the user."""
    turn: int | None = None


class _Refused(Exception):
    pass


def undo_last_turn(log: Path, store: ContentStore) -> UndoOutcome:
    """Undo the last writing turn recorded in `log` not undone yet. Never raises for the
    workspace's or the store's state: every outcome is a value with a one-line message."""
    try:
        turns = read_turns(log)
    except FileNotFoundError:
        return UndoOutcome(False, "no writing turn was recorded in this session")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return UndoOutcome(False, f"the change log {log} cannot be read ({exc}); nothing changed")
    pending = [turn for turn in turns if not turn.undone]
    if not pending:
        what = "every writing turn was undone already" if turns else "no writing turn was recorded"
        return UndoOutcome(False, f"{what}; nothing changed")
    turn = pending[-1]
    try:
        _check(turn, store)
        restored, removed = _apply(turn, store)
    except _Refused as refusal:
        refused = f"turn {turn.number} not undone, nothing changed: {refusal}"
        return UndoOutcome(False, refused, turn.number)
    except OSError as exc:
        return UndoOutcome(
            False,
            f"turn {turn.number} not undone, nothing changed: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename else ""),
            turn.number,
        )
    note = ""
    try:
        append_record(log, {"type": "undone", "turn": turn.number, "ts": round(time.time(), 3)})
    except OSError as exc:
        note = f" (the change log could not note it: {exc.strerror or exc})"
    parts = []
    if restored:
        parts.append(f"restored {_names(restored)}")
    if removed:
        parts.append(f"removed {_names(removed)}")
    partial = "" if turn.complete else " (that turn's scan was cut short: some changes unseen)"
    return UndoOutcome(
        True,
        f"undid turn {turn.number}: {'; '.join(parts)}{_by_writer(turn)}{partial}{note}",
        turn.number,
    )


def _by_writer(turn: TurnRecord) -> str:
    """Where several wrote in the turn (scoped writers at once, a call and its hooks), who
    wrote which files: ` (by dispatch_agent "billing": billing/a.py; Bash "make": out.o)`;
    a background writer's own change set names it: ` (by Bash (background) "npm run dev")`."""
    if len(turn.writers) == 1 and turn.writers[0].kind.endswith("(background)"):
        return f" (by {turn.writers[0].describe()})"
    if len(turn.writers) < 2:
        return ""
    return (
        " (by " + "; ".join(f"{w.describe()}: {_names(list(w.paths))}" for w in turn.writers) + ")"
    )


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:_LISTED])
    more = len(paths) - _LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _shown(change: Change) -> str:
    return change.key[1]


# -- checks ----------------------------------------------------------------------------------


def _check(turn: TurnRecord, store: ContentStore) -> None:
    """Refuse unless every file is as the turn left it and every old content is at hand."""
    lost = []
    for change in turn.changes:
        before = change.before
        if before is None or before.kind in ("dir", "link"):
            continue
        if before.kind == "other":
            lost.append(f"{_shown(change)} (a special file)")
        elif before.sha is None or not store.has(before.sha):
            lost.append(f"{_shown(change)} (its old content was not kept)")
        elif change.after is not None and change.after.kind == "dir":
            lost.append(f"{_shown(change)} (now a directory)")
    for change in turn.changes:
        before, after = change.before, change.after
        if (
            before is not None
            and before.kind == "dir"
            and after is not None
            and after.kind != "dir"
        ):
            lost.append(f"{_shown(change)} (was a directory)")
    if lost:
        raise _Refused(f"cannot put back {_names(lost)}")
    touched = [_shown(c) for c in turn.changes if not _still_after(c)]
    if touched:
        raise _Refused(f"changed since that turn: {_names(touched)}")


def _still_after(change: Change) -> bool:
    try:
        current = _observe(Path(change.key[0]), change.key[1])
    except OSError:
        return False
    after = change.after
    if after is None:
        return current is None
    if after.kind == "other":  # a FIFO or device: its kind is all that was recorded
        return current is not None and current.kind == "other"
    return after.same_content(current)


def _observe(root: Path, rel: str) -> Entry | None:
    """The entry at `rel` now, links never followed; None when absent."""
    parent = open_parent(root, rel, create=False)
    if parent is None:
        return None
    dir_fd, name = parent
    try:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            return Entry("dir", mode)
        if stat.S_ISLNK(info.st_mode):
            return Entry("link", mode, target=os.readlink(name, dir_fd=dir_fd))
        if not stat.S_ISREG(info.st_mode):
            return Entry("other", mode)
        if info.st_size > MAX_KEPT_BYTES:
            return Entry("file", mode, sha=None)
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return Entry("other", mode)
            digest = hashlib.sha256()
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
        finally:
            os.close(fd)
        return Entry("file", mode, sha=digest.hexdigest())
    finally:
        os.close(dir_fd)


# -- applying --------------------------------------------------------------------------------


@dataclass
class _Step:
    dir_fd: int
    name: str
    shown: str
    temp: str | None = None
    """The old content, written beside the target."""
    aside: str | None = None
    """The current file, renamed out of the way."""
    placed: bool = False


@dataclass
class _Undo:
    store: ContentStore
    steps: list[_Step] = field(default_factory=list)
    made_dirs: list[tuple[Path, str]] = field(default_factory=list)
    """Directories the undo recreated (removed again on failure), in creation order."""

    def close(self) -> None:
        for step in self.steps:
            with contextlib.suppress(OSError):
                os.close(step.dir_fd)


def _apply(turn: TurnRecord, store: ContentStore) -> tuple[list[str], list[str]]:
    """Put every changed name back as it was before the turn; the names restored and removed.
    **Errors:** `OSError` after rolling back whatever had been done."""
    undo = _Undo(store)
    try:
        try:
            _prepare(turn, undo)
            _swap(undo)
        except BaseException:
            _roll_back(undo)
            raise
        _finish(undo, turn)
    finally:
        undo.close()
    restored = [step.shown for step in undo.steps if step.temp is not None]
    made = {_shown(c) for c in _made_dirs(turn)}
    removed = {step.shown for step in undo.steps if step.temp is None} | made
    # Named once: a directory the turn made, not each name inside it.
    top = [name for name in removed if not any(name.startswith(d + "/") for d in made)]
    return restored, sorted(top)


def _made_dirs(turn: TurnRecord) -> list[Change]:
    """The directories the turn created."""
    return [
        c
        for c in turn.changes
        if c.before is None and c.after is not None and c.after.kind == "dir"
    ]


def _prepare(turn: TurnRecord, undo: _Undo) -> None:
    """Recreate the directories the turn removed, and write every old file beside its target."""
    for change in sorted(turn.changes, key=lambda c: c.key[1].count("/")):
        before, after = change.before, change.after
        if before is not None and before.kind == "dir" and (after is None or after.kind != "dir"):
            root, rel = Path(change.key[0]), change.key[1]
            parent = open_parent(root, rel, create=True)
            assert parent is not None
            dir_fd, name = parent
            try:
                if after is None:
                    os.mkdir(name, before.mode or 0o755, dir_fd=dir_fd)
                    undo.made_dirs.append((root, rel))
            finally:
                os.close(dir_fd)
    for change in turn.changes:
        before, after = change.before, change.after
        if (before is None or before.kind == "dir") and (after is None or after.kind == "dir"):
            continue  # directories only: made above, or removed at the end
        parent = open_parent(Path(change.key[0]), change.key[1], create=True)
        assert parent is not None
        step = _Step(parent[0], parent[1], _shown(change))
        undo.steps.append(step)
        if before is not None and before.kind != "dir":
            step.temp = _write_temp(step, before, undo.store)


def _write_temp(step: _Step, before: Entry, store: ContentStore) -> str:
    temp = f".warren-undo-{secrets.token_hex(6)}.new"
    if before.kind == "link":
        os.symlink(before.target or "", temp, dir_fd=step.dir_fd)
        return temp
    data = store.get(before.sha or "")
    if data is None:
        raise _Refused(f"cannot put back {step.shown} (its old content was not kept)")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=step.dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, before.mode & 0o777)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=step.dir_fd)
        raise
    os.close(fd)
    return temp


def _swap(undo: _Undo) -> None:
    for step in undo.steps:
        aside = f".warren-undo-{secrets.token_hex(6)}.old"
        try:
            os.rename(step.name, aside, src_dir_fd=step.dir_fd, dst_dir_fd=step.dir_fd)
            step.aside = aside
        except FileNotFoundError:
            pass  # the turn had removed it
        if step.temp is not None:
            os.rename(step.temp, step.name, src_dir_fd=step.dir_fd, dst_dir_fd=step.dir_fd)
            step.placed = True


def _roll_back(undo: _Undo) -> None:
    for step in reversed(undo.steps):
        with contextlib.suppress(OSError):
            if step.placed:
                os.unlink(step.name, dir_fd=step.dir_fd)  # the old content, still in the store
            if step.aside is not None:
                os.rename(step.aside, step.name, src_dir_fd=step.dir_fd, dst_dir_fd=step.dir_fd)
            if step.temp is not None and not step.placed:
                os.unlink(step.temp, dir_fd=step.dir_fd)
    for root, rel in reversed(undo.made_dirs):
        parent = None
        with contextlib.suppress(OSError):
            parent = open_parent(root, rel, create=False)
        if parent is not None:
            with contextlib.suppress(OSError):
                os.rmdir(parent[1], dir_fd=parent[0])
            os.close(parent[0])


def _finish(undo: _Undo, turn: TurnRecord) -> None:
    """Delete the asides, make the renames durable, remove the directories the turn made."""
    synced: set[int] = set()
    for step in undo.steps:
        if step.aside is not None:
            with contextlib.suppress(OSError):
                os.unlink(step.aside, dir_fd=step.dir_fd)
        if step.dir_fd not in synced:
            with contextlib.suppress(OSError):
                os.fsync(step.dir_fd)
            synced.add(step.dir_fd)
    for change in sorted(_made_dirs(turn), key=lambda c: -c.key[1].count("/")):
        parent = None
        with contextlib.suppress(OSError):
            parent = open_parent(Path(change.key[0]), change.key[1], create=False)
        if parent is not None:
            with contextlib.suppress(OSError):  # not empty: something later lives there
                os.rmdir(parent[1], dir_fd=parent[0])
            os.close(parent[0])
