"""Denied tool calls: collected from a run's permission decisions, reported when it ends.

A run in which calls were denied must never look like success (issue 13: every edit denied,
the model said "Renamed ... in 3 files", exit 0, nothing changed). The session collects every
denial of a run, the main agent's and its subagents', into `RunResult.permission_denials`;
the json and stream-json result carry them in Claude Code's shape (`permission_denials`), text
mode lists them on stderr with how to allow each (`render_denials`), and `--fail-on-denial`
ends such a run `permission_denied` (exit 7).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.events import Event, PermissionDecided
from orchestrator.text import escape_controls

__all__ = ["DenialLog", "PermissionDenial", "allow_rule", "render_denials"]

HEADLESS_RULE = "headless: ask becomes deny"
"""The rule `permissions.headless_asker` names: the call asked and nobody could answer."""

_SHOWN_FIELDS = ("command", "file_path", "notebook_path", "path", "pattern", "description", "url")
"""The input field that says best what a call would have done, first present wins."""


@dataclass(frozen=True)
class PermissionDenial:
    """One call that was not run because permission was denied."""

    tool_name: str
    tool_use_id: str
    tool_input: dict[str, Any]
    rule: str | None
    """The rule that denied, as the pipeline reports it (`Bash(rm:*) [/ws/.warren/policy.toml]`,
    `headless: ask becomes deny`, `user: no`, `plan mode [mode]`, a hook's rule)."""
    answered_by: Literal["policy", "asker", "hook"]
    message: str | None
    """What the model was told."""
    asked_by: str | None = None
    """When the denial answers a question: the rule that asked (`no rule [...]` when nothing
    matched); an ask rule beats any allow rule, so the advice differs."""
    agent_id: str | None = None
    """The subagent that made the call; None for the main agent."""

    def record(self) -> dict[str, Any]:
        """Claude Code's `permission_denials` entry (a subagent's also names its agent)."""
        entry = {
            "tool_name": self.tool_name,
            "tool_use_id": self.tool_use_id,
            "tool_input": self.tool_input,
        }
        return entry if self.agent_id is None else {**entry, "agent_id": self.agent_id}


@dataclass
class DenialLog:
    """An event sink keeping the denials of the current run (`take` hands them over)."""

    _denials: list[PermissionDenial] = field(default_factory=list)
    _asks: dict[tuple[str | None, str], str] = field(default_factory=dict)

    def __call__(self, event: Event, agent_id: str | None = None) -> None:
        if not isinstance(event, PermissionDecided):
            return
        key = (agent_id, event.tool_use_id)
        match event.decision:
            case "ask":
                self._asks[key] = event.rule or "no rule"
            case "deny":
                self._denials.append(
                    PermissionDenial(
                        tool_name=event.tool,
                        tool_use_id=event.tool_use_id,
                        tool_input=dict(event.input),
                        rule=event.rule,
                        answered_by=event.answered_by,
                        message=event.message,
                        asked_by=self._asks.pop(key, None),
                        agent_id=agent_id,
                    )
                )
            case "allow":
                self._asks.pop(key, None)

    def take(self) -> tuple[PermissionDenial, ...]:
        """The denials since the last `take`, in the order they were decided."""
        denials, self._denials = tuple(self._denials), []
        self._asks.clear()
        return denials


def allow_rule(denial: PermissionDenial) -> str | None:
    """The rule that would let this call run (`--allowed-tools RULE` or `allow = [RULE]`), or
    None when no allow rule can (a deny rule, an ask rule, plan mode, a hook, the user's no).

    Bash gets the analyser's suggestion: a prefix rule for one plain command, else the exact
    command (the same rule a "don't ask again" answer stores); other tools their name."""
    if denial.answered_by == "hook":
        return None
    rule = denial.rule or ""
    headless = rule == HEADLESS_RULE or rule.startswith("dont-ask mode")
    if not headless or not (denial.asked_by or "no rule").startswith("no rule"):
        return None
    command = denial.tool_input.get("command")
    if denial.tool_name == "Bash" and isinstance(command, str):
        from policies.bash_analysis import suggest_rule

        try:
            return suggest_rule(command)
        except Exception:  # the analyser refuses what it cannot parse: no advice then
            return None
    return denial.tool_name


def _why(denial: PermissionDenial) -> str:
    rule = denial.rule or "no rule"
    if denial.answered_by == "hook":
        return f"a PreToolUse hook denied it ({rule})"
    if rule.startswith("user:"):
        return "you answered no"
    if rule == HEADLESS_RULE or rule.startswith("dont-ask mode"):
        asked = denial.asked_by or "no rule"
        if not asked.startswith("no rule"):
            return (
                f"the rule {asked} asks for it (an ask rule beats allow rules); run it where "
                "you can answer, or change that rule"
            )
        return "it needs permission and nobody could answer"
    if rule.startswith("plan mode"):
        return "plan mode runs read-only tools only"
    return f"denied by {rule}; a deny rule wins over every allow rule"


def _call(denial: PermissionDenial) -> str:
    shown = next(
        (
            value
            for name in _SHOWN_FIELDS
            if isinstance(value := denial.tool_input.get(name), str) and value
        ),
        "",
    )
    shown = " ".join(shown.split())
    if len(shown) > 100:
        shown = shown[:99] + "…"
    who = f"[{denial.agent_id}] " if denial.agent_id else ""
    return f"{who}{denial.tool_name} {shown}".rstrip()


def render_denials(denials: tuple[PermissionDenial, ...]) -> list[str]:
    """The lines text mode ends with on stderr: each denied call, why, and how to allow it.

    Every string from the model or a policy file is escaped (`escape_controls`)."""
    if not denials:
        return []
    count = f"{len(denials)} tool call{'s were' if len(denials) > 1 else ' was'} denied"
    lines = [f"warren: {count}; what {'they' if len(denials) > 1 else 'it'} would have done "
             "did not happen:"]  # fmt: skip
    rules: list[str] = []
    for denial in denials:
        lines.append(f"  x {escape_controls(_call(denial))}: {escape_controls(_why(denial))}")
        rule = allow_rule(denial)
        if rule is not None and rule not in rules:
            rules.append(rule)
    if rules:
        flags = " ".join(f"--allowed-tools {shlex.quote(rule)}" for rule in rules)
        listed = ", ".join(f'"{_toml_escape(rule)}"' for rule in rules)
        lines.append(f"  allow {'them' if len(rules) > 1 else 'it'}: warren -p ... {flags}")
        lines.append(f"    or in .warren/policy.local.toml: [permissions] allow = [{listed}]")
        lines[-2:] = [escape_controls(line) for line in lines[-2:]]
    return lines


def _toml_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
