"""Per-turn change sets: what each writing turn changed, seen from the sandbox's side.

The model's word about what it changed is not evidence (a Bash command names no files), so
the coordinator looks at the writable roots itself (orchestrator/changes/tree_state.py): before the
first read-write call of a turn and after each one, the turn's change set being the
difference, appended to `<session>.changes.jsonl`. `warren undo` (orchestrator/changes/undo.py)
restores a turn from it.

Why not bwrap's `--overlay` (it works here, as root and unprivileged, ~1 ms per sandbox): the
main agent's tools run in a long-lived tool host with a persistent shell, and the read-only
host, the user and writable subagents must see a write at once, not when an upper layer is
merged at the end of a turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.pipeline import RunnerLayer, ToolRunner
from orchestrator.calls.plan import CallPlan
from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.tree_state import Entry, Key, ScanStopped, TreeState
from orchestrator.changes.writers import Writer
from orchestrator.events import Event, ToolResultsMessage
from orchestrator.idle import until_idle
from orchestrator.tools.base import Checked, ToolContext, ToolOutput, ToolProgress

__all__ = [
    "Change",
    "ChangeRecorder",
    "RecordingRunner",
    "TurnRecord",
    "append_record",
    "change_log_path",
    "diff",
    "read_turns",
    "writer_of",
]


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


def diff(
    before: Mapping[Key, Entry], after: Mapping[Key, Entry], keys: Iterable[Key] | None = None
) -> list[Change]:
    """What changed from `before` to `after`, sorted by root and path: among `keys` only when
    given (the names the refreshes in between touched, so a call costs what it changed, not
    the size of the tree)."""
    changes = []
    if keys is None:
        for key, new in after.items():
            old = before.get(key)
            if old is new:
                continue  # the scan reused the entry: same stamp, same content
            if old is None or not old.same_content(new):
                changes.append(Change(key, old, new))
        changes.extend(Change(key, before[key], None) for key in before.keys() - after.keys())
    else:
        for key in keys:
            old, found = before.get(key), after.get(key)
            if old is found:
                continue
            if found is None:
                changes.append(Change(key, old, None))
            elif old is None or not old.same_content(found):
                changes.append(Change(key, old, found))
    changes.sort(key=lambda change: change.key)
    return changes


# -- recording -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnRecord:
    """One writing turn's change set as the change log holds it."""

    number: int
    changes: list[Change]
    tool_use_ids: list[str]
    complete: bool
    undone: bool = False
    writers: tuple[Writer, ...] = ()
    """Who wrote what (each writer's paths), where the turn says (older logs do not)."""


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
                    writers=tuple(Writer.from_json(w) for w in record.get("writers", ())),
                )
            elif record.get("type") == "undone":
                number = int(record["turn"])
                if number in turns:
                    done = turns[number]
                    turns[number] = dataclasses.replace(done, undone=True)
    return [turns[number] for number in sorted(turns)]


_T = TypeVar("_T")
_Job = Callable[[], Awaitable[None]]

JOB_LIMIT_S = 60.0
"""Seconds one background job (a scan, a record) may take before it is given up."""

IDLE_WAIT_S = 0.5
"""Seconds a job nobody waits for waits for the run to be idle before it runs anyway."""


