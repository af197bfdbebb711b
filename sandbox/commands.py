"""Plain functions behind `warren doctor` and `warren sandbox run` (the CLI wires them).

They take already-parsed values and return an exit code; each runs its own `trio.run`, so
the CLI can call them from synchronous code.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.host import detect_host
from sandbox.probe import FloorReport, probe_floor
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec, WorkspaceRoot
from sandbox.stubs import StubRegistry

__all__ = ["EXIT_SANDBOX_ERROR", "doctor", "sandbox_run"]

EXIT_SANDBOX_ERROR = 125
"""Exit code when the sandbox itself could not be built (like `env`, `timeout`, `docker`:
126/127 stay with the command: not executable / not found)."""


def doctor(json_output: bool) -> int:
    """Probe the floor and print the report (a fix under each problem). 0 when proven."""

    async def main() -> tuple[FloorReport, list[Path]]:
        try:
            host = await detect_host()
        except SandboxUnavailable:
            return await probe_floor(), []  # reports the missing bwrap with its fix
        report = await probe_floor(host=host)
        # Stubs left by crashed sandboxes are harmless but untidy: sweep them here.
        try:
            swept = await trio.to_thread.run_sync(StubRegistry(host.stub_dir).sweep)
        except OSError:
            swept = []
        return report, swept

    report, swept = trio.run(main)
    if json_output:
        payload = report.model_dump(mode="json")
        payload["stubs_swept"] = [str(p) for p in swept]
        print(json.dumps(payload, indent=2))
    else:
        print(report.render())
        for path in swept:
            print(f"removed a stale mount stub: {path}")
    return 0 if report.proven else 1


def sandbox_run(workspace: Path, read_only: bool, net: str, argv: Sequence[str]) -> int:
    """Run one command under the floor with inherited stdio; return its exit code.

    `net` must be `off` (the only network mode for now). Limits are the defaults; the exit
    code is passed through, 125 when the sandbox cannot be built, and a limit kill prints
    one line on stderr.
    """
    if net != "off":
        print(f"warren sandbox run: --net {net!r} is not supported (only `off`)", file=sys.stderr)
        return 2
    if not argv:
        print("warren sandbox run: no command given (use `-- CMD ...`)", file=sys.stderr)
        return 2
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=workspace.resolve(), mode="ro" if read_only else "rw"),)
    )

    async def main() -> int:
        result = await run_sandboxed(spec, list(argv), stdin="inherit", output="inherit")
        message = result.limit_message(spec.limits)
        if message:
            print(f"warren: {message}", file=sys.stderr)
        for warning in result.warnings:
            print(f"warren: warning: {warning}", file=sys.stderr)
        return result.exit_code if result.exit_code >= 0 else 128 - result.exit_code

    try:
        return trio.run(main)
    except SandboxError as exc:
        print(f"warren sandbox run: {exc.message}", file=sys.stderr)
        return EXIT_SANDBOX_ERROR
    except KeyboardInterrupt:  # the sandbox was killed and reaped on the way out
        return 130
