"""The `warren` command line: one parser with real subcommands, and a prompt otherwise.

    warren [PROMPT]        at a terminal: the interactive session (with a first prompt)
    warren PROMPT / warren -p PROMPT [options]   a headless run (the prompt may come on stdin)
    warren demo            the offline demo on a generated sample repository
    warren doctor          prove the sandbox floor on this machine, or say how to fix it
    warren sandbox run     run one command under the floor
    warren policy ...      explain and tune the permission policy
    warren trust / untrust let a repository's policy allow things, or stop it
    warren hooks list      the hooks in force with their files, and those that do not run
    warren hooks test      run the hooks in force against a sample event
    warren mcp list        the MCP servers in force with their files (get, add, remove)
    warren mcp serve       Warren's tools as an MCP server on stdio
    warren sessions        past sessions of this directory, newest first
    warren undo [SESSION]  put back the files of a session's last writing turn
    warren workflow ...    run a saved workflow, resume a stopped run, list the runs
    warren server ...      the warm per-user server: start, stop, status, run

A first argument that is not a subcommand is a prompt: with stdin and stdout at a terminal
`warren "fix the build"` opens the interactive session with it, otherwise it is
`warren -p "fix the build"`. A run goes to the warm per-user server when one is running
(`orchestrator.cli.client`, standard library only, decides before anything heavy is
imported), and runs in-process otherwise (`orchestrator.cli.in_process`), or with
`--no-server`. Exit codes are the run's terminal reason (`orchestrator.outcome.exit_code`); 2
is a bad command line or configuration.

The options of a run are `orchestrator.cli.options` (Claude Code's among them, declared by
`orchestrator.claude_code.flags`); this module adds the subcommands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from orchestrator.cli.commands import COMMANDS, is_command
from orchestrator.cli.in_process import exit_now, flush_stdout, import_structlog, run_in_process
from orchestrator.cli.options import EXIT_CODES, add_run_options

__all__ = ["COMMANDS", "build_parser", "main", "run_and_exit", "run_command"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: run options, and a subparser per command."""
    from orchestrator.cli.subcommands import doctor, hooks, mcp, policy, sessions, undo
    from orchestrator.cli.warm import server

    parser = argparse.ArgumentParser(
        prog="warren",
        usage="warren [options] [PROMPT]  |  warren COMMAND ...",
        description="Warren: a sandboxed multi-agent coding orchestrator. "
        "`warren PROMPT` (or `-p PROMPT`, or the prompt on stdin) runs headless.",
        epilog=EXIT_CODES,
        # A subcommand's option must never read as an abbreviation of a run option: `sessions
        # --all` is not `--allowed-tools` / `--allowedTools` (test_cli_sessions_e2e).
        allow_abbrev=False,
    )
    add_run_options(parser)
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", prog="warren demo", help=COMMANDS["demo"], description=COMMANDS["demo"]
    )
    demo.add_argument("--keep", action="store_true", help="keep the workspace afterwards")
    demo.add_argument("-v", "--verbose", action="store_true", help="logs on stderr")
    demo.add_argument(
        "--parallel-writers",
        action="store_true",
        help="the rename by three subagents at once, each writable only in its own package",
    )
    demo.add_argument(
        "--workflow",
        action="store_true",
        help="the rename by a workflow: three scoped writers at once, then a test agent",
    )
    demo.set_defaults(handler=_demo)
    doctor.add_commands(sub, COMMANDS)
    policy.add_commands(sub, COMMANDS)
    hooks.add_commands(sub, COMMANDS)
    mcp.add_commands(sub, COMMANDS)
    sessions.add_commands(sub, COMMANDS)
    undo.add_commands(sub, COMMANDS)
    workflow = sub.add_parser(
        "workflow",
        prog="warren workflow",
        help=COMMANDS["workflow"],
        description=COMMANDS["workflow"],
        usage="warren workflow {run NAME [ARGS...] [--args JSON],resume RUN_ID,list} [options]",
    )
    workflow.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    workflow.set_defaults(handler=_workflow)
    server.add_commands(sub, COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`warren ARGV`: a run goes to the warm server when one takes it, else runs here."""
    argv = sys.argv[1:] if argv is None else argv
    if is_command(argv):
        return run_command(argv)
    from orchestrator.cli.client import run_through_server

    code = run_through_server(argv)
    if code is not None:
        return code
    return run_in_process(argv)


def run_and_exit() -> NoReturn:
    """`main()`, then out at once (`exit_now`). The `warren` command itself is
    `orchestrator.cli.run_and_exit`, which tries the warm server before importing this."""
    exit_now(main())


def run_command(argv: list[str]) -> int:
    """`warren COMMAND ...` (or `--help`, `--version`) in this process."""
    import_structlog()
    try:
        if argv[:1] == ["workflow"]:  # a run's options follow, which the parser does not know
            from orchestrator.cli.workflow import workflow_main

            return workflow_main(argv[1:])
        args = build_parser().parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    finally:
        flush_stdout()


def _workflow(args: argparse.Namespace) -> int:
    from orchestrator.cli.workflow import workflow_main

    return workflow_main(list(args.rest))


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.cli.demo.run import demo_main
    from orchestrator.cli.wiring import session_parts

    return demo_main(
        keep=args.keep,
        verbose=args.verbose,
        parts=session_parts(),
        parallel_writers=args.parallel_writers,
        workflow=args.workflow,
    )