class ChangeRecorder:
    """The session's recorder: scans around read-write calls, one record per writing turn.

    `before_call` scans when a turn's first read-write call is about to run (catching what
    the user changed since); `after_call` scans after each read-write call. When the turn's
    results are in (`ToolResultsMessage`, this object is an event sink), the difference
    between the turn's first and last scan is appended to the change log, when not empty.

    Inside `running()`, only `before_call` is on a call's path: the after-scan and the
    turn's record are queued to one background task, which does every step in the order it
    was asked for. A step nobody waits for starts once the run is idle (`until_idle`: the
    tool result has gone back and the next model request is out, waiting on the network), so
    its CPU (the scan's thread holds the GIL) does not sit between a call's end and the next
    request; after `IDLE_WAIT_S` it runs anyway. A step someone waits for (the next turn's
    first scan, `settled`) makes the queue ahead of it run at once; with nothing queued or
    under way, it runs in the caller's own task (no trip through the background one). The
    next turn's first scan is queued behind the others, so no turn's record can take in
    what a later turn wrote. Outside it (tests, the session's last turn), each step runs at once.
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
        self.tree = TreeState(roots, store, index_dir, skip)
        self._turn_complete: bool | None = None
        """Whether the turn's first scan was complete; None: no turn started (or its first
        scan failed: the turn is not recorded)."""
        self._last_complete = True
        self._tool_use_ids: list[str] = []
        self._changes: list[Change] = []
        self._writers: dict[str, Writer] = {}
        """The turn's writers by id, in the order they started."""
        self._by: dict[Key, str] = {}
        """Which writer each changed path is put down to: a scoped writer when the path lies
        in its scope, else the call whose after-scan first saw it (or that was running when a
        scan outside any call saw it)."""
        self._in_flight: list[str] = []
        """The calls whose first scan has run and whose after-scan has not: what a scan
        outside any call (a background writer's end) sees may be theirs."""
        self._background: dict[str, Writer] = {}
        """Writers running in the background (a writing background shell), by id, in the
        order they started: while one runs the mark is held across turns."""
        self._owned: dict[Key, str] = {}
        """The paths a background writer changed first, by writer: each stays its own while
        it runs (a call that changes one too does not take it)."""
        self._held: dict[str, dict[Key, Change]] = {}
        """Each background writer's changes so far, turns it outlived included."""
        self._base: dict[Key, Entry | None] = {}
        """Paths whose changes left the current mark's span with a background writer's
        record: their entry then, the start of any later change."""
        self._turns = 0
        self._jobs: trio.MemorySendChannel[_Job] | None = None
        """The background task's queue, while `running()`."""
        self._nursery: trio.Nursery | None = None
        self._awaited = 0
        """Queued steps someone waits for: while any is, no step waits for idleness."""
        self._idle_wait: trio.CancelScope | None = None
        """The background task's wait for idleness, cancelled when a waited step comes."""
        self._pending = 0
        """Steps sent to the background task and not done yet (a channel hands a step to a
        waiting receiver without buffering it: its statistics cannot tell)."""
        self._step = trio.Lock()
        """Held while a step runs: one at a time, in the order they were asked for."""
        self.scan_seconds = 0.0
        """Time spent scanning, summed (tests/bench/bench_changes.py reads it)."""

    def close(self) -> None:
        self.tree.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Do the after-scans and the records in a background task while the block runs; on
        leaving, what is queued is done first (shielded, each step bounded by `JOB_LIMIT_S`).

        **Cancellation:** the queued steps still run: a call's changes are recorded even
        when the session is cut short.
        """
        send, receive = trio.open_memory_channel[_Job](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._work, receive)
            self._jobs, self._nursery = send, nursery
            try:
                yield
            finally:
                self._jobs = None
                self._hurry()  # what is left runs now
                send.close()  # the worker ends once the queue is empty

    async def _work(self, receive: trio.MemoryReceiveChannel[_Job]) -> None:
        with trio.CancelScope(shield=True):
            async with receive:
                async for job in receive:
                    try:
                        if self._awaited == 0 and self._jobs is not None:
                            with trio.CancelScope() as self._idle_wait:
                                await until_idle(IDLE_WAIT_S)
                            self._idle_wait = None
                        async with self._step:
                            with trio.move_on_after(JOB_LIMIT_S):
                                await job()
                    finally:
                        self._pending -= 1

    def _send(self, job: _Job) -> None:
        assert self._jobs is not None
        self._jobs.send_nowait(job)
        self._pending += 1

    def _hurry(self) -> None:
        if self._idle_wait is not None:
            self._idle_wait.cancel()

    async def _run(self, job: _Job, *, wait: bool) -> None:
        """`job` in the background task's order (awaited there when `wait`), or now."""
        if self._jobs is None:
            if wait:
                await job()
            else:  # as when queued: done even when the caller is cancelled (bounded)
                with trio.CancelScope(shield=True), trio.move_on_after(JOB_LIMIT_S):
                    await job()
            return
        if not wait:
            self._send(job)
            return
        if self._pending == 0 and not self._step.locked():
            # Nothing is queued or under way: no order to keep, so no trip through the
            # background task. Steps queued meanwhile wait for this one (`_step`).
            async with self._step:
                await job()
            return
        done = trio.Event()

        async def then_say() -> None:
            try:
                await job()
            finally:
                self._awaited -= 1
                done.set()

        self._awaited += 1
        self._hurry()
        self._send(then_say)
        await done.wait()

    async def settled(self) -> None:
        """Return once every step asked for so far is done (an undo reads the log)."""

        async def nothing() -> None:
            pass

        await self._run(nothing, wait=True)

    async def _scan(self, *, remark: bool = False) -> None:
        """The turn's first scan (a `mark`: no copy of the tree), or a later one with the
        turn's changes so far, worked out in the scan's thread, off the event loop (with
        `remark`, the mark then moves to now: a turn's end while a background writer runs)."""
        started = time.perf_counter()
        if self._turn_complete is None:
            quiet = self.tree.mark_if_quiet()  # nothing to read: no trip to a thread
            if quiet is None:
                quiet = await trio.to_thread.run_sync(self.tree.mark)
            self._turn_complete = self._last_complete = quiet
        else:
            self._last_complete, self._changes = await trio.to_thread.run_sync(
                partial(self._since, remark=remark)
            )
        self.scan_seconds += time.perf_counter() - started

    def _since(self, *, remark: bool = False) -> tuple[bool, list[Change]]:
        before, after, keys, complete = self.tree.since_mark(remark=remark)
        changes = diff(before, after, keys)
        if self._base:  # what a background writer's record took starts where it left off
            rebased = []
            for change in changes:
                if change.key not in self._base:
                    rebased.append(change)
                    continue
                start = self._base[change.key]
                if start is None and change.after is None:
                    continue
                if start is not None and start.same_content(change.after):
                    continue
                rebased.append(Change(change.key, start, change.after))
            changes = rebased
        return complete, changes

    async def before_call(self, tool_use_id: str, writer: Writer | None = None) -> None:
        """Before a read-write call (or a hook, a typed command: `writer` says what it is):
        the turn's first scan (done when this returns)."""

        async def first_scan() -> None:
            self._tool_use_ids.append(tool_use_id)
            self._writers[tool_use_id] = writer or Writer(tool_use_id, "")
            if self._turn_complete is None:
                try:
                    await self._scan()
                except (OSError, ScanStopped) as exc:  # this turn is not recorded
                    structlog.get_logger().warning("change scan failed", error=str(exc))
            elif self._background:
                # What changed since the last scan is the background writers': this call
                # has not started.
                await self._scan_for_background()
            self._in_flight.append(tool_use_id)

        await self._run(first_scan, wait=True)

    async def after_call(self, tool_use_id: str | None = None) -> None:
        """After a read-write call (`tool_use_id`, as `before_call` was told): the scan that
        sees what it changed (queued, not waited for, inside `running()`)."""

        async def after() -> None:
            try:
                if self._turn_complete is None:
                    return  # the turn's first scan failed: the turn is not recorded
                try:
                    await self._scan()
                except (OSError, ScanStopped) as exc:
                    structlog.get_logger().warning("change scan failed", error=str(exc))
                    self._turn_complete = None
                    return
                self._attribute(tool_use_id)
            finally:
                if tool_use_id in self._in_flight:
                    self._in_flight.remove(tool_use_id)

        await self._run(after, wait=False)

    def _attribute(self, tool_use_id: str | None) -> None:
        """Put each changed path not yet put down to a writer to the scoped writer that holds
        it, else to the call whose scan this is (writers that run at once are scoped: a
        barrier call runs alone). A scan outside any call (`tool_use_id` None) gives a path
        to an unscoped call still running that may have written it, as that call's own
        after-scan would have: a background writer ending while a call runs does not take
        the call's files (tests/orchestrator/test_changes.py::
        test_a_background_writer_ending_while_a_call_runs_leaves_the_call_its_files)."""
        scoped = [w for w in self._writers.values() if w.scope is not None]
        first_background = next(iter(self._background), None)
        for change in self._changes:
            if change.key in self._by:
                continue
            holder = self._owned.get(change.key)
            if holder is None:
                holder = next((w.id for w in scoped if w.holds(change.key)), tool_use_id)
            if holder is None:
                holder = self._in_flight_writer_of(change.key)
            caller = self._writers.get(holder) if holder is not None else None
            if caller is not None and not caller.may_write(change.key) and self._background:
                holder = None  # not a file this call names: what runs anyway wrote it
            if holder is None and first_background is not None:
                # Seen by no call's scan: written while no call ran, by what runs anyway.
                holder = self._owned[change.key] = first_background
            if holder is not None:
                self._by[change.key] = holder

    def _in_flight_writer_of(self, key: Key) -> str | None:
        """The first unscoped call still running that can have changed `key`, if any."""
        for call in self._in_flight:
            writer = self._writers.get(call)
            if writer is not None and writer.scope is None and writer.may_write(key):
                return call
        return None

    def _turn_writers(self, changes: list[Change]) -> list[dict[str, Any]]:
        """The turn's writers with the paths each changed (a lone writer has them all)."""
        writers = list(self._writers.values())
        paths: dict[str, list[str]] = {w.id: [] for w in writers}
        for change in changes:
            by = self._by.get(change.key, writers[0].id if len(writers) == 1 else None)
            if by in paths:
                paths[by].append(change.key[1])
        return [
            dataclasses.replace(w, paths=tuple(paths[w.id])).to_json()
            for w in writers
            if paths[w.id]
        ]

    def __call__(self, event: Event) -> None:
        if isinstance(event, ToolResultsMessage):
            self.end_turn()

    def end_turn(self) -> None:
        """Append the current turn's change set to the log (if anything changed): queued
        behind the turn's scans inside `running()`, at once outside it."""
        if self._jobs is not None:
            self._send(self._record_turn)
            return
        record = self._turn_record()
        if record is not None:
            self._write(lambda: append_record(self.log, record))

    def _turn_record(self) -> dict[str, Any] | None:
        """The turn's record (None when nothing changed); the next turn starts afresh. The
        paths a background writer owns are not the turn's: they join that writer's changes,
        and the mark is kept for it (moved to now by the scan before: `_record_turn`)."""
        complete, ids, changes = self._turn_complete, self._tool_use_ids, self._changes
        changes = self._hold_background(changes)
        writers = self._turn_writers(changes) if complete is not None and changes else []
        self._tool_use_ids, self._changes = [], []
        self._writers, self._by, self._in_flight = {}, {}, []
        if not self._background:
            self._turn_complete, self._base = None, {}
            if complete is not None:
                self.tree.unmark()
        if complete is None or not changes:
            return None
        return self._record(ids, changes, writers, complete and self._last_complete)

    def _record(
        self, ids: list[str], changes: list[Change], writers: list[dict[str, Any]], complete: bool
    ) -> dict[str, Any]:
        if self._turns == 0 and self.log.exists():  # a resumed session continues its numbers
            with contextlib.suppress(OSError, ValueError):
                self._turns = max((turn.number for turn in read_turns(self.log)), default=0)
        self._turns += 1
        return {
            "type": "turn",
            "turn": self._turns,
            "ts": round(time.time(), 3),
            "tool_use_ids": ids,
            "complete": complete,
            "changes": [change.to_json() for change in changes],
            **({"writers": writers} if writers else {}),
        }

    # -- writers in the background ------------------------------------------------------------

    async def open_background(self, writer: Writer) -> None:
        """A writer that runs across turns starts (a writing background shell): from here
        what no call's scan sees is put down to it, and its changes are a record of its own
        (`close_background`). Done when this returns (the mark taken, when none was)."""

        async def start() -> None:
            self._background[writer.id] = writer
            self._held.setdefault(writer.id, {})
            if self._turn_complete is None:
                try:
                    await self._scan()
                except (OSError, ScanStopped) as exc:
                    structlog.get_logger().warning("change scan failed", error=str(exc))
            else:  # what changed before it started is not its
                await self._scan_for_background(before=writer.id)

        await self._run(start, wait=True)

    async def close_background(self, writer_id: str) -> None:
        """The background writer `writer_id` ended: what it changed is appended to the change
        log as a record of its own, naming it (queued inside `running()`)."""
        await self._run(partial(self._record_background, writer_id), wait=False)

    async def _scan_for_background(self, before: str | None = None) -> None:
        """A scan outside any call: its new changes are the background writers' (except,
        with `before`, that writer's, which has not started yet)."""
        try:
            await self._scan()
        except (OSError, ScanStopped) as exc:
            structlog.get_logger().warning("change scan failed", error=str(exc))
            return
        if before is None:
            self._attribute(None)
            return
        writer = self._background.pop(before)
        try:
            self._attribute(None)
        finally:
            self._background[before] = writer

    def _hold_background(self, changes: list[Change]) -> list[Change]:
        """`changes` without the running background writers' paths, which join their
        writers' changes so far."""
        if not self._background:
            return changes
        mine: list[Change] = []
        for change in changes:
            owner = self._owned.get(change.key)
            if owner in self._held:
                _merge(self._held[owner], change)
            else:
                mine.append(change)
        return mine

    async def _record_background(self, writer_id: str) -> None:
        writer = self._background.get(writer_id)
        if writer is None:
            return
        if self._turn_complete is not None:
            try:
                await self._scan()
            except (OSError, ScanStopped) as exc:
                structlog.get_logger().warning("change scan failed", error=str(exc))
            else:
                self._attribute(None)
        held = self._held.pop(writer_id, {})
        for change in self._changes:
            if self._owned.get(change.key) == writer_id:
                _merge(held, change)
                self._base[change.key] = change.after
        self._changes = [c for c in self._changes if self._owned.get(c.key) != writer_id]
        for key in [k for k, w in self._owned.items() if w == writer_id]:
            del self._owned[key]
            self._by.pop(key, None)
        del self._background[writer_id]
        if not self._background and not self._tool_use_ids and self._turn_complete is not None:
            self.tree.unmark()
            self._turn_complete, self._changes, self._by, self._base = None, [], {}, {}
        changes = sorted((c for c in held.values() if not _unchanged(c)), key=lambda c: c.key)
        if not changes:
            return
        own = dataclasses.replace(writer, paths=tuple(c.key[1] for c in changes))
        record = self._record([writer_id], changes, [own.to_json()], self._last_complete)
        written = _guarded_io(_write_record, self.log, record)
        if isinstance(written, OSError):
            self._write(partial(_raise, written))
            return
        await self._sync(written)

    async def _record_turn(self) -> None:
        """The background side of `end_turn`: the record is written, then made durable in a
        task of its own (in a thread), so the next turn's first scan does not wait for the
        disk (an fsync costs 1-10 ms on the dev box).

        Why the fsync may trail the write: once written, the record survives the
        coordinator's own crash or kill (it is in the kernel's page cache, where `warren
        undo` and `/undo` read it); only the machine's crash within those milliseconds loses
        it, and with it the undo of that turn, never a byte of the user's files: a Bash
        command's writes are not fsynced either, and Warren's file tools fsync the user's
        file before renaming it into place (policies/atomic.py)."""
        if self._background and self._turn_complete is not None:
            # The mark stays for the background writers, moved to now with the last scan:
            # what they write from here is seen against it.
            try:
                await self._scan(remark=True)
            except (OSError, ScanStopped) as exc:
                structlog.get_logger().warning("change scan failed", error=str(exc))
            else:
                self._attribute(None)
            self._base = {}
        record = self._turn_record()
        if record is None:
            return
        # One line appended to the page cache: written here, as the transcript's lines are
        # (a trip to a thread cost more than the write); the fsync goes to a thread.
        written = _guarded_io(_write_record, self.log, record)
        if isinstance(written, OSError):
            self._write(partial(_raise, written))
            return
        if self._nursery is None:
            _sync_and_close(written)
            return
        self._nursery.start_soon(self._sync, written)

    async def _sync(self, fd: int) -> None:
        with trio.CancelScope(shield=True):
            failed = await trio.to_thread.run_sync(_guarded_io, _sync_and_close, fd)
        if isinstance(failed, OSError):
            self._write(partial(_raise, failed))


