"""What a hook reads on stdin: one JSON object per event, with Claude Code's field names.

Existing hook scripts read `tool_input.command`, `tool_input.file_path`, `stop_hook_active`
and `$CLAUDE_PROJECT_DIR`; keeping the names lets them run unchanged. Each event has its own
typed input (as the Claude Agent SDK has); `payload()` is the JSON sent, without fields that
are None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from policies.files import HookEvent

__all__ = [
    "HookInput",
    "NotificationInput",
    "PostToolUseInput",
    "PreCompactInput",
    "PreToolUseInput",
    "SessionEndInput",
    "SessionSource",
    "SessionStartInput",
    "StopInput",
    "UserPromptSubmitInput",
    "sample_input",
]

SessionSource = Literal["startup", "resume", "clear", "compact"]


@dataclass(frozen=True, kw_only=True)
class _Common:
    session_id: str
    transcript_path: str
    cwd: str
    permission_mode: str
    agent_id: str | None = None
    """Set when a subagent's call or stop fired the hook."""
    event: ClassVar[HookEvent]
    """The event each input class is for."""

    @property
    def hook_event_name(self) -> HookEvent:
        return self.event

    def payload(self) -> dict[str, Any]:
        data = {"hook_event_name": self.hook_event_name, **asdict(self)}
        return {key: value for key, value in data.items() if value is not None}


@dataclass(frozen=True, kw_only=True)
class _ToolCall(_Common):
    """An event about one tool call."""

    tool_name: str
    tool_input: dict[str, Any]
    tool_use_id: str


@dataclass(frozen=True, kw_only=True)
class PreToolUseInput(_ToolCall):
    event: ClassVar[HookEvent] = "PreToolUse"


@dataclass(frozen=True, kw_only=True)
class PostToolUseInput(_ToolCall):
    event: ClassVar[HookEvent] = "PostToolUse"
    tool_response: Any
    """The tool_result's content as the model sees it (text, or content blocks)."""


@dataclass(frozen=True, kw_only=True)
class UserPromptSubmitInput(_Common):
    event: ClassVar[HookEvent] = "UserPromptSubmit"
    prompt: str


@dataclass(frozen=True, kw_only=True)
class StopInput(_Common):
    event: ClassVar[HookEvent] = "Stop"
    stop_hook_active: bool
    """True when this stop follows a continuation a Stop hook forced (avoid loops)."""
    subagent: bool = False
    agent_transcript_path: str | None = None
    """SubagentStop: the subagent's own transcript (its sidechain)."""

    @property
    def hook_event_name(self) -> HookEvent:
        return "SubagentStop" if self.subagent else "Stop"

    def payload(self) -> dict[str, Any]:
        data = super().payload()
        data.pop("subagent", None)
        return data


@dataclass(frozen=True, kw_only=True)
class SessionStartInput(_Common):
    event: ClassVar[HookEvent] = "SessionStart"
    source: SessionSource


@dataclass(frozen=True, kw_only=True)
class SessionEndInput(_Common):
    event: ClassVar[HookEvent] = "SessionEnd"
    reason: str = "other"


@dataclass(frozen=True, kw_only=True)
class NotificationInput(_Common):
    event: ClassVar[HookEvent] = "Notification"
    message: str


@dataclass(frozen=True, kw_only=True)
class PreCompactInput(_Common):
    event: ClassVar[HookEvent] = "PreCompact"
    trigger: Literal["auto", "manual", "reactive"]
    custom_instructions: str = ""


HookInput = (
    PreToolUseInput
    | PostToolUseInput
    | UserPromptSubmitInput
    | StopInput
    | SessionStartInput
    | SessionEndInput
    | NotificationInput
    | PreCompactInput
)


def sample_input(event: HookEvent, common: dict[str, str], data: dict[str, Any]) -> HookInput:
    """An input for `warren hooks test`: `common` fields, then `data` (the user's sample,
    Claude Code's names) over defaults that make a plausible event.

    **Errors:** `TypeError`/`ValueError` for fields the event does not take.
    """
    fields = {**common, **{k: v for k, v in data.items() if k != "hook_event_name"}}
    match event:
        case "PreToolUse" | "PostToolUse":
            fields.setdefault("tool_name", "Bash")
            fields.setdefault("tool_input", {"command": "true"})
            fields.setdefault("tool_use_id", "toolu_test")
            if event == "PreToolUse":
                return PreToolUseInput(**fields)
            fields.setdefault("tool_response", "")
            return PostToolUseInput(**fields)
        case "UserPromptSubmit":
            fields.setdefault("prompt", "hello")
            return UserPromptSubmitInput(**fields)
        case "Stop" | "SubagentStop":
            fields.setdefault("stop_hook_active", False)
            return StopInput(subagent=event == "SubagentStop", **fields)
        case "SessionStart":
            fields.setdefault("source", "startup")
            return SessionStartInput(**fields)
        case "SessionEnd":
            return SessionEndInput(**fields)
        case "Notification":
            fields.setdefault("message", "Warren needs your permission to use Bash")
            return NotificationInput(**fields)
        case "PreCompact":
            fields.setdefault("trigger", "manual")
            return PreCompactInput(**fields)
    raise ValueError(f"unknown hook event {event}")
