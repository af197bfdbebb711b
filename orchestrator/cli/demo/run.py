"""`warren demo`: a scripted multi-file refactor on a generated repository, end to end.

Offline and deterministic: the model is the scripted client replaying `session.json`, but
everything else is the real path of `warren -p`: the floor is probed, three read-only
subagents survey the repository in parallel in their own sandboxed worker processes, every
tool call of the main agent runs in a sandboxed tool host, the policy engine decides each call,
the sample's tests run in the persistent shell, and the transcript is written.

`warren demo --parallel-writers` (`parallel_writers.json`) does the rename with writers
instead: the main agent renames the definition, then dispatches three `renamer` subagents in
one message, each with `write_paths` set to its package (only that directory is writable in
its sandbox), which the scheduler runs at once; then the tests run in the sandbox. The
`renamer` type is the demo's own, in a private config directory (so the user's policy file is
not read for this demo; its permissions are the ones printed).

`warren demo --workflow` (`workflow.json`) does it with a workflow (orchestrator/workflows/):
the main agent renames the definition and starts a `Workflow` script whose first phase runs the
three scoped `renamer` writers at once and whose second runs an agent that runs the tests and
reports `{"passed": ..., "summary": ...}` through `StructuredOutput`; the script runs in its
own sandbox, and the main agent gets one notification with the workflow's result.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import trio

from orchestrator.agents.types import (
    SubagentFinished,
    SubagentOutcome,
    SubagentStarted,
    SubagentUpdate,
)
from orchestrator.claude_code.output import ProgressPrinter
from orchestrator.cli.demo.sample_repo import generate
from orchestrator.conversation.loop import RunResult
from orchestrator.events import (
    AssistantTurn,
    CallScheduled,
    Event,
    PermissionDecided,
    TaskChanged,
    ToolStarted,
    WorkflowChanged,
)
from orchestrator.outcome import exit_code
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session

__all__ = ["demo_main"]

HERE = Path(__file__).parent
PROMPT = (
    "The test suite fails with an ImportError: the tests expect shop.money.round_money. "
    "Rename legacy_round to round_money across the code base and run the tests."
)
RENAMER = """\
---
name: renamer
description: Renames a symbol in the package it is given, and reports the files it changed.
tools: Read, Grep, Glob, Edit
writable: true
max_turns: 10
---
You rename symbols. Read each file before you edit it; change only what you are asked to.
"""
"""The `--parallel-writers` demo's writer type (written to its private config directory)."""


@dataclass
class _Timeline:
    """What the summary reports: phases (one per model turn), tool calls, agents, decisions."""

    started: float = field(default_factory=time.monotonic)
    spans: dict[str, list[float]] = field(default_factory=dict)
    """Each subagent's [start, end] (`time.monotonic()`), to show which ran at once."""
    scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The write scope of each scoped writer call, by tool_use id."""
    phases: list[tuple[str, float]] = field(default_factory=list)
    """(the tools the turn's calls used, its wall time from the previous turn's end)."""
    _turn_tools: Counter[str] = field(default_factory=Counter)
    _last: float = field(default_factory=time.monotonic)
    decisions: Counter[str] = field(default_factory=Counter)
    agents: list[SubagentOutcome] = field(default_factory=list)
    workflow_phases: list[str] = field(default_factory=list)
    """The phases a workflow entered, in order (`--workflow`)."""
    workflow_end: str | None = None
    """How the workflow ended (its task's summary)."""

    def __call__(self, event: Event) -> None:
        match event:
            case ToolStarted(tool=tool):
                self._turn_tools[tool] += 1
            case AssistantTurn():
                self._close_phase()
            case PermissionDecided(decision=decision, rule=rule):
                self.decisions[f"{decision}: {rule}"] += 1
            case CallScheduled(tool_use_id=call, write_scope=scope) if scope is not None:
                self.scopes[call] = scope
            case WorkflowChanged(what="phase", text=title):
                self.workflow_phases.append(title)
            case TaskChanged(phase="ended", kind="workflow", summary=summary):
                self.workflow_end = summary
            case _:
                pass

    def subagent(self, update: SubagentUpdate) -> None:
        if isinstance(update, SubagentStarted):
            self.spans[update.agent_id] = [time.monotonic(), math.inf]
        elif isinstance(update, SubagentFinished):
            self.agents.append(update.outcome)
            self.spans.setdefault(update.outcome.agent_id, [0.0, 0.0])[1] = time.monotonic()

    def at_once(self) -> bool:
        """Whether every subagent was running at one moment."""
        spans = list(self.spans.values())
        return len(spans) > 1 and max(s[0] for s in spans) < min(s[1] for s in spans)

    def _close_phase(self) -> None:
        now = time.monotonic()
        label = ", ".join(f"{n} x {tool}" for tool, n in self._turn_tools.items()) or "answer"
        if self.phases or self._turn_tools:
            self.phases.append((label, now - self._last))
        self._turn_tools.clear()
        self._last = now

    def finish(self) -> None:
        if self._turn_tools:
            self._close_phase()


def _git_init(workspace: Path) -> None:
    git = shutil.which("git")
    if git is None:
        return
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        [
            "-c",
            "user.name=demo",
            "-c",
            "user.email=demo@example.invalid",
            "commit",
            "-q",
            "-m",
            "sample",
        ],
    ):
        subprocess.run([git, *args], cwd=workspace, check=False, capture_output=True)


