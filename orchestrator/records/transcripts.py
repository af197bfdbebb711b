"""Sessions: one JSONL transcript per session, appended and flushed per message.

A transcript holds a header line, every message in order, the events needed to replay a run
(retries, permission decisions live in the audit log) and one result line per run. `--resume`
and `--continue` read it back; a transcript cut anywhere (a killed process, a half-written last
line) loads, and `normalize_for_api` closes dangling tool_uses with interruption results.
Opening a transcript to append cuts a half-written last line off first (and says so in a
`repair` record), so the next record starts on a line of its own.

Session ids are what the store makes (a UUID; `agent-<12 hex>` for subagent sidechains) and
nothing else: `parse_session_id` refuses a path, `..` or any other text, so a `--resume` value
can never name a file outside the store. A failed append (no space left) raises
`TranscriptWriteError` after cutting the partial record back off.

`warren sessions` lists a directory's sessions without reading their transcripts: each
session keeps a small summary next to its transcript (`<id>.meta.json`: start, cwd, model,
the head of the first prompt, turns and cost so far), rewritten atomically
(`policies.atomic.replace_file`) when the first prompt is sent and after each run. A
transcript without one (written before summaries existed, or whose summary could not be
written) is summarised from
its first 64 KiB, and its turns and cost from its result records only when it is under 1 MiB.
Everything in a summary came from the user or the model: the CLI escapes it when printing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pydantic

from orchestrator.conversation.repair import normalize_for_api
from orchestrator.errors import SessionError, TranscriptWriteError
from orchestrator.messages import Message

__all__ = [
    "LoadedSession",
    "SessionStore",
    "SessionSummary",
    "Transcript",
    "parse_session_id",
    "repair_torn_tail",
]

FORMAT_VERSION = 1

_SESSION_ID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|agent-[0-9a-f]{12}"
)
"""The ids the store (a UUID) and dispatch_agent (a sidechain) make."""
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TAIL_CHUNK = 65_536
_HEAD_BYTES = 65_536
"""How much of a transcript (or a summary file) a listing reads at most."""
_SMALL_TRANSCRIPT = 1 << 20
"""A transcript without a summary is read whole for its turns and cost only under this size."""
_PROMPT_CHARS = 300
"""The head of the first prompt a summary keeps."""


def parse_session_id(value: str) -> str:
    """`value` when it is a session id as the store makes them, never a path.

    **Errors:** `SessionError` with one line saying what a session id looks like.
    """
    if _SESSION_ID.fullmatch(value):
        return value
    shown = repr(value if len(value) <= 80 else value[:77] + "...")
    example = "'0b8f6c1e-5d7a-4e8b-9c1d-2f3a4b5c6d7e'"
    if "/" in value or value.startswith(".") or value.endswith(".jsonl"):
        raise SessionError(
            f"{shown} looks like a path; a session is resumed by its id, such as {example}, "
            "never by a file name"
        )
    raise SessionError(
        f"{shown} is not a session id; ids look like {example} (--continue picks the latest)"
    )


def repair_torn_tail(path: Path) -> int:
    """Cut a half-written last line off the transcript at `path`; returns the bytes removed.

    Every record is one line ending in a newline, so bytes after the last newline are a
    record a crash interrupted. They are dropped (an append-only log may be truncated at a
    record boundary), so the next record does not glue onto them.

    **Errors:** `OSError` from opening or truncating the file.
    """
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            start = max(0, position - _TAIL_CHUNK)
            f.seek(start)
            chunk = f.read(position - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        else:
            keep = 0
        if keep == end:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return end - keep


@dataclass(frozen=True)
class SessionSummary:
    """What `warren sessions` shows of one session (`<id>.meta.json`)."""

    session_id: str
    started: float
    """Unix time of the session's first record."""
    cwd: str | None
    model: str | None
    first_prompt: str | None
    """The head of the first prompt (at most 300 characters), as the user typed it."""
    turns: int | None
    """Model requests of the main agent over every run; None when not known."""
    cost_usd: float | None
    """Dollars over every run, subagents included; None when not known."""
    tasks: int | None = None
    """Background tasks started over every run (agents, shells, monitors); None when not
    known."""

    def record(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "session_id": self.session_id,
            "started": self.started,
            "cwd": self.cwd,
            "model": self.model,
            "first_prompt": self.first_prompt,
            "turns": self.turns,
            "cost_usd": self.cost_usd,
            "tasks": self.tasks,
        }

    @classmethod
    def from_record(cls, session_id: str, data: dict[str, Any]) -> SessionSummary | None:
        """The summary in `data`, or None when it is not one (a damaged or foreign file)."""

        def typed(name: str, kind: type | tuple[type, ...]) -> Any:
            value = data.get(name)
            return value if isinstance(value, kind) and not isinstance(value, bool) else None

        started = typed("started", (int, float))
        if data.get("session_id") != session_id or started is None:
            return None
        return cls(
            session_id,
            float(started),
            typed("cwd", str),
            typed("model", str),
            typed("first_prompt", str),
            typed("turns", int),
            None if typed("cost_usd", (int, float)) is None else float(data["cost_usd"]),
            typed("tasks", int),
        )


