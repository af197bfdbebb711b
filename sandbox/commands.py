"""What `warren doctor` and `warren sandbox run` do, as plain functions returning values.

The CLI (`orchestrator/cli/subcommands/doctor.py`) parses the command line, calls these and prints
what they return; nothing here writes to the terminal. Each runs its own `trio.run`, so the CLI
can call them from synchronous code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from sandbox.errors import SandboxUnavailable
from sandbox.host import detect_host
from sandbox.probe import FloorReport, probe_floor
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec, WorkspaceRoot
from sandbox.stubs import StubRegistry

__all__ = ["EXIT_SANDBOX_ERROR", "DoctorReport", "SandboxRunResult", "doctor", "sandbox_run"]

EXIT_SANDBOX_ERROR = 125
"""Exit code when the sandbox itself could not be built (like `env`, `timeout`, `docker`:
126/127 stay with the command: not executable / not found)."""


def home_view(extra_home_allow: Sequence[str] = ()) -> tuple[Path | None, list[str]]:
    """The hidden home and what a sandbox sees of it (read-only), for `warren doctor`."""
    from sandbox.masks import gather_host_facts

    facts = gather_host_facts(SandboxSpec(extra_home_allow=tuple(extra_home_allow)))
    shown = [str(b.path) for b in facts.binds if b.label.startswith("home_allow")]
    shown += [f"{inside} (sanitised copy)" for _, inside in facts.file_binds]
    return facts.home_mask, shown


@dataclass(frozen=True)
class DoctorReport:
    floor: FloorReport
    """The probe's report: proven or not, each check with a fix under each problem."""
    stubs_swept: tuple[Path, ...]
    """Mount stubs left by crashed sandboxes, removed on the way."""
    home_hidden: Path | None = None
    """The home hidden from sandboxes (None: visible, secrets masked by list only)."""
    home_visible: tuple[str, ...] = ()
    """What a sandbox still sees of the hidden home, read-only (`home_allow`, the sanitised
    git configuration)."""


def doctor(extra_home_allow: Sequence[str] = ()) -> DoctorReport:
    """Probe the floor, sweep stale mount stubs (harmless but untidy), and say what a sandbox
    sees of the home (`extra_home_allow`: the policy's `[sandbox] home_allow`)."""

    async def main() -> DoctorReport:
        try:
            host = await detect_host()
        except SandboxUnavailable:
            return DoctorReport(await probe_floor(), ())  # reports the missing bwrap, its fix
        report = await probe_floor(host=host)
        try:
            swept = await trio.to_thread.run_sync(StubRegistry(host.stub_dir).sweep)
        except OSError:
            swept = []
        return DoctorReport(report, tuple(swept))

    report = trio.run(main)
    home, visible = home_view(extra_home_allow)
    return dataclasses.replace(report, home_hidden=home, home_visible=tuple(visible))


@dataclass(frozen=True)
class SandboxRunResult:
    exit_code: int
    """The command's exit code; 128 + N when signal N killed it."""
    notes: tuple[str, ...]
    """A limit that killed it, and the sandbox's warnings, one sentence each."""


def sandbox_run(workspace: Path, read_only: bool, argv: Sequence[str]) -> SandboxRunResult:
    """Run one command under the floor with inherited stdio, the default limits and no
    network.

    **Errors:** `SandboxError` when the sandbox cannot be built (the CLI exits
    `EXIT_SANDBOX_ERROR`); `KeyboardInterrupt` after the sandbox was killed and reaped.
    """
    if not argv:
        raise ValueError("no command to run")
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=workspace.resolve(), mode="ro" if read_only else "rw"),)
    )

    async def main() -> SandboxRunResult:
        result = await run_sandboxed(spec, list(argv), stdin="inherit", output="inherit")
        message = result.limit_message(spec.limits)
        notes = ([message] if message else []) + [
            f"warning: {warning}" for warning in result.warnings
        ]
        code = result.exit_code if result.exit_code >= 0 else 128 - result.exit_code
        return SandboxRunResult(code, tuple(notes))

    return trio.run(main)