def _merge(into: dict[Key, Change], change: Change) -> None:
    """`change` after what `into` holds for its path: the first before, the last after."""
    earlier = into.get(change.key)
    into[change.key] = (
        change if earlier is None else Change(change.key, earlier.before, change.after)
    )


def _unchanged(change: Change) -> bool:
    if change.before is None or change.after is None:
        return change.before is None and change.after is None
    return change.before.same_content(change.after)


def _guarded_io(step: Callable[..., _T], *args: Any) -> _T | OSError:
    """`step(*args)`, or the `OSError` it raised (handed to the session's I/O guard)."""
    try:
        return step(*args)
    except OSError as exc:
        return exc


def _raise(exc: OSError) -> None:
    raise exc


def _write_record(log: Path, record: Mapping[str, Any]) -> int:
    """One JSON line appended to `log`; the descriptor still open, for `_sync_and_close`."""
    log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        while data:
            written = os.write(fd, data)
            data = data[written:]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_record(log: Path, record: Mapping[str, Any]) -> None:
    """One JSON line, appended and fsynced (an undo must find the record after a crash)."""
    _sync_and_close(_write_record(log, record))


_LABEL_FIELDS = ("description", "command", "file_path", "notebook_path")
"""The input fields that say what a call is to the user, first found first."""
_LABEL_CHARS = 60


