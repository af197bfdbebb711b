"""Which calls (or sources, triggers) a hook's `matcher` selects.

A matcher is either a Warren rule, matched exactly as a deny rule is (`Bash(git push:*)` also
sees `git -C . push`; `Edit(src/**)` the lexical and resolved path; a bare `Edit` the whole
edit family), or, when it does not parse as a rule, a regular expression over the tool name
as Claude Code writes them (`Edit|Write`, `mcp__.*`), matched in full. Empty or `*`: every
call. For SessionStart and PreCompact the matcher is a regular expression over `source` /
`trigger` (`startup`, `compact|resume`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.plan import CallPlan
from policies.engine import CallAssessment, PolicyEngine
from policies.rules import CompiledRule, ParsedRule, RuleSyntaxError, parse_rule

__all__ = ["HookMatcher", "build_matcher"]


@dataclass(frozen=True, slots=True)
class HookMatcher:
    text: str
    rule: ParsedRule | None = None
    compiled: CompiledRule | None = None
    engine: PolicyEngine | None = None
    regex: re.Pattern[str] | None = None

    @property
    def everything(self) -> bool:
        return self.rule is None and self.regex is None

    def matches_call(self, plan: CallPlan) -> bool:
        """Does the hook apply to this call? A plan that failed before it was parsed is
        matched by tool name only."""
        if self.everything:
            return True
        name = plan.block.name
        if self.regex is not None:
            return self.regex.fullmatch(name) is not None
        assert self.rule is not None
        if self.compiled is None or self.engine is None or plan.tool is None:
            return self.rule.kind in ("tool", "mcp_server") and name == self.rule.tool
        return self.engine.rule_matches(self.compiled, _assessment(self.engine, plan))

    def matches_name(self, value: str) -> bool:
        """SessionStart's `source`, PreCompact's `trigger`."""
        if self.everything:
            return True
        return re.fullmatch(self.text, value) is not None


def _assessment(engine: PolicyEngine, plan: CallPlan) -> CallAssessment:
    detail = None if plan.verdict is None else plan.verdict.detail
    if isinstance(detail, CallAssessment):
        return detail
    tool, input = plan.runnable()
    raw: dict[str, Any] = input.model_dump(mode="json", by_alias=True, exclude_none=True)
    return engine.assess(tool.name, raw, tool_read_only=plan.read_only, facts=tool.facts)


def build_matcher(
    text: str | None, *, engine: PolicyEngine | None = None, anchor: Path | None = None
) -> HookMatcher:
    """Compile a hook's matcher once (the policy loader already checked that it is a rule
    or a regular expression). `engine` binds path rules to the workspace and `anchor`, the
    directory of the file the hook comes from."""
    text = (text or "").strip()
    if text in ("", "*"):
        return HookMatcher(text)
    try:
        parsed = parse_rule(text)
    except RuleSyntaxError:
        return HookMatcher(text, regex=re.compile(text))
    compiled = None
    if engine is not None:
        compiled = engine.compile_matcher(parsed, anchor=anchor or engine.workspace)
    return HookMatcher(text, rule=parsed, compiled=compiled, engine=engine)
