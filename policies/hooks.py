"""The hook model every policy source maps to, validated here and run by the hooks layer.

Two sources declare hooks: Warren's `[[hooks]]` tables (`policies.files`) and Claude Code's
settings files (`policies.claude_settings`, their `hooks.{Event}[].hooks[]`). Both become the
same `Hook`, so the hooks layer (`orchestrator/hooks/`) reads one list
(`EffectivePolicy.hooks`, each hook with the file it came from) and never learns which format
a hook was written in, except where the two differ in meaning: the matcher.
`Hook.matcher_kind` says how to read `Hook.matcher`:

- `None` (Warren's `[[hooks]]`, the default): a permission rule in `Tool(specifier)` syntax
  when the text parses as one (`Bash(git push:*)` a command prefix, `Edit(src/**)` a path
  glob, `Edit` the tool, matched as the policy matches a call), else Claude Code's regex.
- `rule`: a rule, always (a text that is not one is an error).
- `regex` (every hook mapped from Claude Code's settings): Claude Code's matcher, tested
  against the tool name for PreToolUse/PostToolUse, the `source` for SessionStart
  (startup/resume/clear/compact) and the `trigger` for PreCompact (manual/auto), read as
  Claude Code reads it (`orchestrator/hooks/matchers.py`: a name or `Edit|Write` compares
  whole names, anything else is a regular expression searched in the value).

`None`, `""` and `"*"` as the matcher match everything.

A hook a source declares that Warren will not run (a `type: "prompt"` hook, an event Warren
does not have) is an `UnsupportedHook`: listed by `warren policy show` and `warren hooks
list`, never dropped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Final, Literal, get_args

from pydantic import Field, StrictBool, StrictStr, ValidationInfo, field_validator, model_validator

from policies.rules import RuleSyntaxError, parse_rule
from policies.sources import PolicyTable, Seconds

__all__ = [
    "HOOK_EVENTS",
    "MATCHER_EVENTS",
    "Hook",
    "HookEvent",
    "MatcherKind",
    "UnsupportedHook",
]

HookEvent = Literal[
    "PreToolUse",
    "PostToolUse",
    "UserPromptSubmit",
    "Stop",
    "SubagentStop",
    "SessionStart",
    "SessionEnd",
    "Notification",
    "PreCompact",
]
HOOK_EVENTS: Final[tuple[HookEvent, ...]] = get_args(HookEvent)
MatcherKind = Literal["rule", "regex"]
"""How `Hook.matcher` reads when a source says: a Warren permission rule, or Claude Code's
regex style (`Hook.matcher_kind`; None lets the text decide)."""

_TOOL_EVENTS: Final = frozenset({"PreToolUse", "PostToolUse"})
MATCHER_EVENTS: Final[frozenset[str]] = _TOOL_EVENTS | {"SessionStart", "PreCompact"}
"""Events whose hooks may have a matcher: a tool call, or SessionStart's `source` and
PreCompact's `trigger` (as Claude Code allows; it ignores the matcher of the others)."""


def _compiles(text: str) -> str | None:
    """None when `text` is a regular expression Python reads, else why not."""
    try:
        re.compile(text)
    except re.error as exc:
        return str(exc)
    except (RecursionError, OverflowError):
        return "too complex"
    return None


def _rule_error(text: str) -> str | None:
    try:
        parse_rule(text)
    except RuleSyntaxError as exc:
        return str(exc)
    return None


class Hook(PolicyTable):
    """A command run at an event: a `[[hooks]]` table, or one mapped from Claude Code's
    settings. Validated here, run by the hooks layer."""

    event: HookEvent
    command: Annotated[StrictStr, Field(min_length=1)]
    """Shell command line, run with the event as JSON on stdin."""
    matcher_kind: MatcherKind | None = None
    """How `matcher` reads (module docstring): None (default) a rule when it parses as one,
    else Claude Code's regex; `rule`; `regex` (Claude Code's style; every hook mapped from
    Claude Code's settings has it)."""
    matcher: StrictStr | None = None
    """Which calls (or SessionStart sources, PreCompact triggers) the hook is for; None, `""`
    or `*`: all of them. Only for `MATCHER_EVENTS`."""
    timeout_s: Seconds = 60.0
    """Seconds before the hook is killed. Default 60."""
    sandbox: StrictBool = True
    """Run under the floor (workspace as the tools have it, no network, secrets masked).
    Only a user or managed policy may set false; a repository's hooks always run sandboxed
    (`policies.files` refuses the file otherwise)."""

    @field_validator("matcher")
    @classmethod
    def _matcher_reads(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if text in ("", "*"):
            return text
        kind = info.data.get("matcher_kind")
        if kind == "regex":
            if problem := _compiles(value):
                raise ValueError(f"not a regular expression: {problem}")
            return value
        rule_problem = _rule_error(text)
        if rule_problem is None:
            return text
        if kind == "rule":
            raise ValueError(rule_problem)
        if _compiles(text) is not None:
            raise ValueError(f"neither a rule nor a regular expression: {rule_problem}")
        return text

    @model_validator(mode="after")
    def _matcher_for_its_events(self) -> Hook:
        if self.matcher is not None and self.event not in MATCHER_EVENTS:
            raise ValueError(
                "`matcher` only applies to PreToolUse, PostToolUse, SessionStart and "
                f"PreCompact hooks, not {self.event}"
            )
        if self.matcher_kind == "rule" and self.matcher and self.event not in _TOOL_EVENTS:
            raise ValueError(f"a rule `matcher` only applies to tool events, not {self.event}")
        return self


@dataclass(frozen=True)
class UnsupportedHook:
    """A hook a settings file declares that Warren does not run, with why."""

    event: str
    """The event as written (it may be one Warren does not have)."""
    matcher: str | None
    type: str
    """The hook's `type` as written: `prompt`, or `command` for an unsupported event."""
    text: str
    """Its command or prompt, for display."""
    reason: str
    """Why it does not run, for a reader: `type "prompt" hooks are not supported`."""
    source: str
    """The file."""
    key: str
    """Its JSON path in the file (`hooks.Stop[0].hooks[1]`)."""
