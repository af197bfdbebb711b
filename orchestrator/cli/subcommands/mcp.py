"""`warren mcp`: the MCP servers in force (`list`, `get`, `add`, `remove`), and Warren's tools
as a server (`serve`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.cli.subcommands.parsers import add_cwd, command_group

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    commands = command_group(sub, "mcp", summaries)
    listing = commands.add_parser(
        "list",
        help="the MCP servers in force with their files, and those that do not start",
        description="warren mcp list [--cwd DIR]: each server in force (how it runs: sandboxed "
        "with the workspace read-only or writable, with the host's network or none, unsandboxed, "
        "or HTTP outside the floor) with "
        "its file, then unsupported ones and an untrusted repository's (which do not start)",
    )
    add_cwd(listing)
    listing.set_defaults(handler=_list)
    get = commands.add_parser("get", help="one server in force, as its policy table, with its file")
    get.add_argument("name")
    add_cwd(get)
    get.set_defaults(handler=_get)
    add = commands.add_parser(
        "add",
        help="add a server to a policy file: `warren mcp add NAME -- COMMAND [ARGS...]` or "
        "`warren mcp add NAME --url URL`",
        description="Add (or replace) [mcp.servers.NAME] in the policy file of --scope "
        "(local: .warren/policy.local.toml, the default; project: .warren/policy.toml; user: "
        "~/.config/warren/policy.toml), keeping its comments.",
    )
    _add_options(add)
    add.add_argument("name")
    add.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="[OPTIONS] -- COMMAND [ARGS...]",
        help="the server's command and its arguments, after `--`",
    )
    add.set_defaults(handler=_add)
    remove = commands.add_parser("remove", help="remove a server from a policy file")
    remove.add_argument("name")
    remove.add_argument("--scope", choices=["local", "project", "user"], default="local")
    add_cwd(remove)
    remove.set_defaults(handler=_remove)
    serve = commands.add_parser(
        "serve",
        help="serve Warren's file and shell tools over MCP (stdio or HTTP), under the floor "
        "and policy",
        description="warren mcp serve [--cwd DIR] [--http PORT [--token-file FILE]]: an MCP "
        "server on stdin/stdout (or streamable HTTP on 127.0.0.1:PORT) offering Read, Glob, "
        "Grep, LS, Edit, MultiEdit, Write, NotebookEdit and Bash; every call goes through the "
        "repository's policy (an ask is a denial: nobody can answer), the audit log and the "
        "sandbox, as a model's call would. Over HTTP every request needs `Authorization: "
        "Bearer TOKEN`: the token is read from --token-file, or made up and printed on stderr.",
    )
    serve.add_argument(
        "--http",
        type=int,
        default=None,
        metavar="PORT",
        help="serve streamable HTTP on 127.0.0.1:PORT (0: any free port) instead of stdio",
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="with --http: the file holding the bearer token clients must send",
    )
    add_cwd(serve)
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
    serve.add_argument(
        "--pool",
        choices=["local", "ray"],
        default=None,
        help="where dispatch_agent's subagents run, as for `warren -p` (default: the "
        "policy's [pool] backend, else local)",
    )
    serve.set_defaults(handler=_serve)


def _list(args: argparse.Namespace) -> int:
    from orchestrator.cli.subcommands.policy import printed
    from policies import commands

    return printed(commands.mcp_list((args.cwd or Path.cwd()).absolute()))


def _token(path: Path | None) -> str | None:
    """The bearer token: the file's first line, or a fresh one printed on stderr. None (and
    one line said) when the file cannot be read or holds none."""
    import secrets

    from orchestrator.cli.run import say

    if path is None:
        token = secrets.token_urlsafe(32)
        say(f"warren: mcp serve: bearer token (send `Authorization: Bearer ...`): {token}")
        return token
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        say(f"warren: mcp serve: cannot read --token-file {path}: {exc}")
        return None
    token = lines[0].strip() if lines else ""
    if len(token) < 16:
        say(f"warren: mcp serve: --token-file {path} must hold a token of 16 characters or more")
        return None
    return token


def _serve(args: argparse.Namespace) -> int:
    import functools

    import trio

    from orchestrator.cli.mcp_serve import serve_http, serve_stdio
    from orchestrator.cli.run import say
    from orchestrator.cli.wiring import session_parts
    from orchestrator.errors import ConfigError
    from orchestrator.outcome import EXIT_USAGE
    from orchestrator.session.config import SessionConfig
    from orchestrator.text import escape_controls
    from policies.files import split_tool_list

    if args.token_file is not None and args.http is None:
        say("warren: mcp serve: --token-file goes with --http")
        return EXIT_USAGE
    if args.http is not None and not 0 <= args.http <= 65535:
        say(f"warren: mcp serve: --http {args.http} is not a port (0 to 65535)")
        return EXIT_USAGE
    try:
        config = SessionConfig(
            cwd=(args.cwd or Path.cwd()).absolute(),
            permission_mode=args.permission_mode,
            allowed_tools=frozenset(split_tool_list(args.allowed_tools)),
            pool=args.pool,
        )
        if args.http is None:
            trio.run(serve_stdio, config, session_parts())
            return 0
        token = _token(args.token_file)
        if token is None:
            return EXIT_USAGE
        serve = functools.partial(serve_http, port=args.http, token=token)
        trio.run(serve, config, session_parts())
    except ConfigError as exc:
        say(f"warren: {escape_controls(str(exc))}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return 0


def _get(args: argparse.Namespace) -> int:
    from orchestrator.cli.subcommands.policy import printed
    from policies import commands

    return printed(commands.mcp_get((args.cwd or Path.cwd()).absolute(), args.name))


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a streamable HTTP server instead")
    parser.add_argument("--scope", choices=["local", "project", "user"], default="local")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="set in its environment"
    )
    parser.add_argument("--write", action="store_true", help="the workspace writable for it")
    parser.add_argument(
        "--network", action="store_true", help="the host's network for it (default: none)"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per call (60)")
    add_cwd(parser)


def _add(args: argparse.Namespace) -> int:
    import pydantic

    from orchestrator.cli.run import say
    from orchestrator.cli.subcommands.policy import printed
    from policies import commands
    from policies.mcp import McpServer

    # Options may come after NAME too, up to `--`; what follows `--` is the command.
    rest: list[str] = list(args.rest)
    split = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog="warren mcp add", add_help=False)
    _add_options(late)
    try:
        more, stray = late.parse_known_args(rest[:split], namespace=args)
    except SystemExit:
        return 2
    argv = stray + rest[split + 1 :]
    env = dict(item.partition("=")[::2] for item in more.env)
    fields: dict[str, object] = {"env": env, "write": args.write, "network": args.network}
    if args.url is not None:
        fields["url"] = args.url
    elif argv:
        fields["command"], fields["args"] = argv[0], tuple(argv[1:])
    if args.timeout is not None:
        fields["timeout_s"] = args.timeout
    try:
        server = McpServer.model_validate(fields)
    except pydantic.ValidationError as exc:
        say(f"warren: mcp add: {exc.errors()[0]['msg']}")
        return 2
    return printed(
        commands.mcp_set((args.cwd or Path.cwd()).absolute(), args.name, server, scope=args.scope)
    )


def _remove(args: argparse.Namespace) -> int:
    from orchestrator.cli.subcommands.policy import printed
    from policies import commands

    return printed(
        commands.mcp_set((args.cwd or Path.cwd()).absolute(), args.name, None, scope=args.scope)
    )
