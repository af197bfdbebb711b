"""`CallPlan`: everything decided about one tool call, worked out once and then only read.

The pipeline builds a plan for each `tool_use` in its prepare step (while the message still
streams): the tool, the validated input, the facts the tool declares, the read-only verdict
with its reason, concurrency safety and the sandbox mode it implies. Once the permission
function and the asker have spoken, the plan carries their decision with its rule and
source. The executor schedules by the plan, the runner picks the sandbox by it, the audit log
records it: nobody classifies the call again (tests/orchestrator/test_plan.py counts the
analyser's calls).

The verdict comes from an `Assessor`, the one place a call is classified. Warren's sessions
use the policy's (`SessionPolicy.assessor`: the Bash analyser for shell commands, the tool's
own `is_read_only` for the rest); `tool_assessor` asks only the tool (tests, embedders).

The sandbox rule (DESIGN.md, "The floor and what it buys"): a call whose verdict is read-only
always runs with the workspace read-only (`ro`); any other call runs read-write (`rw`), which
the pipeline allows only after an allow rule, the mode, or a user's yes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from orchestrator.messages import ToolUseBlock
from orchestrator.tools.base import Tool, ToolInput
from policies.facts import ToolFacts

__all__ = [
    "Assessor",
    "CallPlan",
    "PlanDecision",
    "SandboxMode",
    "Verdict",
    "plan_call",
    "tool_assessor",
]

SandboxMode = Literal["ro", "rw"]
"""`ro`: the workspace mounted read-only (the kernel enforces the verdict); `rw`: writable."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a call can change anything, and why: made once per call by an `Assessor`."""

    read_only: bool
    """Proven unable to write (Bash: every part a catalogued read-only command)."""
    reason: str
    """Why, for the audit log and the user."""
    concurrency_safe: bool
    """May run alongside other safe calls (DESIGN.md, loop contract 3)."""
    detail: object | None = None
    """What the assessor worked out (the policy's `CallAssessment`), handed back to the
    permission function with the plan so it decides without classifying again."""


Assessor = Callable[[Tool[Any], ToolInput], Verdict]
"""Classifies one call. Must not raise for any parsed input; must be cheap (it runs while
the model's message streams)."""


def tool_assessor(tool: Tool[Any], input: ToolInput) -> Verdict:
    """The tool's own word (`is_read_only`, `is_concurrency_safe`); a check that raises means
    "may write"."""
    try:
        read_only = tool.is_read_only(input)
    except Exception:
        return Verdict(False, "the tool's read-only check failed", False)
    try:
        safe = tool.is_concurrency_safe(input)
    except Exception:
        safe = False
    reason = "the tool reads only" if read_only else "the tool may change files"
    return Verdict(read_only, reason, safe)


@dataclass(frozen=True, slots=True)
class PlanDecision:
    """The permission decision a plan carries, as the audit log records it."""

    decision: Literal["allow", "deny", "ask"]
    rule: str | None
    """The rule or built-in label that decided, with its source (`Bash(make) [policy.toml]`)."""
    answered_by: Literal["policy", "asker", "hook"]
    """`policy`: the permission function; `asker`: the user (or the headless deny); `hook`:
    a PreToolUse hook."""
    message: str | None = None
    """Deny: the message for the model; ask: the reason shown to the user."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    """One tool_use, prepared: either ready to run or already failed (`error`)."""

    block: ToolUseBlock
    tool: Tool[Any] | None
    input: ToolInput | None
    """The schema-validated input (after a permission function's rewrite, the rewritten one)."""
    error: str | None
    """The tool_result text of a call that failed before it could run."""
    verdict: Verdict | None = None
    """None exactly when the call failed before it was classified."""
    decision: PlanDecision | None = None
    """Set once permission is decided (the last word: the asker's, when it was asked)."""

    @property
    def facts(self) -> ToolFacts | None:
        return None if self.tool is None else self.tool.facts

    @property
    def read_only(self) -> bool:
        return self.verdict is not None and self.verdict.read_only

    @property
    def concurrency_safe(self) -> bool:
        # A call that already failed touches nothing, so it never holds others back.
        return self.verdict is None or self.verdict.concurrency_safe

    @property
    def sandbox(self) -> SandboxMode:
        """Which sandbox runs it: read-only exactly when the verdict says read-only."""
        return "ro" if self.read_only else "rw"

    @property
    def runs_in_coordinator(self) -> bool:
        facts = self.facts
        return facts is not None and facts.runs_in_coordinator

    def decided(self, decision: PlanDecision) -> CallPlan:
        return replace(self, decision=decision)

    def runnable(self) -> tuple[Tool[Any], ToolInput]:
        """The tool and input of a plan that did not fail (runners are handed only those)."""
        if self.tool is None or self.input is None:
            raise ValueError(f"the plan of {self.block.name} failed: {self.error}")
        return self.tool, self.input


def plan_call(
    block: ToolUseBlock, tool: Tool[Any], input: ToolInput, assessor: Assessor
) -> CallPlan:
    """A runnable plan: `input` classified once by `assessor` (which is not to raise; if it
    does, the call is taken as one that may write)."""
    try:
        verdict = assessor(tool, input)
    except Exception as exc:
        verdict = Verdict(False, f"the read-only check failed ({exc})", False)
    return CallPlan(block, tool, input, None, verdict)
