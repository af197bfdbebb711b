"""Sessions: one JSONL transcript per session, appended and flushed per message.

A transcript holds a header line, every message in order, the events needed to replay a run
(retries, permission decisions live in the audit log) and one result line per run. `--resume`
and `--continue` read it back; a transcript cut anywhere (a killed process, a half-written last
line) loads, and `normalize_for_api` closes dangling tool_uses with interruption results.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pydantic

from orchestrator.errors import SessionError
from orchestrator.messages import Message
from orchestrator.transcript_repair import normalize_for_api

__all__ = ["LoadedSession", "SessionStore", "Transcript"]

FORMAT_VERSION = 1


class Transcript:
    """An open transcript file. Every write is one line, flushed at once."""

    def __init__(self, path: Path, session_id: str, file: IO[str]) -> None:
        self.path = path
        self.session_id = session_id
        self._file = file

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("ts", round(time.time(), 3))
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()

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
        return self.root / f"{session_id}.jsonl"

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
        """Open a transcript for appending (creating it if needed)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.path_for(session_id)
        return Transcript(path, session_id, path.open("a", encoding="utf-8"))

    def latest_for(self, cwd: Path) -> str | None:
        """The most recently written session started in `cwd` (for `--continue`)."""
        if not self.root.is_dir():
            return None
        candidates = sorted(
            self.root.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for path in candidates:
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
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    if record.get("type") == "session":
                        cwd = record.get("cwd")
                    elif record.get("type") == "message":
                        messages.append(Message.model_validate(record["message"]))
                except (ValueError, KeyError, pydantic.ValidationError):
                    skipped += 1
        return LoadedSession(session_id, path, normalize_for_api(messages), cwd, skipped)
