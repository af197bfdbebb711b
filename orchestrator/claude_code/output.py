"""Headless output: `--output-format text | json | stream-json`, and human progress lines.

stream-json speaks Claude Code's dialect so tools written for it read Warren's unchanged: one
JSON object per line — `system/init`, `assistant`, `user` (tool results), `system/api_retry`,
`system/permission_denied`, `system/task_started` and `system/task_notification` around a
subagent (Claude Code 2.1's task lines: the Claude Agent SDK tracks a `local_agent` task from
its start to its notification, so every started task gets one, `stopped` if the run ended
first), and a final `result` — each with Claude Code's field names and
types (`uuid` and `session_id` on every line, `parent_tool_use_id` on a subagent's messages,
modes spelled `acceptEdits`). Warren's own fields (`agent_id`, `terminal_reason`, `context`,
`transcript_path`, ...) ride along as extras. The shapes are pinned against goldens recorded
from Claude Code itself (tests/orchestrator/cc_compat/). Nothing else is ever written to stdout
in that mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentFinished,
    SubagentOutcome,
    SubagentStarted,
    SubagentUpdate,
)
from orchestrator.conversation.loop import RunResult
from orchestrator.events import (
    AssistantTurn,
    CallScheduled,
    CompactBoundary,
    Event,
    HookRan,
    PermissionDecided,
    RetryScheduled,
    TaskChanged,
    TextStreamed,
    ToolFinished,
    ToolResultsMessage,
    ToolStarted,
    WorkflowChanged,
)
from orchestrator.text import escape_controls
from policies.claude_names import claude_mode

__all__ = [
    "OutputFormat",
    "OutputPrinter",
    "ProgressPrinter",
    "api_key_source",
    "event_record",
    "hook_errors",
    "result_record",
    "subagent_record",
]

OutputFormat = Literal["text", "json", "stream-json"]


def result_record(result: RunResult, *, session_id: str, turns_offset: int = 0) -> dict[str, Any]:
    """The `result` line, Claude Code's fields first; cost and usage count subagents too."""
    subtype = {"completed": "success", "max_turns": "error_max_turns"}.get(
        result.reason, "error_during_execution"
    )
    return {
        "type": "result",
        "subtype": subtype,
        "is_error": result.reason != "completed",
        "duration_ms": round(result.duration_s * 1000),
        "duration_api_ms": round(result.api_duration_s * 1000),
        "num_turns": result.num_turns,
        "result": result.result,
        "stop_reason": "end_turn" if result.reason == "completed" else None,
        "session_id": session_id,
        "total_cost_usd": round(result.cost_usd, 6),
        "usage": result.usage.model_dump(),
        "modelUsage": {
            model: {
                "inputTokens": entry.usage.input_tokens,
                "outputTokens": entry.usage.output_tokens,
                "cacheReadInputTokens": entry.usage.cache_read_input_tokens,
                "cacheCreationInputTokens": entry.usage.cache_creation_input_tokens,
                "webSearchRequests": 0,
                "costUSD": round(entry.cost_usd, 6),
                "requests": entry.requests,
            }
            for model, entry in result.model_usage.items()
        },
        "permission_denials": [denial.record() for denial in result.permission_denials],
        "terminal_reason": result.reason,
        "context": {
            "used_tokens": result.context_tokens,
            "window_tokens": result.context_window,
            "compactions": result.compactions,
        },
    }


