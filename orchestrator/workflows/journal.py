"""A workflow run on disk: its script, its state, and the journal of its finished agent calls.

Each run has a directory of its own, `<state>/workflows/<run id>/`, so `warren workflow resume
RUN_ID` finds it from any later process of the workspace:

- `script.py`: the script as it ran (the Workflow tool's `scriptPath`);
- `run.json`: what the run is (`RunRecord`: name, workspace, session, args, status, result),
  rewritten whole on each change (temp file, fsync, rename);
- `journal.jsonl`: one line per `agent()` call that ended (`JournalEntry`), appended with one
  `write` of a whole line on an `O_APPEND` descriptor and fsynced before the script hears the
  answer, so a call the script saw answered is on disk even after `kill -9` of the
  coordinator; a torn last line (a crash in the middle of the write) is ignored on reading;
- `writers.jsonl`: a scoped writer's scope as it was before it ran (`WriterStart`), so a writer
  that did not finish is rolled back before it runs again (orchestrator/workflows/rollback.py).

A call is keyed by its position in the script (`AgentCall.key`, e.g. `3.1` for the second
thunk of the parallel at position 3) and a hash of what makes its answer (prompt, type, schema,
write paths, model): `call_hash`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "AgentAnswer",
    "JournalEntry",
    "RunRecord",
    "RunStatus",
    "WorkflowStore",
    "WriterStart",
    "call_hash",
    "key_order",
    "new_run_id",
]

RunStatus = Literal["running", "completed", "failed", "stopped"]

_RUN_ID = re.compile(r"wf-[0-9a-f]{12}")
_LINE_CAP = 16 * 1024 * 1024
"""Bytes of one journal line read back (an agent's value larger than this is not cached)."""


def new_run_id() -> str:
    return f"wf-{secrets.token_hex(6)}"


def call_hash(
    prompt: str,
    agent_type: str | None,
    schema: Any,
    write_paths: list[str] | None,
    model: str | None,
) -> str:
    """What an agent call's answer depends on, hashed: a call whose hash differs from the
    journal's at its position is another call (an edited script), and runs again."""
    text = json.dumps(
        [prompt, agent_type, schema, write_paths, model], sort_keys=True, ensure_ascii=False
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def key_order(key: str) -> tuple[int, ...]:
    """A position key as numbers, so `3.10` comes after `3.9` and `4` after `3.9.1`."""
    return tuple(int(part) for part in key.split(".") if part.isdigit())


@dataclass
class RunRecord:
    """What a run is, as `run.json` keeps it."""

    run_id: str
    name: str
    description: str
    phases: list[str]
    workspace: str
    session_id: str
    args: Any
    status: RunStatus = "running"
    result: Any = None
    error: str | None = None
    created: float = field(default_factory=time.time)
    ended: float | None = None
    resumed_from: str | None = None
    """The run this one resumed (its journal answered the calls that matched)."""
    pid: int = field(default_factory=os.getpid)
    """The process that runs it (a `running` record whose process is gone ended with it)."""
    pid_started: float = 0.0
    """That process's start time (`psutil.Process.create_time`): a pid reused since by
    another process is not the run's."""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RunRecord:
        known = {k: v for k, v in value.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class AgentAnswer:
    """How one agent call ended."""

    ok: bool
    value: Any = None
    """The agent's text, or its validated object (`ok`)."""
    reason: str | None = None
    """Why it failed (not `ok`)."""
    agent_id: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    final: bool = True
    """A failure of the agent's own (it ran to its end and its output did not do): a resume
    answers it as failed again. False: it was stopped, refused or cut short (a limit, the
    budget, a denial, a lost worker), and a resume runs it again."""


@dataclass(frozen=True, kw_only=True)
class JournalEntry(AgentAnswer):
    """One ended `agent()` call: its position, its hash, and its answer (one line of the
    journal, flat)."""

    key: str
    hash: str


@dataclass(frozen=True)
class WriterStart:
    """A scoped writer about to run: its scope's files as they were (path relative to the
    workspace -> [sha256 or None for a link/special file, mode]), their contents in the
    session's content store."""

    key: str
    scope: list[str]
    files: dict[str, list[Any]]


class WorkflowStore:
    """The workflow runs of one state directory (`<state>/workflows`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run_dir(self, run_id: str) -> Path:
        if _RUN_ID.fullmatch(run_id) is None:
            raise ValueError(
                f"{run_id!r} is not a workflow run id (they look like wf-1a2b3c4d5e6f)"
            )
        return self.root / run_id

    def create(self, record: RunRecord, script: str) -> Path:
        """A new run's directory with its script and record; the script's path."""
        directory = self.run_dir(record.run_id)
        directory.mkdir(parents=True, mode=0o700)
        path = directory / "script.py"
        _write_atomic(path, script.encode())
        self.save(record)
        return path

    def save(self, record: RunRecord) -> None:
        data = json.dumps(asdict(record), ensure_ascii=False, default=str).encode()
        _write_atomic(self.run_dir(record.run_id) / "run.json", data)

    def load(self, run_id: str) -> RunRecord:
        """**Errors:** `FileNotFoundError` for an unknown run; `ValueError` for a bad id or a
        damaged record."""
        raw = (self.run_dir(run_id) / "run.json").read_bytes()
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError(f"the record of workflow run {run_id} is damaged")
        return RunRecord.from_json(value)

    def script(self, run_id: str) -> str:
        return (self.run_dir(run_id) / "script.py").read_text()

    def script_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "script.py"

    def runs(self) -> list[RunRecord]:
        """Every run this directory holds, newest first (damaged ones left out)."""
        found: list[RunRecord] = []
        with contextlib.suppress(FileNotFoundError):
            for child in self.root.iterdir():
                if _RUN_ID.fullmatch(child.name) is None:
                    continue
                with contextlib.suppress(OSError, ValueError, TypeError):
                    found.append(self.load(child.name))
        return sorted(found, key=lambda r: r.created, reverse=True)

    # -- the journal --

    def append(self, run_id: str, entry: JournalEntry) -> None:
        """One ended call, on disk (fsynced) when this returns."""
        _append_line(self.run_dir(run_id) / "journal.jsonl", asdict(entry))

    def entries(self, run_id: str) -> dict[str, JournalEntry]:
        """The journal by key (a later line for a key wins; torn or foreign lines skipped)."""
        found: dict[str, JournalEntry] = {}
        for value in _lines(self.run_dir(run_id) / "journal.jsonl"):
            with contextlib.suppress(TypeError, ValueError):
                entry = JournalEntry(**value)
                if isinstance(entry.key, str) and isinstance(entry.hash, str):
                    found[entry.key] = entry
        return found

    def writer_started(self, run_id: str, start: WriterStart) -> None:
        _append_line(self.run_dir(run_id) / "writers.jsonl", asdict(start))

    def writer_ended(self, run_id: str, key: str) -> None:
        _append_line(self.run_dir(run_id) / "writers.jsonl", {"key": key, "ended": True})

    def unfinished_writers(self, run_id: str) -> list[WriterStart]:
        """Writers that started and did not end (the run stopped while they wrote)."""
        open_: dict[str, WriterStart] = {}
        for value in _lines(self.run_dir(run_id) / "writers.jsonl"):
            key = value.get("key")
            if not isinstance(key, str):
                continue
            if value.get("ended"):
                open_.pop(key, None)
                continue
            with contextlib.suppress(TypeError, ValueError):
                open_[key] = WriterStart(**value)
        return list(open_.values())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _sync_dir(path.parent)


def _sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _append_line(path: Path, value: dict[str, Any]) -> None:
    line = json.dumps(value, ensure_ascii=False, default=str).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path} ({written} of {len(line)} bytes)")
        os.fsync(fd)
    finally:
        os.close(fd)


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for raw in data.split(b"\n"):
        if not raw or len(raw) > _LINE_CAP:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue  # a torn last line: the call it was for runs again
        if isinstance(value, dict):
            yield value
