"""A session's state on disk: its transcript (new, resumed or forked), log file and audit log,
and the one boundary every state write goes through (`IoGuard`).

State that cannot be written is translated once, here: at start-up it is a `StateUnwritable`
(a `ConfigError`: one line, exit 2, nothing ran); mid-run a failed transcript, audit or log
write interrupts the run, which ends `io_error` (exit 8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from orchestrator.conversation.loop import RunControl
from orchestrator.errors import ConfigError, SessionError, TranscriptWriteError
from orchestrator.events import Event, EventSink
from orchestrator.messages import Message
from orchestrator.paths import WarrenDirs
from orchestrator.records.audit import AuditLog
from orchestrator.records.logs import LogSink, configure_logging
from orchestrator.records.transcripts import SessionStore, Transcript
from orchestrator.session.config import SessionConfig, StateUnwritable
from policies.mode import PermissionMode

__all__ = ["ENDED_WITH_PROCESS", "IoGuard", "open_audit", "open_log", "open_transcript"]


@dataclass
class IoGuard:
    """The one boundary for state writes during a session (transcript, audit, log).

    The first `OSError` (ENOSPC, EROFS, EIO...) or `TranscriptWriteError` (the transcript
    store's, which cuts a partial record back first) is remembered as one sentence and
    interrupts the current run, which then ends `io_error`; later writes are skipped, so a
    full disk does not turn every event into another failure.
    """

    failure: str | None = None
    control: RunControl | None = None

    def failed(self, what: str, exc: OSError | TranscriptWriteError) -> None:
        if self.failure is None:
            why = exc.strerror or exc if isinstance(exc, OSError) else exc.message.rstrip(".")
            self.failure = f"could not write the {what}: {why}"
            structlog.get_logger().error("state write failed", what=what, error=str(exc))
        if self.control is not None:
            self.control.interrupt()

    def write(self, step: Callable[[], None], what: str = "transcript") -> None:
        if self.failure is not None:
            return
        try:
            step()
        except (OSError, TranscriptWriteError) as exc:  # the transcript store's typed error
            self.failed(what, exc)

    def sink(self, sink: EventSink) -> EventSink:
        what = "audit log" if isinstance(sink, AuditLog) else "transcript"

        def guarded(event: Event) -> None:
            self.write(lambda: sink(event), what)

        return guarded

    def close(self, close: Callable[[], None]) -> None:
        try:
            close()
        except (OSError, TranscriptWriteError) as exc:
            self.failed("state", exc)

    def check_start(self) -> None:
        """Refuse to start a session whose state could not be written while it opened.

        **Errors:** `ConfigError` saying what failed and how to get space.
        """
        if self.failure is not None:
            raise ConfigError(
                f"{self.failure}. Free some space, or point XDG_STATE_HOME at a writable "
                "directory.",
                source="state",
            )


def open_transcript(
    config: SessionConfig, dirs: WarrenDirs, cwd: Path
) -> tuple[Transcript, list[Message], list[dict[str, str]]]:
    """A new transcript, or the resumed one with its history (`--fork-session`: a new one
    holding the old conversation, the old one untouched), and the background tasks the
    session's previous process left running (they ended with it: a resumed transcript says
    so, so the next resume does not report them again).

    **Errors:** `ConfigError` for no session to continue or a bad `--session-id`;
    `StateUnwritable` when the sessions directory cannot be written.
    """
    store = SessionStore(dirs.sessions)
    try:
        if not (config.resume or config.continue_last):
            return _create_transcript(store, config, cwd), [], []
        session_id = config.resume or store.latest_for(cwd)
        if session_id is None:
            raise ConfigError(f"no earlier session in {cwd} to continue", source="--continue")
        try:
            loaded = store.load(session_id)
        except SessionError as exc:
            raise ConfigError(str(exc), source="--resume") from exc
        if config.fork_session:  # the conversation goes on in a new session; the old one stays
            transcript = _create_transcript(store, config, cwd)
            record: dict[str, object] = {"type": "fork", "from_session": session_id}
            written = _written(transcript, record, loaded.messages)
            return written, list(loaded.messages), loaded.unended_tasks
        transcript = store.open(session_id)
        record = {"type": "resume", "skipped_lines": loaded.skipped_lines}
        written = _written(transcript, record, ())
        try:
            for task in loaded.unended_tasks:
                written.write(
                    {"type": "task", "phase": "ended", **task, "status": "stopped",
                     "summary": ENDED_WITH_PROCESS}
                )  # fmt: skip
        except (OSError, TranscriptWriteError):
            written.close()
            raise
        return written, list(loaded.messages), loaded.unended_tasks
    except (OSError, TranscriptWriteError) as exc:
        raise StateUnwritable(dirs.sessions, exc) from exc


ENDED_WITH_PROCESS = "ended with the session's previous process"


def _written(
    transcript: Transcript, record: dict[str, object], messages: Sequence[Message]
) -> Transcript:
    """`transcript` with `record` and then `messages` appended; closed if that fails."""
    try:
        transcript.write(record)
        for message in messages:
            transcript.message(message)
    except (OSError, TranscriptWriteError):
        transcript.close()
        raise
    return transcript


def _create_transcript(store: SessionStore, config: SessionConfig, cwd: Path) -> Transcript:
    try:
        return store.create(cwd=cwd, model=config.model, session_id=config.session_id)
    except SessionError as exc:
        raise ConfigError(str(exc), source="--session-id") from exc


def open_log(dirs: WarrenDirs, session_id: str, verbose: bool, io_guard: IoGuard) -> LogSink:
    """The session's JSON log file (and readable lines on stderr with `verbose`).

    **Errors:** `StateUnwritable` when the logs directory cannot be written.
    """
    try:
        return configure_logging(
            log_file=dirs.logs / f"{session_id}.log", verbose=verbose, on_error=io_guard.failed
        )
    except OSError as exc:
        raise StateUnwritable(dirs.logs, exc) from exc


def open_audit(transcript: Transcript, mode: PermissionMode, floor: str) -> AuditLog:
    """The audit log beside the transcript, reading the session's live `mode`.

    **Errors:** `StateUnwritable` when it cannot be opened.
    """
    path = transcript.path.with_suffix(".audit.jsonl")
    try:
        return AuditLog(path, mode=mode, floor=floor)
    except OSError as exc:
        raise StateUnwritable(path.parent, exc) from exc