def api_key_source() -> str:
    """Where the API key comes from, in Claude Code's words (`system/init`'s `apiKeySource`)."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "ANTHROPIC_API_KEY"
    if os.environ.get("ANTHROPIC_AUTH_TOKEN"):
        return "ANTHROPIC_AUTH_TOKEN"
    return "none"


def event_record(event: Event, **tag: Any) -> dict[str, Any] | None:
    """The stream-json line for a run's event, Claude Code's shapes (None: not printed).

    `tag` ends every line: the session id, and for a subagent's events its id (`agent_id`)
    and the `dispatch_agent` call it runs for (`parent_tool_use_id`; None for the main agent).
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
            return {"type": "assistant", "message": message, "parent_tool_use_id": None, **tag}
        case ToolResultsMessage(message=message):
            return {"type": "user", "message": message.to_api(), "parent_tool_use_id": None, **tag}
        case RetryScheduled():
            return {
                "type": "system",
                "subtype": "api_retry",
                "attempt": event.attempt - 1,  # Claude Code counts retries, from 1
                "max_retries": event.max_retries,
                "retry_delay_ms": round(event.delay_s * 1000),
                "error_status": event.status,
                "error": event.error,
                **tag,
            }
        case PermissionDecided(decision="deny"):
            return {
                "type": "system",
                "subtype": "permission_denied",
                "tool_name": event.tool,
                "tool_use_id": event.tool_use_id,
                "message": event.message or "",
                "rule": event.rule,
                **tag,
            }
        case CallScheduled():
            return {
                "type": "system",
                "subtype": "tool_schedule",
                "tool_use_id": event.tool_use_id,
                "tool_name": event.tool,
                "write_scope": None if event.write_scope is None else list(event.write_scope),
                "waits_for": list(event.waits_for),
                "runs_with": list(event.runs_with),
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
        case WorkflowChanged():
            return workflow_record(event, **tag)
        case _:
            return None


def workflow_record(event: WorkflowChanged, **tag: Any) -> dict[str, Any] | None:
    """A workflow's phase, log line or agent change as a `task_progress` line of its task
    (`task_id` is the run's), with the detail under `workflow`; an agent still waiting for a
    slot is not printed."""
    if event.what == "agent" and event.status == "waiting":
        return None
    detail: dict[str, Any] = {"run_id": event.run_id, "event": event.what, "phase": event.phase}
    if event.what == "agent":
        detail.update(
            key=event.key,
            label=event.label,
            status=event.status,
            agent_id=event.agent_id,
            total_tokens=event.tokens,
            cost_usd=event.cost_usd,
        )
        summary = f"{event.label}: {event.status}"
    else:
        detail["text"] = event.text
        summary = event.text if event.what == "log" else f"phase: {event.text}"
    return {
        "type": "system",
        "subtype": "task_progress",
        "task_id": event.task_id or event.run_id,
        "description": event.name,
        "workflow_name": event.name,
        "summary": summary,
        "workflow": detail,
        **tag,
    }


_TASK_TYPES = {
    "shell": "local_bash",
    "monitor": "monitor",
    "agent": "local_agent",
    "workflow": "local_workflow",
}


def background_task_record(event: TaskChanged, *, session_id: str) -> dict[str, Any]:
    """Claude Code's task line for a background shell or monitor: `task_started`,
    `task_progress` (a monitor's line), `task_notification` (its end)."""
    usage = {"total_tokens": 0, "tool_uses": 0, "duration_ms": round(event.duration_s * 1000)}
    common = {
        "type": "system",
        "task_id": event.task_id,
        "tool_use_id": event.tool_use_id,
        "session_id": session_id,
    }
    match event.phase:
        case "started":
            return {
                **common,
                "subtype": "task_started",
                "description": event.description,
                "task_type": _TASK_TYPES[event.kind],
                "is_backgrounded": True,
            }
        case "progress":
            return {
                **common,
                "subtype": "task_progress",
                "description": event.description,
                "usage": usage,
                "last_tool_name": "Monitor" if event.kind == "monitor" else "Bash",
                "summary": event.summary,
            }
        case "ended":
            return {
                **common,
                "subtype": "task_notification",
                "status": "failed" if event.status == "running" else event.status,
                "output_file": event.output_file or "",
                "summary": event.summary,
                "usage": usage,
            }


def task_record(
    update: SubagentStarted | SubagentFinished,
    *,
    session_id: str,
    parent_tool_use_id: str | None = None,
    output_file: str | None = None,
    backgrounded: bool = False,
) -> dict[str, Any]:
    """Claude Code's task line for a subagent: `system/task_started` when it starts,
    `system/task_notification` when it ends (its status and final text as `summary`)."""
    match update:
        case SubagentStarted():
            return {
                "type": "system",
                "subtype": "task_started",
                "task_id": update.agent_id,
                "tool_use_id": update.tool_use_id,
                "description": update.description,
                "task_type": "local_agent",
                "subagent_type": update.agent_type,
                "is_backgrounded": backgrounded,
                "session_id": session_id,
            }
        case SubagentFinished(outcome=outcome):
            status = {"completed": "completed", "interrupted": "stopped"}.get(
                outcome.reason, "failed"
            )
            usage = outcome.usage
            return {
                "type": "system",
                "subtype": "task_notification",
                "task_id": outcome.agent_id,
                "tool_use_id": parent_tool_use_id,
                "status": status,
                "output_file": output_file or "",
                "summary": outcome.result,
                "usage": {
                    "duration_ms": round(outcome.duration_s * 1000),
                    "total_tokens": usage.input_tokens + usage.output_tokens,
                },
                "session_id": session_id,
            }


def subagent_record(
    update: SubagentUpdate, *, session_id: str, parent_tool_use_id: str | None = None
) -> dict[str, Any] | None:
    """The stream-json line for a subagent update: its events in the main agent's shapes
    tagged with `parent_tool_use_id` (Claude Code's) and `agent_id` (Warren's), plus
    `subagent_start` and `subagent_result`."""
    match update:
        case SubagentStarted():
            return {
                "type": "system",
                "subtype": "subagent_start",
                "agent_id": update.agent_id,
                "parent_tool_use_id": update.tool_use_id,
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
                **({"worker_node": outcome.worker_node} if outcome.worker_node else {}),
                **({"snapshot": outcome.snapshot} if outcome.snapshot else {}),
                "parent_tool_use_id": parent_tool_use_id,
                "session_id": session_id,
            }
        case SubagentEvent(agent_id=agent_id, event=event):
            return event_record(
                event,
                parent_tool_use_id=parent_tool_use_id,
                agent_id=agent_id,
                session_id=session_id,
            )
        case _:
            return None


@dataclass
class _AgentProgress:
    description: str
    started: float = field(default_factory=time.monotonic)
    tokens: int = 0
    tool_uses: int = 0


@dataclass
class OutputPrinter:
    """The event sink that writes the chosen format to `out` (stdout)."""

    format: OutputFormat
    session_id: str
    out: IO[str] = sys.stdout
    partial: bool = False
    """`--include-partial-messages`: the main agent's text deltas as `stream_event` lines."""
    _parents: dict[str, str | None] = field(default_factory=dict)
    """Each subagent's `dispatch_agent` call, by agent id (`parent_tool_use_id`)."""
    _open_tasks: dict[str, str | None] = field(default_factory=dict)
    """Subagents whose `task_started` has no `task_notification` yet: their transcripts."""
    _background: set[str] = field(default_factory=set)
    """Subagents that run as background tasks (`is_backgrounded`)."""
    _progress: dict[str, _AgentProgress] = field(default_factory=dict)
    """Each running subagent's `task_progress` so far."""

    def _line(self, record: dict[str, Any]) -> None:
        record.setdefault("uuid", str(uuid.uuid4()))
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()

    def write(self, record: dict[str, Any]) -> None:
        """Any other stream-json line (the SDK control protocol's), with a `uuid` if it has
        none."""
        self._line(record)

    def init(
        self,
        *,
        cwd: str,
        model: str,
        tools: list[str],
        transcript: str,
        permission_mode: str,
        mcp_servers: Sequence[str] = (),
        **extra: Any,
    ) -> None:
        """The run's first line (stream-json's `system/init`); `mcp_servers`: the names of
        the servers configured, none connected yet (Claude Code's `pending`)."""
        if self.format == "stream-json":
            self._line(
                {
                    "type": "system",
                    "subtype": "init",
                    "session_id": self.session_id,
                    "cwd": cwd,
                    "model": model,
                    "tools": tools,
                    "mcp_servers": [{"name": name, "status": "pending"} for name in mcp_servers],
                    "permissionMode": claude_mode(permission_mode),
                    "apiKeySource": api_key_source(),
                    "slash_commands": [],
                    "output_style": "default",
                    "transcript_path": transcript,
                    "pid": os.getpid(),
                    **extra,
                }
            )

    def __call__(self, event: Event) -> None:
        if self.format == "stream-json" and self.partial and isinstance(event, TextStreamed):
            delta = {
                "type": "content_block_delta",
                "delta": {"type": "text_delta", "text": event.text},
            }
            self._line(
                {
                    "type": "stream_event",
                    "event": delta,
                    "parent_tool_use_id": None,
                    "session_id": self.session_id,
                }
            )
        if isinstance(event, TaskChanged):
            if event.kind == "agent":  # its lines come with the subagent's own updates
                if event.phase == "started":
                    self._background.add(event.task_id)
            elif self.format == "stream-json":
                self._line(background_task_record(event, session_id=self.session_id))
            return
        if self.format == "stream-json":
            record = event_record(event, session_id=self.session_id)
            if record is not None:
                self._line(record)

    def _agent_progress(self, update: SubagentEvent) -> None:
        """Claude Code's `task_progress` for a subagent: at each tool it starts, its usage
        so far and that tool's name."""
        progress = self._progress.get(update.agent_id)
        if progress is None:
            return
        match update.event:
            case AssistantTurn(turn=turn):
                progress.tokens += turn.usage.input_tokens + turn.usage.output_tokens
            case ToolStarted(tool=name):
                progress.tool_uses += 1
                self._line(
                    {
                        "type": "system",
                        "subtype": "task_progress",
                        "task_id": update.agent_id,
                        "tool_use_id": self._parents.get(update.agent_id),
                        "description": progress.description,
                        "usage": {
                            "total_tokens": progress.tokens,
                            "tool_uses": progress.tool_uses,
                            "duration_ms": round((time.monotonic() - progress.started) * 1000),
                        },
                        "last_tool_name": name,
                        "session_id": self.session_id,
                    }
                )
            case _:
                pass

    def subagent(self, update: SubagentUpdate) -> None:
        """A subagent's event, tagged with its call and id (stream-json only)."""
        if isinstance(update, SubagentStarted):
            self._parents[update.agent_id] = update.tool_use_id
        agent_id = (
            update.outcome.agent_id if isinstance(update, SubagentFinished) else (update.agent_id)
        )
        if self.format != "stream-json":
            return
        parent = self._parents.get(agent_id)
        if isinstance(update, SubagentStarted):
            self._line(
                task_record(
                    update,
                    session_id=self.session_id,
                    backgrounded=agent_id in self._background,
                )
            )
            transcript = None if update.transcript is None else str(update.transcript)
            self._open_tasks[agent_id] = transcript
            self._progress[agent_id] = _AgentProgress(update.description)
        elif isinstance(update, SubagentEvent):
            self._agent_progress(update)
        elif isinstance(update, SubagentFinished) and agent_id in self._open_tasks:
            self._progress.pop(agent_id, None)
            output_file = self._open_tasks.pop(agent_id)
            self._line(
                task_record(
                    update,
                    session_id=self.session_id,
                    parent_tool_use_id=parent,
                    output_file=output_file,
                )
            )
        record = subagent_record(update, session_id=self.session_id, parent_tool_use_id=parent)
        if record is not None:
            self._line(record)

    def finish(self, result: RunResult) -> None:
        # A subagent the run left unfinished (interrupted) still ends its task, or an SDK
        # host would wait for it past the result.
        for agent_id, output_file in self._open_tasks.items():
            outcome = SubagentOutcome(agent_id, "interrupted", "The run ended before it did.")
            self._line(
                task_record(
                    SubagentFinished(outcome),
                    session_id=self.session_id,
                    parent_tool_use_id=self._parents.get(agent_id),
                    output_file=output_file,
                )
            )
        self._open_tasks.clear()
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
