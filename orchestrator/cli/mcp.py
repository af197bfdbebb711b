"""`warren mcp`: the MCP servers in force (`list`), and Warren's tools as a server (`serve`)."""

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
    serve = commands.add_parser(
        "serve",
        help="serve Warren's file and shell tools over MCP (stdio), under the floor and policy",
        description="warren mcp serve [--cwd DIR]: an MCP server on stdin/stdout offering "
        "Read, Glob, Grep, LS, Edit, MultiEdit, Write, NotebookEdit and Bash; every call goes "
        "through the repository's policy (an ask is a denial: nobody can answer), the audit "
        "log and the sandbox, as a model's call would.",
    )
    serve.add_argument("--cwd", type=Path, default=None, help="the workspace (default: here)")
    serve.add_argument(
        "--permission-mode",
        choices=["default", "accept-edits", "plan", "dont-ask", "bypass"],
        default=None,
        help="as for `warren -p` (default: the policy's mode)",
    )
    serve.add_argument(
        "--allowed-tools",
        action="append",
        default=[],
        metavar="RULES",
        help="allow rules for this server, as for `warren -p`",
    )
    serve.set_defaults(handler=_serve)


def _list(args: argparse.Namespace) -> int:
    from orchestrator.cli.policy import printed
    from policies import commands

    return printed(commands.mcp_list((args.cwd or Path.cwd()).absolute()))


def _serve(args: argparse.Namespace) -> int:
    import trio

    from orchestrator.cli.run import say
    from orchestrator.cli.wiring import session_parts
    from orchestrator.errors import ConfigError
    from orchestrator.mcp.serve import serve_stdio
    from orchestrator.outcome import EXIT_USAGE
    from orchestrator.session import SessionConfig
    from orchestrator.text import escape_controls
    from policies.files import split_tool_list

    try:
        config = SessionConfig(
            cwd=(args.cwd or Path.cwd()).absolute(),
            permission_mode=args.permission_mode,
            allowed_tools=frozenset(split_tool_list(args.allowed_tools)),
        )
        trio.run(serve_stdio, config, session_parts())
    except ConfigError as exc:
        say(f"warren: {escape_controls(str(exc))}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return 0
