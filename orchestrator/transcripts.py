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
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pydantic

from orchestrator.errors import SessionError, TranscriptWriteError
from orchestrator.messages import Message
from orchestrator.transcript_repair import normalize_for_api

__all__ = [
    "LoadedSession",
    "SessionStore",
    "Transcript",
    "parse_session_id",
    "repair_torn_tail",
]

FORMAT_VERSION = 1

_SESSION_ID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|agent-[0-9a-f]{12}"
)
"""The ids the store (a UUID) and dispatch_agent (a sidechain) make."""
_TAIL_CHUNK = 65_536


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


class Transcript:
    """An open transcript file. Every write is one line, written at once.

    `file` is opened for appending; lines go straight to its descriptor (one `write` per
    record, no buffer to hold a half record after a failure).
    """

    def __init__(self, path: Path, session_id: str, file: IO[str]) -> None:
        self.path = path
        self.session_id = session_id
        self._file = file

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


class SessionStore:
    """The directory of transcripts (`WarrenDirs.sessions`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, session_id: str) -> Path:
        """The transcript of `session_id`. **Errors:** `SessionError` for anything that is not
        a session id (`parse_session_id`): a path never reaches the filesystem."""
        return self.root / f"{parse_session_id(session_id)}.jsonl"

    def create(self, *, cwd: Path, model: str) -> Transcript:
        session_id = str(uuid.uuid4())
        transcript = self.open(session_id)
        transcript.write(
            {
                "type": "session",
                "version": FORMAT_VERSION,
                "session_id": session_id,
                "cwd": str(cwd),
                "model": model,
            }
        )
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
        transcript = Transcript(path, session_id, file)
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

    def load(self, session_id: str) -> LoadedSession:
        """Read a transcript back. **Errors:** `SessionError` when it is missing or unusable."""
        path = self.path_for(session_id)
        if not path.is_file():
            raise SessionError(f"no session {session_id!r} (looked for {path})")
        messages: list[Message] = []
        cwd: str | None = None
        skipped = 0
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
                except (ValueError, KeyError, pydantic.ValidationError):
                    skipped += 1
        return LoadedSession(session_id, path, normalize_for_api(messages), cwd, skipped)
