"""`warren policy ...`, `warren trust` and `warren untrust`: the parsers, and the reports
policies/commands.py returns, printed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.subcommands.parsers import add_cwd, command_group

if TYPE_CHECKING:
    from policies.commands import CommandReport

__all__ = ["add_commands", "printed"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `policy`, `trust` and `untrust` to the `warren` subparsers."""
    commands = command_group(sub, "policy", summaries)
    check = commands.add_parser(
        "check",
        help="explain the decision for one call: `-- COMMAND...` or `TOOL PATH`",
        description="warren policy check [--json] [--cwd DIR] -- COMMAND...  |  "
        "warren policy check [--json] Edit PATH",
    )
    check.add_argument("--json", action="store_true", help="print the decision as JSON")
    add_cwd(check)
    check.add_argument("target", nargs=argparse.REMAINDER, help="-- COMMAND... or TOOL PATH")
    check.set_defaults(handler=_check)
    for name, text in (
        ("show", "print the effective policy with the source of each rule"),
        ("test", "check every [[examples]] entry of the loaded policy files"),
        ("init", "write a commented starter .warren/policy.toml"),
        ("trust", "let this repository's policy allow things (same as `warren trust`)"),
        ("untrust", "stop trusting this repository's policy (same as `warren untrust`)"),
        (
            "import",
            "write the repository's Claude Code settings (.claude/settings.json, "
            ".claude/settings.local.json) into .warren/policy.toml and policy.local.toml, "
            "comments kept",
        ),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("--cwd", type=Path, default=None, help="the workspace")
        if name == "import":
            command.add_argument(
                "--dry-run", action="store_true", help="say what would be added, change nothing"
            )
        command.set_defaults(handler=_policy_command)

    for verb, trust in (("trust", True), ("untrust", False)):
        parser = sub.add_parser(
            verb,
            prog=f"warren {verb}",
            help=summaries[verb],
            description="Trust a repository: its policy's allow rules, hooks (its own and its "
            "Claude Code settings'), agent definitions and memory files take effect. A changed "
            "file needs trusting again."
            if trust
            else "Stop trusting a repository's policy allow rules.",
        )
        parser.add_argument("path", nargs="?", type=Path, default=None, help="default: here")
        parser.set_defaults(handler=_trust if trust else _untrust)


def printed(report: CommandReport) -> int:
    """Print a command's report on stdout, every control character in it escaped (policy
    files and settings name commands and paths a repository chose); return its exit code."""
    from orchestrator.text import escape_controls

    sys.stdout.write(escape_controls(report.text, keep_lines=True))
    return report.exit_code


def _check(args: argparse.Namespace) -> int:
    from orchestrator.tools.registry import builtin_facts
    from policies import commands
    from policies.files import PolicyError

    words = list(args.target)
    after_dashdash = words[:1] == ["--"]
    try:
        target = commands.check_target(
            words[1:] if after_dashdash else words, after_dashdash=after_dashdash
        )
    except PolicyError as exc:
        print(f"warren policy check: {exc}", file=sys.stderr)
        return 2
    cwd = (args.cwd or Path.cwd()).absolute()
    environment = commands.CommandEnvironment(tool_facts=builtin_facts())
    return printed(commands.check(target, json_output=args.json, cwd=cwd, environment=environment))


def _policy_command(args: argparse.Namespace) -> int:
    from orchestrator.tools.registry import builtin_facts
    from policies import commands

    cwd = (args.cwd or Path.cwd()).absolute()
    match args.policy_command:
        case "show":
            return printed(commands.show(cwd))
        case "test":
            environment = commands.CommandEnvironment(tool_facts=builtin_facts())
            return printed(commands.test(cwd, environment=environment))
        case "trust":
            return printed(commands.trust_cmd(cwd))
        case "untrust":
            return printed(commands.untrust_cmd(cwd))
        case "import":
            return printed(commands.import_cmd(cwd, dry_run=args.dry_run))
        case _:
            return printed(commands.init(cwd))


def _trust(args: argparse.Namespace) -> int:
    from policies import commands

    return printed(commands.trust_cmd((args.path or Path.cwd()).absolute()))


def _untrust(args: argparse.Namespace) -> int:
    from policies import commands

    return printed(commands.untrust_cmd((args.path or Path.cwd()).absolute()))
