"""A finished dispatch as values, for Warren's own callers: `DispatchAgentTool.take_outcome`.

The model reads a dispatch's tool_result; Warren's own callers (the workflow engine's
`agent()`) need what that text says without parsing it: which agent ran, its final text, its
structured value (orchestrator/agents/structured.py), what it cost, the files a scoped writer
changed, and why it failed when it did. `dispatch_agent` keeps one `DispatchOutcome` per
foreground dispatch, failed or not, under the pipeline's tool_use_id (`CURRENT_TOOL_USE_ID`),
in an `UntakenOutcomes`: taken once, and bounded, so a session whose callers never take them
does not grow (the oldest is dropped past `MAX_UNTAKEN_OUTCOMES`).

A dispatch refused before it started (its `validate`: an unknown type, a bad `output_schema`)
has no outcome: its tool_result says why, and `take_outcome` gives None.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.agents.types import SubagentReason
from orchestrator.calls.scopes import FileChange
from orchestrator.messages import Usage

__all__ = ["MAX_UNTAKEN_OUTCOMES", "MISSING", "DispatchOutcome", "Missing", "UntakenOutcomes"]

MAX_UNTAKEN_OUTCOMES = 1000
"""Outcomes a session keeps that nobody took; past it the oldest is dropped."""


class Missing(enum.Enum):
    """The type of `MISSING`: no structured value (distinct from any JSON value, `None`
    included)."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = Missing.MISSING
"""`DispatchOutcome.value` of a dispatch without `output_schema`, or one that gave no valid
value."""


@dataclass(frozen=True)
class DispatchOutcome:
    """How one foreground dispatch ended (one run, or two when its agent was continued for
    its structured output)."""

    agent_id: str
    agent_type: str
    """Its agent type's name (`subagent_type`)."""
    text: str
    """The agent's final text (its last run's), or the sentence saying what happened to it;
    empty when it never ran."""
    value: dict[str, Any] | Missing = MISSING
    """The structured output of a dispatch with `output_schema`: the first StructuredOutput
    input that matched the schema. MISSING: no schema, or no valid value (`failed` says why)."""
    reason: SubagentReason | None = None
    """How its last run ended; None: no run ended (it failed before, `failed` says why)."""
    runs: int = 0
    """Runs of the agent: 1, or 2 when it was continued once for its structured output."""
    usage: Usage = field(default_factory=Usage)
    """Tokens of all its runs' model requests."""
    cost_usd: float | None = None
    """What its runs cost, as the model client priced them; None: no run ended."""
    changes: tuple[FileChange, ...] = ()
    """The files a scoped writer changed (sha256 before and after, measured on disk by the
    coordinator); empty for any other agent."""
    failed: str | None = None
    """Why the dispatch failed: the text of its error tool_result. None: it succeeded."""

    @property
    def has_value(self) -> bool:
        return self.value is not MISSING


class UntakenOutcomes:
    """Outcomes by tool_use_id until taken; at most `limit`, the oldest dropped first."""

    def __init__(self, limit: int = MAX_UNTAKEN_OUTCOMES) -> None:
        self._limit = limit
        self._kept: dict[str, DispatchOutcome] = {}

    def put(self, tool_use_id: str, outcome: DispatchOutcome) -> None:
        self._kept.pop(tool_use_id, None)  # a reused id: the newer outcome, at the end
        self._kept[tool_use_id] = outcome
        while len(self._kept) > self._limit:
            del self._kept[next(iter(self._kept))]

    def take(self, tool_use_id: str) -> DispatchOutcome | None:
        return self._kept.pop(tool_use_id, None)

    def __len__(self) -> int:
        return len(self._kept)