def demo_main(
    *,
    keep: bool = False,
    verbose: bool = False,
    parts: SessionParts | None = None,
    parallel_writers: bool = False,
    workflow: bool = False,
) -> int:
    """Run the demo. `parts` are the sandboxed tool hosts, worker pool and broker (the CLI
    passes them); without tool hosts, tools run unsandboxed and nothing is dispatched.
    `parallel_writers`: the rename by three scoped writers at once; `workflow`: the same by
    a workflow (module docstring)."""
    parts = parts or SessionParts()
    root = Path(tempfile.mkdtemp(prefix="warren-demo-"))
    script, allowed = HERE / "session.json", ["Bash(python -m unittest:*)"]
    if parallel_writers or workflow:
        script = HERE / ("workflow.json" if workflow else "parallel_writers.json")
        allowed.append("dispatch_agent(renamer)")
        if workflow:
            allowed.append("Workflow")
        config_dir = root / "config" / "warren"
        (config_dir / "agents").mkdir(parents=True)
        (config_dir / "agents" / "renamer.md").write_text(RENAMER, encoding="utf-8")
        dirs = parts.dirs or WarrenDirs.from_env()
        parts = dataclasses.replace(parts, dirs=dataclasses.replace(dirs, config=config_dir))
    workspace = generate(root / "shop")
    _git_init(workspace)
    out = sys.stdout
    files = sum(1 for _ in workspace.rglob("*.py"))
    floor = "bubblewrap floor (tool hosts and subagent workers)" if parts.runner else "OFF"
    out.write(
        "Warren demo (offline: a scripted model; real sandboxes, tools and policy)\n"
        f"  workspace: {workspace} ({files} Python files, generated)\n"
        "  permissions: --permission-mode accept-edits --allowed-tools "
        f"{' '.join(repr(rule) for rule in allowed)}\n"
        f"  sandbox: {floor}\n"
        f"  prompt: {PROMPT}\n\n"
    )
    timeline = _Timeline()
    config = SessionConfig(
        cwd=workspace,
        model=f"scripted:{script}",
        permission_mode="accept-edits",
        allowed_tools=frozenset(allowed),
        verbose=verbose,
        sandbox="required" if parts.runner is not None else "off",
    )

    async def run() -> tuple[RunResult, Path]:
        async with open_session(config, demo_parts) as session:
            return await session.run(PROMPT), session.transcript.path

    try:
        with open("/dev/null", "w") as discard:  # the final text is in the summary
            demo_parts = dataclasses.replace(
                parts,
                stdout=discard,
                extra_sinks=(*parts.extra_sinks, ProgressPrinter(out, show_text=True), timeline),
                on_subagent=timeline.subagent,
            )
            result, transcript = trio.run(run)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    timeline.finish()
    _summary(out, result.reason, result.num_turns, timeline, transcript)
    if keep:
        out.write(f"  workspace kept: {workspace}\n")
    if result.reason != "completed":
        out.write(f"\nThe demo did not complete: {result.result}\n")
    return exit_code(result.reason)


def _summary(out: IO[str], reason: str, turns: int, timeline: _Timeline, transcript: Path) -> None:
    wall = time.monotonic() - timeline.started
    out.write(f"\nSummary\n  outcome: {reason} after {turns} turns in {wall:.2f} s\n")
    out.write("  phases (wall time per model turn and the tools it ran):\n")
    for label, seconds in timeline.phases:
        out.write(f"    {seconds * 1000:7.0f} ms  {label}\n")
    if timeline.workflow_phases:
        out.write(f"  workflow phases: {' -> '.join(timeline.workflow_phases)}\n")
        if timeline.workflow_end:
            out.write(f"  workflow: {timeline.workflow_end}\n")
    if timeline.agents:
        out.write(f"  subagents: {len(timeline.agents)}, each in its own sandboxed worker\n")
        if timeline.scopes:
            scopes = "; ".join(", ".join(scope) for scope in timeline.scopes.values())
            out.write(
                f"  scoped writers: {len(timeline.scopes)}, each writable only in: {scopes}; "
                f"{'all running at once' if timeline.at_once() else 'NOT at once'}\n"
            )
        for agent in timeline.agents:
            out.write(
                f"    {agent.agent_id}: {agent.reason} in {agent.num_turns} turns, "
                f"{agent.duration_s * 1000:.0f} ms, worker pid {agent.worker_pid}\n"
            )
    out.write("  policy decisions:\n")
    for decision, count in sorted(timeline.decisions.items()):
        out.write(f"    {count} x {decision}\n")
    out.write(f"  transcript: {transcript}\n")
