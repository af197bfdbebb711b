"""What a run reports while it runs: typed events for the transcript, the output and the logs.

The loop and the tool pipeline call one `EventSink` (a plain callable); the CLI fans events out
to the transcript writer, the stream-json printer and the audit log. Sinks must be quick and
must not raise: they run on the loop's hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.messages import AssistantMessage, Message

__all__ = [
    "AssistantTurn",
    "CallScheduled",
    "CompactBoundary",
    "Event",
    "EventSink",
    "HookRan",
    "PermissionDecided",
    "RetryScheduled",
    "TaskChanged",
    "TextStreamed",
    "ToolFinished",
    "ToolResultsMessage",
    "ToolStarted",
    "WorkflowChanged",
]


@dataclass(frozen=True)
class TextStreamed:
    text: str


@dataclass(frozen=True)
class AssistantTurn:
    """A complete assistant message, appended to the conversation."""

    turn: AssistantMessage


@dataclass(frozen=True)
class ToolResultsMessage:
    """The user message carrying a turn's tool_results (or an interruption note, or the
    request to continue a reply cut at `max_tokens`)."""

    message: Message


@dataclass(frozen=True)
class CompactBoundary:
    """The conversation was compacted (orchestrator/conversation/compaction.py): from here on the
    history is `messages`. `summarised` is False when clearing old tool results was enough."""

    trigger: Literal["auto", "manual", "reactive"]
    pre_tokens: int
    post_tokens: int
    messages: list[Message]
    summarised: bool


@dataclass(frozen=True)
class ToolStarted:
    tool_use_id: str
    tool: str
    display: str
    """One line for humans, from `Tool.render_use`."""


@dataclass(frozen=True)
class ToolFinished:
    tool_use_id: str
    tool: str
    summary: str
    is_error: bool
    duration_s: float


@dataclass(frozen=True)
class PermissionDecided:
    """One permission decision, for the audit log."""

    tool_use_id: str
    tool: str
    input: dict[str, Any]
    decision: Literal["allow", "deny", "ask"]
    rule: str | None
    answered_by: Literal["policy", "asker", "hook"]
    message: str | None = None
    read_only: bool | None = None
    """The call's read-only verdict (its `CallPlan`), None where no plan was made."""
    read_only_reason: str | None = None
    sandbox: Literal["ro", "rw", "scoped"] | None = None
    """The sandbox the call runs in if allowed: `ro` exactly when the verdict is read-only;
    `scoped`: read-only but for the call's write scope."""


@dataclass(frozen=True)
class CallScheduled:
    """How the executor scheduled a call that involves a write scope (orchestrator/calls/plan.py,
    `may_overlap`): for stream-json's `tool_schedule` and the audit log."""

    tool_use_id: str
    tool: str
    write_scope: tuple[str, ...] | None
    """The call's scope (a scoped writer), or None (a call that had to reckon with one)."""
    waits_for: tuple[str, ...]
    """The earlier calls of the message it waits for (empty: it runs at once)."""
    runs_with: tuple[str, ...]
    """The earlier calls of the message it may run alongside."""


@dataclass(frozen=True)
class HookRan:
    """One hook ran (orchestrator/hooks): for stream-json's `hook_response`, the audit log
    and the user (a non-blocking `error` is shown, never sent to the model)."""

    hook_event: str
    command: str
    source: str
    """The policy file the hook comes from."""
    exit_code: int | None
    """None when it never finished (timeout, flood, could not start)."""
    duration_s: float
    blocked: bool
    decision: Literal["allow", "deny", "ask"] | None = None
    error: str | None = None
    stdout: str = ""
    """The head of what it printed."""
    stderr: str = ""
    tool_use_id: str | None = None
    agent_id: str | None = None
    """The subagent whose call or stop fired it; None for the main agent."""


@dataclass(frozen=True)
class RetryScheduled:
    attempt: int
    """The attempt about to start (2 for the first retry; stream-json says 1, as Claude Code)."""
    delay_s: float
    error: str
    status: int | None
    max_retries: int | None = None
    """Retries the model client makes at most; None: not known."""


@dataclass(frozen=True)
class TaskChanged:
    """A background task (orchestrator/tasks/) started, printed a line (a monitor's event),
    or ended. Said as it happens, not at a turn boundary (the model's notification waits for
    that)."""

    phase: Literal["started", "progress", "ended"]
    task_id: str
    kind: Literal["agent", "shell", "monitor", "workflow"]
    description: str
    status: Literal["running", "completed", "failed", "stopped"]
    tool_use_id: str | None = None
    summary: str = ""
    """How it ended (`ended`); the line it printed (`progress`)."""
    output_file: str | None = None
    duration_s: float = 0.0
    output_bytes: int = 0


@dataclass(frozen=True)
class WorkflowChanged:
    """A workflow run (orchestrator/workflows/) entered a phase, logged a line, or one of its
    agents changed state (waiting, running, done, failed, answered from the journal)."""

    what: Literal["phase", "agent", "log"]
    run_id: str
    name: str
    task_id: str | None = None
    phase: str | None = None
    text: str = ""
    """The phase's title (`phase`), the script's line (`log`)."""
    key: str | None = None
    """The agent call's position in the script (`agent`)."""
    label: str | None = None
    status: Literal["waiting", "running", "done", "failed", "cached"] | None = None
    agent_id: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0


Event = (
    TextStreamed
    | AssistantTurn
    | ToolResultsMessage
    | ToolStarted
    | ToolFinished
    | PermissionDecided
    | RetryScheduled
    | CompactBoundary
    | HookRan
    | CallScheduled
    | TaskChanged
    | WorkflowChanged
)
EventSink = Callable[[Event], None]
