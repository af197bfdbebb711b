"""Headless output: `--output-format text | json | stream-json`, and human progress lines.

stream-json follows the shape of Claude Code's so tools written for it read Warren's: one JSON
object per line — `system/init`, `assistant`, `user` (tool results), `system/api_retry`, and a
final `result`. Nothing else is ever written to stdout in that mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Literal

from orchestrator.events import (
    AssistantTurn,
    CompactBoundary,
    Event,
    HookRan,
    PermissionDecided,
    RetryScheduled,
    TextStreamed,
    ToolFinished,
    ToolResultsMessage,
    ToolStarted,
)
from orchestrator.loop import RunResult
from orchestrator.subagents import (
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    SubagentUpdate,
)
from orchestrator.text import escape_controls

__all__ = [
    "OutputFormat",
    "OutputPrinter",
    "ProgressPrinter",
    "event_record",
    "hook_errors",
    "result_record",
    "subagent_record",
]

OutputFormat = Literal["text", "json", "stream-json"]


def result_record(result: RunResult, *, session_id: str, turns_offset: int = 0) -> dict[str, Any]:
    subtype = {"completed": "success", "max_turns": "error_max_turns"}.get(
        result.reason, "error_during_execution"
    )
    return {
        "type": "result",
        "subtype": subtype,
        "is_error": result.reason != "completed",
        "terminal_reason": result.reason,
        "result": result.result,
        "num_turns": result.num_turns,
        "duration_ms": round(result.duration_s * 1000),
        "usage": result.usage.model_dump(),
        "total_cost_usd": round(result.cost_usd, 6),
        "modelUsage": {
            model: {
                **entry.usage.model_dump(),
                "costUSD": round(entry.cost_usd, 6),
                "requests": entry.requests,
            }
            for model, entry in result.model_usage.items()
        },
        "context": {
            "used_tokens": result.context_tokens,
            "window_tokens": result.context_window,
            "compactions": result.compactions,
        },
        "permission_denials": [denial.record() for denial in result.permission_denials],
        "session_id": session_id,
    }


def event_record(event: Event, **tag: Any) -> dict[str, Any] | None:
    """The stream-json line for a run's event, Claude Code's shapes (None: not printed).

    `tag` ends every line: the session id, and a subagent's id for its events.
    """
    match event:
        case AssistantTurn(turn=turn):
            message = {
                "id": turn.request_id,
                "type": "message",
                "role": "assistant",
                "model": turn.model,
                "content": turn.message.to_api()["content"],
                "stop_reason": turn.stop_reason,
                "usage": turn.usage.model_dump(),
            }
            return {"type": "assistant", "message": message, **tag}
        case ToolResultsMessage(message=message):
            return {"type": "user", "message": message.to_api(), **tag}
        case RetryScheduled():
            return {
                "type": "system",
                "subtype": "api_retry",
                "attempt": event.attempt,
                "delay_ms": round(event.delay_s * 1000),
                "error": event.error,
                "error_status": event.status,
                **tag,
            }
        case HookRan():
            return {
                "type": "system",
                "subtype": "hook_response",
                "hook_event": event.hook_event,
                "command": event.command,
                "source": event.source,
                "exit_code": event.exit_code,
                "duration_ms": round(event.duration_s * 1000),
                "blocked": event.blocked,
                "decision": event.decision,
                "error": event.error,
                "stdout": event.stdout,
                "stderr": event.stderr,
                "tool_use_id": event.tool_use_id,
                **({"agent_id": event.agent_id} if event.agent_id is not None else {}),
                **tag,
            }
        case CompactBoundary(summarised=True):
            return {
                "type": "system",
                "subtype": "compact_boundary",
                "compact_metadata": {
                    "trigger": event.trigger,
                    "pre_tokens": event.pre_tokens,
                    "post_tokens": event.post_tokens,
                },
                **tag,
            }
        case _:
            return None


def subagent_record(update: SubagentUpdate, *, session_id: str) -> dict[str, Any] | None:
    """The stream-json line for a subagent update: its events in the main agent's shapes
    tagged with `agent_id`, plus `subagent_start` and `subagent_result`."""
    match update:
        case SubagentStarted():
            return {
                "type": "system",
                "subtype": "subagent_start",
                "agent_id": update.agent_id,
                "agent_type": update.agent_type,
                "description": update.description,
                "transcript_path": None if update.transcript is None else str(update.transcript),
                "session_id": session_id,
            }
        case SubagentFinished(outcome=outcome):
            return {
                "type": "system",
                "subtype": "subagent_result",
                "agent_id": outcome.agent_id,
                "terminal_reason": outcome.reason,
                "num_turns": outcome.num_turns,
                "duration_ms": round(outcome.duration_s * 1000),
                "usage": outcome.usage.model_dump(),
                "total_cost_usd": round(outcome.cost_usd, 6),
                "worker_pid": outcome.worker_pid,
                "session_id": session_id,
            }
        case SubagentEvent(agent_id=agent_id, event=event):
            return event_record(event, agent_id=agent_id, session_id=session_id)
        case _:
            return None


@dataclass
class OutputPrinter:
    """The event sink that writes the chosen format to `out` (stdout)."""

    format: OutputFormat
    session_id: str
    out: IO[str] = sys.stdout

    def _line(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()

    def init(
        self, *, cwd: str, model: str, tools: list[str], transcript: str, **extra: Any
    ) -> None:
        if self.format == "stream-json":
            self._line(
                {
                    "type": "system",
                    "subtype": "init",
                    "session_id": self.session_id,
                    "cwd": cwd,
                    "model": model,
                    "tools": tools,
                    "transcript_path": transcript,
                    "pid": os.getpid(),
                    **extra,
                }
            )

    def __call__(self, event: Event) -> None:
        if self.format == "stream-json":
            record = event_record(event, session_id=self.session_id)
            if record is not None:
                self._line(record)

    def subagent(self, update: SubagentUpdate) -> None:
        """A subagent's event, tagged with its id (stream-json only)."""
        if self.format == "stream-json":
            record = subagent_record(update, session_id=self.session_id)
            if record is not None:
                self._line(record)

    def finish(self, result: RunResult) -> None:
        record = result_record(result, session_id=self.session_id)
        match self.format:
            case "stream-json" | "json":
                self._line(record)
            case "text" if result.reason in ("completed", "output_truncated", "permission_denied"):
                # A truncated answer is still the answer, as far as it goes (the CLI says on
                # stderr that it is cut); so is the answer of a run that completed with denied
                # calls under --fail-on-denial (the CLI lists them).
                text = result.result
                if _is_terminal(self.out):
                    text = escape_controls(text, keep_lines=True)
                self.out.write(text + ("\n" if text and not text.endswith("\n") else ""))
                self.out.flush()
            case "text":
                pass  # the CLI reports a failed run on stderr; stdout stays the answer only


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class ProgressPrinter:
    """Readable progress for humans (stderr in headless runs, stdout in the demo)."""

    out: IO[str] = sys.stderr
    show_text: bool = False

    def __call__(self, event: Event) -> None:
        match event:
            # Every string below comes from the model, a tool or a server: escaped, so none
            # can move the cursor or rewrite earlier lines (tests/orchestrator/test_output.py).
            case TextStreamed(text=text) if self.show_text:
                self.out.write(escape_controls(text, keep_lines=True))
            case AssistantTurn(turn=turn) if self.show_text and turn.message.text():
                self.out.write("\n")
            case ToolStarted(display=display):
                self.out.write(f"  -> {escape_controls(display)}\n")
            case ToolFinished(tool=tool, summary=summary, is_error=is_error, duration_s=d):
                mark = "!!" if is_error else "<-"
                line = f"{escape_controls(tool)}: {escape_controls(summary)}"
                self.out.write(f"  {mark} {line} ({d * 1000:.0f} ms)\n")
            case PermissionDecided(decision="deny", tool=tool, message=message):
                first = escape_controls((message or "").split("\n")[0][:160])
                self.out.write(f"  xx {escape_controls(tool)} denied: {first}\n")
            case RetryScheduled(attempt=attempt, delay_s=delay, error=error):
                self.out.write(f"  .. retry {attempt} in {delay:.1f} s: {escape_controls(error)}\n")
            case HookRan():
                said = _hook_line(event)
                if said is None:
                    return
                self.out.write(said)
            case CompactBoundary(trigger=trigger, pre_tokens=pre, post_tokens=post):
                how = "summarised" if event.summarised else "old tool results cleared"
                self.out.write(
                    f"  .. context compacted ({trigger}, {how}): ~{pre:,} -> ~{post:,} tokens\n"
                )
            case _:
                return
        self.out.flush()


def _hook_line(event: HookRan) -> str | None:
    """A hook that blocked or failed, for humans (a quiet success is not shown)."""
    if event.error is not None:
        what = f"failed (not blocking): {event.error}"
    elif event.blocked:
        what = f"blocked (exit {event.exit_code})"
    else:
        return None
    first = escape_controls(what.split("\n")[0][:300])
    agent = "" if event.agent_id is None else f" ({escape_controls(event.agent_id)})"
    return f"  hh {event.hook_event} hook{agent} {escape_controls(event.command[:120])} {first}\n"


def hook_errors(out: IO[str]) -> Callable[[Event], None]:
    """Without progress lines, hooks that failed are still said on stderr: a broken hook
    must not fail silently (a blocked one is the model's business, and the result's)."""

    def sink(event: Event) -> None:
        if isinstance(event, HookRan) and event.error is not None:
            line = _hook_line(event)
            if line is not None:
                with contextlib.suppress(OSError, ValueError):
                    out.write("warren: " + line[5:])
                    out.flush()

    return sink