def writer_of(plan: CallPlan) -> Writer:
    """A call as its turn's record names it: its tool, what its input says it is, and a
    scoped writer's scope."""
    raw = plan.block.input if isinstance(plan.block.input, Mapping) else {}
    label = next((str(raw[f]) for f in _LABEL_FIELDS if isinstance(raw.get(f), str)), "")
    label = " ".join(label.split())
    if len(label) > _LABEL_CHARS:
        label = label[: _LABEL_CHARS - 3] + "..."
    scope = None if plan.write_scope is None else tuple(str(p) for p in plan.write_scope)
    files: tuple[str, ...] | None = None
    facts = plan.tool.facts if plan.tool is not None else None
    if facts is not None and facts.family == "edit" and facts.path_fields:
        named = [raw.get(f) for f in facts.path_fields]
        if named and all(isinstance(n, str) and os.path.isabs(n) for n in named):
            files = tuple(os.path.normpath(str(n)) for n in named)
    return Writer(plan.block.id, plan.block.name, label, scope, files=files)


class RecordingRunner(RunnerLayer):
    """A `ToolRunner` that hands every call to `inner`, with read-write ones recorded."""

    def __init__(self, inner: ToolRunner, recorder: ChangeRecorder) -> None:
        super().__init__(inner)
        self.recorder = recorder

    async def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        if plan.sandbox == "ro":
            async with closing_iter(self.inner_call(plan, ctx, validate)) as items:
                async for item in items:
                    yield item
            return
        # A writer: a call in the read-write host, or a scoped writer (its worker writes
        # beneath its scope; what it changed there is put down to it).
        await self.recorder.before_call(plan.block.id, writer_of(plan))
        try:
            async with closing_iter(self.inner_call(plan, ctx, validate)) as items:
                async for item in items:
                    yield item
        finally:
            # Cancelled or not, what the call changed is recorded (queued; or, outside the
            # recorder's `running()`, at once, shielded and bounded: one scan).
            with trio.CancelScope(shield=True):
                await self.recorder.after_call(plan.block.id)
