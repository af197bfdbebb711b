"""What a hook said: its exit code and stdout read the way Claude Code reads them.

- exit 0: stdout may be a JSON object (below); any other stdout is plain text, which
  UserPromptSubmit and SessionStart add to the model's context.
- exit 2: a block. stderr is the reason (fed to the model, or shown, per event); stdout is
  ignored.
- any other exit, a timeout, a crash, a flood of output, stdout that starts like JSON but
  is not: a non-blocking error, reported to the user, never to the model, never a block.

The JSON object: `continue: false` (+ `stopReason`) ends the run; `suppressOutput`;
the older top-level `decision` (`approve`/`block`) and `reason`; and `hookSpecificOutput`
with `permissionDecision` (`allow`/`deny`/`ask`), `permissionDecisionReason`,
`updatedInput` (PreToolUse) and `additionalContext`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["BLOCK_EXIT", "HookOutput", "PermissionVerdict", "parse_json_output", "parse_output"]

BLOCK_EXIT = 2
"""The exit code that blocks (Claude Code's)."""

PermissionVerdict = Literal["allow", "deny", "ask"]

_MAX_TEXT = 10_000
"""Characters of a hook's reason or context kept for the model."""


@dataclass(frozen=True, slots=True)
class HookOutput:
    """One hook's answer, parsed. `error` set means it failed without blocking."""

    blocked: bool = False
    """Exit 2, or `decision: "block"` (or `"deny"`)."""
    reason: str | None = None
    """Why it blocked or decided (stderr on exit 2, else `reason` or
    `permissionDecisionReason`)."""
    permission: PermissionVerdict | None = None
    """PreToolUse's `permissionDecision` (or the older `decision: approve/block`)."""
    updated_input: dict[str, Any] | None = None
    context: str | None = None
    """`additionalContext`, or plain stdout on exit 0."""
    stop: bool = False
    """`continue: false`: the run ends (`hook_blocked`)."""
    stop_reason: str | None = None
    suppress_output: bool = False
    error: str | None = None
    """A non-blocking failure, for the user: a bad exit code, bad JSON, a timeout."""


def _text(value: object) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()[:_MAX_TEXT]
    return None


def parse_output(exit_code: int, stdout: str, stderr: str) -> HookOutput:
    """Read one finished hook (see the module docstring). Never raises."""
    if exit_code == BLOCK_EXIT:
        return HookOutput(
            blocked=True, reason=_text(stderr) or "a hook blocked this (exit 2, no message)"
        )
    if exit_code != 0:
        detail = _text(stderr) or _text(stdout) or "no output"
        return HookOutput(error=f"exited {exit_code}: {detail[:500]}")
    text = stdout.strip()
    if not text.startswith("{"):
        return HookOutput(context=_text(text))
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return HookOutput(error=f"printed output that is not valid JSON ({exc})")
    if not isinstance(data, dict):
        return HookOutput(error="printed JSON that is not an object")
    return parse_json_output(data)


def parse_json_output(data: dict[str, Any]) -> HookOutput:
    """The JSON object a hook answered with (a command's stdout, or an SDK host's hook
    callback). Never raises. `async: true` (the host runs the hook in the background) decides
    nothing."""
    if data.get("async") is True:
        return HookOutput()
    specific = data.get("hookSpecificOutput")
    if not isinstance(specific, dict):
        specific = {}
    permission: PermissionVerdict | None = None
    blocked = False
    reason = _text(data.get("reason"))
    match data.get("decision"):
        case "block":
            blocked = True
        case "approve":
            permission = "allow"
        case None:
            pass
        case other:
            return HookOutput(error=f"printed an unknown decision {str(other)[:40]!r}")
    match specific.get("permissionDecision"):
        case "allow" | "deny" | "ask" as verdict:
            permission = verdict
            reason = _text(specific.get("permissionDecisionReason")) or reason
        case None:
            pass
        case other:
            return HookOutput(error=f"printed an unknown permissionDecision {str(other)[:40]!r}")
    if blocked and permission is None:
        permission = "deny"
    updated = specific.get("updatedInput")
    if updated is not None and not isinstance(updated, dict):
        return HookOutput(error="printed an updatedInput that is not an object")
    stop = data.get("continue") is False
    return HookOutput(
        blocked=blocked,
        reason=reason,
        permission=permission,
        updated_input=updated,
        context=_text(specific.get("additionalContext")),
        stop=stop,
        stop_reason=_text(data.get("stopReason")) if stop else None,
        suppress_output=data.get("suppressOutput") is True,
    )