class Transcript:
    """An open transcript file. Every write is one line, written at once.

    `file` is opened for appending; lines go straight to its descriptor (one `write` per
    record, no buffer to hold a half record after a failure).
    """

    def __init__(
        self,
        path: Path,
        session_id: str,
        file: IO[str],
        summary: SessionSummary | None = None,
    ) -> None:
        self.path = path
        self.session_id = session_id
        self._file = file
        self.summary = summary
        """The session's summary so far (None: not kept, as for a subagent's sidechain)."""

    def note_prompt(self, prompt: str) -> None:
        """Keep the head of the first prompt in the summary (later prompts change nothing).

        **Errors:** `OSError` when the summary cannot be written.
        """
        if self.summary is None or self.summary.first_prompt is not None:
            return
        self._save(dataclasses.replace(self.summary, first_prompt=prompt[:_PROMPT_CHARS]))

    def note_run(self, turns: int, cost_usd: float) -> None:
        """Add a finished run's turns and cost to the summary.

        **Errors:** `OSError` when the summary cannot be written.
        """
        if self.summary is None:
            return
        was = self.summary
        self._save(
            dataclasses.replace(
                was,
                turns=(was.turns or 0) + turns,
                cost_usd=round((was.cost_usd or 0.0) + cost_usd, 6),
            )
        )

    def note_task(self) -> None:
        """Count a background task started in the summary.

        **Errors:** `OSError` when the summary cannot be written.
        """
        if self.summary is None:
            return
        self._save(dataclasses.replace(self.summary, tasks=(self.summary.tasks or 0) + 1))

    def _save(self, summary: SessionSummary) -> None:
        self.summary = summary
        write_summary(self.path.with_suffix(".meta.json"), summary)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record.

        **Errors:** `TranscriptWriteError` when it cannot be written (no space left, an I/O
        error); what was written of it is cut off again, so the file still ends at a record.
        """
        record.setdefault("ts", round(time.time(), 3))
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        data = memoryview(line.encode("utf-8"))
        self._file.flush()  # nothing is ever buffered, but never write around a buffer
        fd = self._file.fileno()
        end: int | None = None
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            while data:
                data = data[os.write(fd, data) :]
        except OSError as exc:
            if end is not None:
                try:
                    os.ftruncate(fd, end)
                except OSError:
                    pass  # the next open cuts the torn line off (repair_torn_tail)
            raise TranscriptWriteError(
                f"Cannot write the session transcript {self.path}: {exc.strerror or exc}.",
                path=self.path,
            ) from exc

    def message(self, message: Message) -> None:
        self.write({"type": "message", "message": message.to_api()})

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class LoadedSession:
    session_id: str
    path: Path
    messages: list[Message]
    """Repaired: valid for the API, dangling tool_uses answered."""
    cwd: str | None
    skipped_lines: int
    """Lines that could not be read (a half-written last line after a crash)."""
    unended_tasks: list[dict[str, str]] = field(default_factory=list)
    """Background tasks its transcript saw start and not end: they ended with the process
    that ran them (a kill, a crash). Each: `task_id`, `kind`, `description`."""


class SessionStore:
    """The directory of transcripts (`WarrenDirs.sessions`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, session_id: str) -> Path:
        """The transcript of `session_id`. **Errors:** `SessionError` for anything that is not
        a session id (`parse_session_id`): a path never reaches the filesystem."""
        return self.root / f"{parse_session_id(session_id)}.jsonl"

    def create(self, *, cwd: Path, model: str, session_id: str | None = None) -> Transcript:
        """A new session's transcript; `session_id` (`--session-id`) must not be in use.

        **Errors:** `SessionError` for an id in use or not an id; `TranscriptWriteError`.
        """
        if session_id is None:
            session_id = str(uuid.uuid4())
        elif self.path_for(session_id).exists():
            raise SessionError(f"session {session_id} is already in use; pick another id")
        transcript = self.open(session_id)
        started = round(time.time(), 3)
        transcript.write(
            {
                "type": "session",
                "version": FORMAT_VERSION,
                "session_id": session_id,
                "cwd": str(cwd),
                "model": model,
                "ts": started,
            }
        )
        transcript.summary = SessionSummary(session_id, started, str(cwd), model, None, 0, 0.0, 0)
        return transcript

    def open(self, session_id: str) -> Transcript:
        """Open a transcript for appending (creating it if needed). A half-written last line
        (a crash mid-write) is cut off first and a `repair` record says how many bytes went.

        **Errors:** `SessionError` for a bad id; `TranscriptWriteError` when the store or the
        file cannot be created or written (a read-only or full state directory).
        """
        path = self.path_for(session_id)
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            dropped = repair_torn_tail(path) if path.exists() else 0
            file = path.open("a", encoding="utf-8")
        except OSError as exc:
            raise TranscriptWriteError(
                f"Cannot open the session transcript {path}: {exc.strerror or exc}.", path=path
            ) from exc
        transcript = Transcript(path, session_id, file, _summary_of(path))
        if dropped:
            transcript.write({"type": "repair", "dropped_torn_bytes": dropped})
        return transcript

    def latest_for(self, cwd: Path) -> str | None:
        """The most recently written session started in `cwd` (for `--continue`)."""
        if not self.root.is_dir():
            return None
        candidates = sorted(
            self.root.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for path in candidates:
            if not _SESSION_ID.fullmatch(path.stem):
                continue  # not a transcript the store made
            try:
                with path.open(encoding="utf-8") as f:
                    header = json.loads(f.readline())
            except (OSError, ValueError):
                continue
            if header.get("type") == "session" and header.get("cwd") == str(cwd):
                return path.stem
        return None

    def summaries(self, cwd: Path | None = None) -> list[SessionSummary]:
        """The sessions started in `cwd` (every directory's when None), newest first.

        Reads each session's summary file, or the head of a transcript that has none; never a
        whole large transcript. Unreadable files are left out.
        """
        if not self.root.is_dir():
            return []
        found: list[SessionSummary] = []
        for path in self.root.glob("*.jsonl"):
            if path.name.endswith(".audit.jsonl") or not _UUID.fullmatch(path.stem):
                continue  # an audit log, a subagent's sidechain, not a transcript the store made
            summary = _summary_of(path)
            if summary is not None and (cwd is None or summary.cwd == str(cwd)):
                found.append(summary)
        found.sort(key=lambda s: s.started, reverse=True)
        return found

    def load(self, session_id: str) -> LoadedSession:
        """Read a transcript back. **Errors:** `SessionError` when it is missing or unusable."""
        path = self.path_for(session_id)
        if not path.is_file():
            raise SessionError(f"no session {session_id!r} (looked for {path})")
        messages: list[Message] = []
        cwd: str | None = None
        skipped = 0
        tasks: dict[str, dict[str, str]] = {}
        # errors="replace": a line torn inside a UTF-8 character is skipped like any other
        # torn line, instead of failing the whole load.
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    if record.get("type") == "session":
                        cwd = record.get("cwd")
                    elif record.get("type") == "message":
                        messages.append(Message.model_validate(record["message"]))
                    elif record.get("type") == "compact_boundary":
                        messages = []  # the compacted history follows, as message records
                    elif record.get("type") == "task":
                        _follow_task(record, tasks)
                except (ValueError, KeyError, pydantic.ValidationError):
                    skipped += 1
        return LoadedSession(
            session_id, path, normalize_for_api(messages), cwd, skipped, list(tasks.values())
        )


def _follow_task(record: dict[str, Any], tasks: dict[str, dict[str, str]]) -> None:
    """`tasks` (by id: the started and not ended) after one `task` record."""
    task_id = record.get("task_id")
    if not isinstance(task_id, str):
        return
    if record.get("phase") == "ended":
        tasks.pop(task_id, None)
    elif record.get("phase") == "started":
        tasks[task_id] = {
            "task_id": task_id,
            "kind": str(record.get("kind") or "task"),
            "description": str(record.get("description") or ""),
        }


def write_summary(path: Path, summary: SessionSummary) -> None:
    """Replace the summary at `path` atomically (`policies.atomic.replace_file`: a reader sees
    the old one or the new one), not fsynced: it is written before each run's first model
    request and after its end, and it is a cache of the transcript, which `_summary_of`
    reads instead when a crash left the summary empty or cut.

    **Errors:** `OSError` (`ReplaceFailed`: nothing changed).
    """
    from policies.atomic import replace_file

    data = json.dumps(summary.record(), ensure_ascii=False).encode("utf-8")
    try:
        old: os.stat_result | None = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    replace_file(path, data, old=old, mode=0o600, durable=False)


def _summary_of(transcript: Path) -> SessionSummary | None:
    """The summary of the transcript at `transcript`: its summary file, else what its head
    (and, for a small one, its result records) say. None when neither can be read."""
    session_id = transcript.stem
    try:
        with transcript.with_suffix(".meta.json").open("rb") as f:
            data = json.loads(f.read(_HEAD_BYTES))
        if isinstance(data, dict) and (summary := SessionSummary.from_record(session_id, data)):
            return summary
    except (OSError, ValueError):
        pass
    return _summary_from_transcript(transcript, session_id)


def _summary_from_transcript(path: Path, session_id: str) -> SessionSummary | None:
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_SMALL_TRANSCRIPT if size <= _SMALL_TRANSCRIPT else _HEAD_BYTES)
            started = os.fstat(f.fileno()).st_mtime
    except OSError:
        return None
    cwd = model = prompt = None
    header = False
    turns: int | None = 0 if size <= _SMALL_TRANSCRIPT else None
    cost: float | None = 0.0 if size <= _SMALL_TRANSCRIPT else None
    tasks: int | None = 0 if size <= _SMALL_TRANSCRIPT else None
    for number, line in enumerate(head.split(b"\n")):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the read limit, or torn
        if not isinstance(record, dict):
            continue
        kind = record.get("type")
        if number == 0 and kind == "session":
            header = True
            cwd, model = record.get("cwd"), record.get("model")
            if isinstance(record.get("ts"), (int, float)):
                started = float(record["ts"])
        elif kind == "message" and prompt is None:
            prompt = _prompt_text(record.get("message"))
        elif kind == "task" and record.get("phase") == "started" and tasks is not None:
            tasks += 1
        elif kind == "result" and turns is not None and cost is not None:
            try:
                turns += int(record.get("num_turns") or 0)
                cost += float(record.get("total_cost_usd") or 0.0)
            except (TypeError, ValueError):
                turns = cost = None
    if not header:
        return None
    return SessionSummary(
        session_id,
        started,
        cwd if isinstance(cwd, str) else None,
        model if isinstance(model, str) else None,
        prompt,
        turns,
        cost,
        tasks,
    )


def _prompt_text(message: object) -> str | None:
    if not isinstance(message, dict) or message.get("role") != "user":
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content[:_PROMPT_CHARS]
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                return str(block["text"])[:_PROMPT_CHARS]
    return None
