"""`warren doctor` and `warren sandbox run`: sandbox/commands.py's values, printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `doctor` and `sandbox` to the `warren` subparsers."""
    doctor = sub.add_parser(
        "doctor", prog="warren doctor", help=summaries["doctor"], description=summaries["doctor"]
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(handler=_doctor)

    sandbox = sub.add_parser(
        "sandbox",
        prog="warren sandbox",
        help=summaries["sandbox"],
        description=summaries["sandbox"],
    )
    commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run CMD in the sandbox; its exit code is passed through")
    run.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="the directory mounted writable (default: the current directory)",
    )
    run.add_argument("--ro", action="store_true", help="mount the workspace read-only")
    run.add_argument("--net", choices=["off"], default="off", help="network (only off for now)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(handler=_sandbox_run)


def _doctor(args: argparse.Namespace) -> int:
    from sandbox.commands import doctor

    report = doctor()
    if args.json:
        payload: dict[str, Any] = report.floor.model_dump(mode="json")
        payload["stubs_swept"] = [str(p) for p in report.stubs_swept]
        print(json.dumps(payload, indent=2))
    else:
        print(report.floor.render())
        for path in report.stubs_swept:
            print(f"removed a stale mount stub: {path}")
    return 0 if report.floor.proven else 1


def _sandbox_run(args: argparse.Namespace) -> int:
    from sandbox.commands import EXIT_SANDBOX_ERROR, sandbox_run
    from sandbox.errors import SandboxError

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("warren sandbox run: no command given (use `-- CMD ...`)", file=sys.stderr)
        return 2
    try:
        result = sandbox_run((args.workspace or Path.cwd()).absolute(), args.ro, cmd)
    except SandboxError as exc:
        print(f"warren sandbox run: {exc.message}", file=sys.stderr)
        return EXIT_SANDBOX_ERROR
    except KeyboardInterrupt:  # the sandbox was killed and reaped on the way out
        return 130
    for note in result.notes:
        print(f"warren: {note}", file=sys.stderr)
    return result.exit_code
