"""Workflow runs as people see them: each phase with its agents (running, done, failed,
tokens, cost) for `/workflows RUN_ID`, and one line per run for `/workflows`."""

from __future__ import annotations

from orchestrator.text import escape_controls
from orchestrator.workflows.engine import AgentRow, WorkflowEngine
from orchestrator.workflows.journal import RunRecord

__all__ = ["run_lines", "run_rows"]

_MARKS = {"waiting": "·", "running": "…", "done": "✓", "failed": "✗", "cached": "↺"}


def run_rows(runs: list[RunRecord], live: dict[str, WorkflowEngine]) -> list[str]:
    """One line per run: id, status, name, agents by state, tokens, cost."""
    rows = []
    for record in runs:
        engine = live.get(record.run_id)
        counts = ""
        if engine is not None:
            by = engine.counts()
            counts = " · " + ", ".join(f"{n} {s}" for s, n in sorted(by.items()))
            counts += f" · {engine.tokens} tokens · ${engine.cost_usd:.4f}"
        rows.append(
            escape_controls(
                f"{record.run_id}  {record.status:9}  {record.name}: {record.description}{counts}"
            )
        )
    return rows


def run_lines(record: RunRecord, engine: WorkflowEngine | None) -> list[str]:
    """A run phase by phase, each agent on a line of its own under its phase."""
    lines = [escape_controls(f"{record.run_id}  {record.name}  {record.status}")]
    if engine is None:
        if record.error:
            lines.append(escape_controls(f"  error: {record.error.splitlines()[-1]}"))
        return lines
    phases: dict[str | None, list[AgentRow]] = {p: [] for p in record.phases}
    for row in engine.rows.values():
        phases.setdefault(row.phase, []).append(row)
    for phase, rows in phases.items():
        current = " (now)" if phase is not None and phase == engine.phase_now else ""
        lines.append(escape_controls(f"  {phase or '(no phase)'}{current}"))
        for row in rows:
            cost = f" · {row.tokens} tokens · ${row.cost_usd:.4f}" if row.tokens else ""
            why = f" · {row.reason}" if row.reason and row.status == "failed" else ""
            lines.append(
                escape_controls(f"    {_MARKS[row.status]} [{row.key}] {row.label}{cost}{why}")
            )
    return lines
