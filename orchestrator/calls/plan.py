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
the pipeline allows only after an allow rule, the mode, or a user's yes; a writer confined to
a write scope (`dispatch_agent` with `write_paths`) runs `scoped`: the workspace read-only but
for the scope's directories.

Scheduling (`may_overlap`, read by the executor): two concurrency-safe calls never overlap; a
scoped writer overlaps another scoped writer only when their scopes share a path, and a
read-only file tool only when one of its paths lies in the scope (resolved, by whole parts);
everything else (Bash, unscoped writers, read-only dispatches, tools without paths) overlaps
every writer, so those keep the serial order of the loop contract.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
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
    "may_overlap",
    "plan_call",
    "tool_assessor",
]

SandboxMode = Literal["ro", "rw", "scoped"]
"""`ro`: the workspace mounted read-only (the kernel enforces the verdict); `rw`: writable;
`scoped`: read-only but for the call's write scope."""


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
    write_scope: tuple[Path, ...] | None = None
    """A writer confined to these directories (absolute, normalised; `Tool.write_scope`);
    None: not a scoped writer."""
    reads: tuple[Path, ...] | None = None
    """The resolved paths a read-only file tool reads (its `path_fields`, or the workspace);
    None: not known (any other call)."""

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
        if self.read_only:
            return "ro"
        return "rw" if self.write_scope is None else "scoped"

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
    block: ToolUseBlock,
    tool: Tool[Any],
    input: ToolInput,
    assessor: Assessor,
    *,
    workspace: Path | None = None,
) -> CallPlan:
    """A runnable plan: `input` classified once by `assessor` (which is not to raise; if it
    does, the call is taken as one that may write). With `workspace` (the pipeline's), a
    writer's scope and a reader's paths are worked out too, for the scheduler."""
    try:
        verdict = assessor(tool, input)
    except Exception as exc:
        verdict = Verdict(False, f"the read-only check failed ({exc})", False)
    scope = reads = None
    if workspace is not None:
        if verdict.read_only:
            reads = _read_paths(tool, input, workspace)
        else:
            try:
                scope = tool.write_scope(input, workspace)
            except Exception:
                scope = None  # scheduled like any writer
    return CallPlan(block, tool, input, None, verdict, write_scope=scope, reads=reads)


def _read_paths(tool: Tool[Any], input: ToolInput, workspace: Path) -> tuple[Path, ...] | None:
    """What a read-only file tool reads, resolved (links followed: a link into a scope is
    inside it); None for any other tool, whose reads are unknown."""
    facts = tool.facts
    if facts.family != "read" or facts.command_field is not None:
        return None
    given = [v for f in facts.path_fields if isinstance(v := getattr(input, f, None), str) and v]
    if not given:
        if not facts.path_defaults_to_workspace:
            return None
        given = [str(workspace)]
    # Any other absolute string (a Glob pattern `/repo/src/**`) may name what it reads too.
    given += [
        v
        for name, v in input
        if name not in facts.path_fields and isinstance(v, str) and v.startswith("/")
    ]
    try:
        return tuple(Path(os.path.realpath(workspace / _static_prefix(v))) for v in given)
    except (OSError, ValueError):
        return None


def _static_prefix(path: str) -> str:
    """The part of a path before its first glob character (`/repo/src/**` -> `/repo/src/`)."""
    cut = min((i for i, c in enumerate(path) if c in "*?[{"), default=len(path))
    return path[:cut] or "."


def may_overlap(earlier: CallPlan, later: CallPlan) -> bool:
    """Whether `later` must wait for `earlier` (module docstring, "Scheduling")."""
    if earlier.concurrency_safe and later.concurrency_safe:
        return False
    a, b = earlier.write_scope, later.write_scope
    if a is not None and b is not None:
        return any(_overlaps(x, y) for x in a for y in b)
    for scope, other in ((a, later), (b, earlier)):
        if scope is not None and other.concurrency_safe:
            if other.error is not None:
                return False  # failed before it could run: it touches nothing
            reads = other.reads
            return reads is None or any(_overlaps(r, s) for r in reads for s in scope)
    return True


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)
