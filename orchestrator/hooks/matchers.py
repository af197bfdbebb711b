"""Which calls (or sources, triggers) a hook's `matcher` selects.

A matcher is either a Warren rule, matched exactly as a deny rule is (`Bash(git push:*)` also
sees `git -C . push`; `Edit(src/**)` the lexical and resolved path; a bare `Edit` the whole
edit family), or Claude Code's: names separated by `|` matched whole (`Edit|Write` is never
`NotebookEdit`), anything else a regular expression searched in the name (`mcp__.*`). Which
one: the hook's `matcher_kind` when its source says (Claude Code's settings are `regex`),
else a rule when the text parses as one. Empty or `*`: every call. For SessionStart and
PreCompact the matcher is Claude Code's over `source` / `trigger` (`startup`,
`compact|resume`).

Claude Code calls its subagent tool `Task` (newer versions: `Agent`); Warren's is
`dispatch_agent`. So existing settings keep working, a matcher naming `Task` or `Agent`
selects `dispatch_agent` calls: as a rule (`Task`, `Task(reviewer)` read as
`dispatch_agent(...)`) and in Claude Code's reading (`Task|Bash`, `^Agent$`), where
`dispatch_agent` is tried under all three names (tests/orchestrator/test_hooks.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.calls.plan import CallPlan
from policies.claude_names import CLAUDE_SUBAGENT_TOOLS, SUBAGENT_TOOL, warren_rule
from policies.engine import CallAssessment, PolicyEngine
from policies.rules import CompiledRule, ParsedRule, RuleSyntaxError, parse_rule

__all__ = ["HookMatcher", "build_matcher", "claude_matches"]

_NAMES = re.compile(r"[A-Za-z0-9_|]+")


def _names_of(tool: str) -> tuple[str, ...]:
    """The names a Claude Code matcher may know a tool by."""
    if tool == SUBAGENT_TOOL:
        return (tool, *CLAUDE_SUBAGENT_TOOLS)
    return (tool,)


def claude_matches(matcher: str, value: str) -> bool:
    """Claude Code's reading of a matcher: `a|b` lists whole names, anything else is a
    regular expression searched in `value`; one that does not compile matches nothing."""
    if _NAMES.fullmatch(matcher):
        return value in (name.strip() for name in matcher.split("|"))
    try:
        return re.search(matcher, value) is not None
    except (re.error, RecursionError, OverflowError):
        return False


@dataclass(frozen=True, slots=True)
class HookMatcher:
    text: str
    rule: ParsedRule | None = None
    compiled: CompiledRule | None = None
    engine: PolicyEngine | None = None
    regex: bool = False
    """Claude Code's reading (`claude_matches`)."""

    @property
    def everything(self) -> bool:
        return self.text in ("", "*")

    def matches_call(self, plan: CallPlan) -> bool:
        """Does the hook apply to this call? A plan that failed before it was parsed is
        matched by tool name only."""
        if self.everything:
            return True
        name = plan.block.name
        if self.regex or self.rule is None:
            return any(claude_matches(self.text, alias) for alias in _names_of(name))
        if self.compiled is None or self.engine is None or plan.tool is None:
            return self.rule.kind in ("tool", "mcp_server") and name == self.rule.tool
        return self.engine.rule_matches(self.compiled, _assessment(self.engine, plan))

    def matches_name(self, value: str) -> bool:
        """SessionStart's `source`, PreCompact's `trigger`."""
        return self.everything or claude_matches(self.text, value)


def _assessment(engine: PolicyEngine, plan: CallPlan) -> CallAssessment:
    detail = None if plan.verdict is None else plan.verdict.detail
    if isinstance(detail, CallAssessment):
        return detail
    tool, input = plan.runnable()
    raw: dict[str, Any] = input.model_dump(mode="json", by_alias=True, exclude_none=True)
    return engine.assess(tool.name, raw, tool_read_only=plan.read_only, facts=tool.facts)


def build_matcher(
    text: str | None,
    *,
    kind: Literal["rule", "regex"] | None = None,
    engine: PolicyEngine | None = None,
    anchor: Path | None = None,
) -> HookMatcher:
    """Compile a hook's matcher once (the policy loader already checked it). `kind`: how
    its source says to read it (None: a rule when it parses as one). `engine` binds path
    rules to the workspace and `anchor`, the directory of the file the hook comes from."""
    text = (text or "").strip()
    if text in ("", "*") or kind == "regex":
        return HookMatcher(text, regex=kind == "regex")
    # Claude Code's name for the subagent tool, as a rule: `Task(reviewer)`.
    rule_text = warren_rule(text)
    try:
        parsed = parse_rule(rule_text)
    except RuleSyntaxError:
        return HookMatcher(text, regex=True)
    compiled = None
    if engine is not None:
        compiled = engine.compile_matcher(parsed, anchor=anchor or engine.workspace)
    return HookMatcher(text, rule=parsed, compiled=compiled, engine=engine)
