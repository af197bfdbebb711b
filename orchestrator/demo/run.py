"""`warren demo`: run a scripted session end to end on a copy of the bundled sample repository.

Offline and deterministic: the model is the scripted client replaying `session.json`, but
everything else is the real path of `warren -p` — the loop, streaming tool execution, the real
tools on real files, the persistent shell running the sample's tests, the transcript.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import trio

from orchestrator.events import Event, PermissionDecided, ToolFinished, ToolStarted
from orchestrator.headless import HeadlessOptions, RunnerFactory, run_headless
from orchestrator.outcome import exit_code
from orchestrator.output import ProgressPrinter

__all__ = ["demo_main"]

HERE = Path(__file__).parent
PROMPT = (
    "The test suite of this repository fails with an ImportError. Find the cause, fix it "
    "across the code base, and run the tests."
)


@dataclass
class _Timeline:
    """When each tool call started and finished, to show what ran in parallel."""

    started: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    decisions: Counter[str] = field(default_factory=Counter)
    """`allow by <rule>` -> how many calls."""

    def __call__(self, event: Event) -> None:
        now = time.monotonic()
        match event:
            case PermissionDecided(decision=decision, rule=rule):
                self.decisions[f"{decision}: {rule}"] += 1
            case ToolStarted(tool_use_id=tid):
                self.started[tid] = now
            case ToolFinished(tool_use_id=tid, tool=tool) if tid in self.started:
                self.spans.append((tool, self.started.pop(tid), now))
            case _:
                pass


def _prepare_workspace(root: Path) -> Path:
    workspace = root / "shop"
    shutil.copytree(HERE / "sample", workspace)
    git = shutil.which("git")
    if git is not None:
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
    return workspace


def demo_main(argv: list[str], *, runner_factory: RunnerFactory | None = None) -> int:
    """Run the demo; `runner_factory` is the sandboxed tool hosts (without one: unsandboxed)."""
    parser = argparse.ArgumentParser(prog="warren demo", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the workspace afterwards")
    parser.add_argument("-v", "--verbose", action="store_true", help="logs on stderr")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="warren-demo-"))
    workspace = _prepare_workspace(root)
    out = sys.stdout
    out.write(
        "Warren demo (offline: a scripted model; real tools on a real copy)\n"
        f"  workspace: {workspace}\n"
        "  permissions: --permission-mode accept-edits --allowed-tools "
        "'Bash(python -m unittest:*)'\n"
        f"  sandbox: {'every tool call in a bubblewrap tool host' if runner_factory else 'OFF'}\n"
        f"  prompt: {PROMPT}\n\n"
    )
    timeline = _Timeline()
    options = HeadlessOptions(
        prompt=PROMPT,
        cwd=workspace,
        model=f"scripted:{HERE / 'session.json'}",
        permission_mode="accept-edits",
        allowed_tools=frozenset({"Bash(python -m unittest:*)"}),
        verbose=args.verbose,
        sandbox="required" if runner_factory is not None else "off",
    )
    started = time.monotonic()
    try:
        report = trio.run(
            lambda: run_headless(
                options,
                stdout=open("/dev/null", "w"),  # noqa: SIM115 - the final text is printed below
                extra_sinks=[ProgressPrinter(out, show_text=True), timeline],
                runner_factory=runner_factory,
            )
        )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - started
    result = report.result
    out.write("\nSummary\n")
    out.write(f"  outcome: {result.reason} after {result.num_turns} turns in {wall:.2f} s\n")
    out.write(f"  tool calls: {len(timeline.spans)}\n")
    _parallel_note(out, timeline)
    out.write("  policy decisions:\n")
    for decision, count in sorted(timeline.decisions.items()):
        out.write(f"    {count} x {decision}\n")
    out.write(f"  transcript: {report.transcript}\n")
    if args.keep:
        out.write(f"  workspace kept: {workspace}\n")
    if result.reason != "completed":
        out.write(f"\nThe demo did not complete: {result.result}\n")
    return exit_code(result.reason)


def _parallel_note(out: object, timeline: _Timeline) -> None:
    reads = [(s, e) for tool, s, e in timeline.spans if tool == "Read"]
    if len(reads) > 1:
        wall = max(e for _, e in reads) - min(s for s, _ in reads)
        total = sum(e - s for s, e in reads)
        sys.stdout.write(
            f"  parallel reads: {len(reads)} Read calls, {wall * 1000:.1f} ms wall for "
            f"{total * 1000:.1f} ms of work\n"
        )
