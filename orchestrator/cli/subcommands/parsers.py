"""What the parsers of `warren`'s subcommands share: a subcommand's parser made from its
one-line summary (`orchestrator.cli.commands.COMMANDS`), one made of subcommands (`warren mcp
list`), and the `--cwd` option most of them take. Used by every `add_commands` here and by
`warren server`'s (orchestrator/cli/warm)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

__all__ = ["Subcommands", "add_cwd", "command_group", "command_parser"]

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""Where the subcommands of one `warren` subcommand (`warren mcp list`) are added."""


def command_parser(
    sub: Any, name: str, summaries: Mapping[str, str], *, more: str = ""
) -> argparse.ArgumentParser:
    """The parser of `warren NAME`, added to the subparsers `sub`: its summary is its help and
    begins its description, which `more` continues."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, prog=f"warren {name}", help=summaries[name], description=summaries[name] + more
    )
    return parser


def command_group(sub: Any, name: str, summaries: Mapping[str, str]) -> Subcommands:
    """`warren NAME COMMAND ...` (`command_parser`): a subcommand made of subcommands, which
    are added to what this returns; the one chosen is the `NAME_command` argument."""
    parser = command_parser(sub, name, summaries)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def add_cwd(parser: argparse.ArgumentParser, *, of: str = "the workspace") -> None:
    """`--cwd DIR`: `of` (the workspace the command looks at, or the directory), by default
    the current one."""
    parser.add_argument("--cwd", type=Path, default=None, help=f"{of} (default: here)")
