"""`warren mcp`: the MCP servers in force (`list`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    mcp = sub.add_parser(
        "mcp", prog="warren mcp", help=summaries["mcp"], description=summaries["mcp"]
    )
    commands = mcp.add_subparsers(dest="mcp_command", required=True, metavar="COMMAND")
    listing = commands.add_parser(
        "list",
        help="the MCP servers in force with their files, and those that do not start",
        description="warren mcp list [--cwd DIR]: each server in force (how it runs: sandboxed "
        "with the workspace read-only or writable, unsandboxed, or HTTP outside the floor) with "
        "its file, then unsupported ones and an untrusted repository's (which do not start)",
    )
    listing.add_argument("--cwd", type=Path, default=None, help="the workspace (default: here)")
    listing.set_defaults(handler=_list)


def _list(args: argparse.Namespace) -> int:
    from orchestrator.cli.policy import printed
    from policies import commands

    return printed(commands.mcp_list((args.cwd or Path.cwd()).absolute()))
