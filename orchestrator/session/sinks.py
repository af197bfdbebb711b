"""Where a session's events go: the transcript, the audit log, the output format, the
denials, the change recorder, progress lines, and whatever the embedder adds; subagents'
events tagged and counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.agents.types import SubagentEvent, SubagentUpdate
from orchestrator.calls.denials import DenialLog
from orchestrator.changes.recorder import ChangeRecorder
from orchestrator.claude_code.output import OutputPrinter, ProgressPrinter, hook_errors
from orchestrator.conversation.loop import ModelUsage
from orchestrator.events import (
    AssistantTurn,
    CompactBoundary,
    Event,
    EventSink,
    RetryScheduled,
    TaskChanged,
    ToolResultsMessage,
)
from orchestrator.records.audit import AuditLog
from orchestrator.records.transcripts import Transcript
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.state import IoGuard

__all__ = ["Fanout", "build_sinks", "subagent_sink", "transcript_sink"]


def build_sinks(
    config: SessionConfig,
    parts: SessionParts,
    *,
    printer: OutputPrinter,
    denials: DenialLog,
    changes: ChangeRecorder,
    transcript: Transcript,
    audit: AuditLog,
    io_guard: IoGuard,
) -> Fanout:
    """Every consumer of the session's events, in the order they are told: state first
    (denials, change sets, transcript, audit), then what is shown."""
    sinks: list[EventSink] = [
        denials,
        changes,
        io_guard.sink(transcript_sink(transcript)),
        io_guard.sink(audit),
        printer,
        *parts.extra_sinks,
    ]
    sinks.append(ProgressPrinter(sys.stderr) if config.progress else hook_errors(sys.stderr))
    return Fanout(sinks)


@dataclass
class Fanout:
    sinks: list[EventSink] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)


def transcript_sink(transcript: Transcript) -> EventSink:
    def write(event: Event) -> None:
        match event:
            case AssistantTurn(turn=turn):
                transcript.message(turn.message)
            case ToolResultsMessage(message=message):
                transcript.message(message)
            case CompactBoundary():
                # The full history stays above; loading restarts from here (transcripts.load).
                transcript.write(
                    {
                        "type": "compact_boundary",
                        "trigger": event.trigger,
                        "pre_tokens": event.pre_tokens,
                        "post_tokens": event.post_tokens,
                        "summarised": event.summarised,
                    }
                )
                for message in event.messages:
                    transcript.message(message)
            case RetryScheduled():
                transcript.write(
                    {
                        "type": "retry",
                        "attempt": event.attempt,
                        "delay_s": event.delay_s,
                        "error": event.error,
                    }
                )
            case TaskChanged(phase="started" | "ended"):
                # A resumed session learns from these which tasks ended with this process.
                transcript.write(
                    {
                        "type": "task",
                        "phase": event.phase,
                        "task_id": event.task_id,
                        "kind": event.kind,
                        "description": event.description,
                        "status": event.status,
                        "summary": event.summary,
                    }
                )
                if event.phase == "started":
                    transcript.note_task()
            case _:
                pass

    return write


def subagent_sink(
    printer: OutputPrinter,
    audit: EventSink,
    denials: DenialLog,
    spend: dict[str, ModelUsage],
    extra: Callable[[SubagentUpdate], None] | None,
) -> Callable[[SubagentUpdate], None]:
    """Subagents' events: tagged lines in stream-json, their permission decisions in the
    session's audit log and its denials, their model turns in `spend` (the result's
    `modelUsage`), and whatever the embedder wants (`on_subagent`)."""

    def report(update: SubagentUpdate) -> None:
        printer.subagent(update)
        if isinstance(update, SubagentEvent):
            audit(update.event)
            denials(update.event, update.agent_id)
            if isinstance(update.event, AssistantTurn):
                turn = update.event.turn
                spend[turn.model] = spend.get(turn.model, ModelUsage()).add(turn)
        if extra is not None:
            extra(update)

    return report
