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
    warren server ...      the warm per-user server: start, stop, status, run

A first argument that is not a subcommand is a prompt: with stdin and stdout at a terminal
`warren "fix the build"` opens the interactive session with it, otherwise it is
`warren -p "fix the build"`. A run goes to the warm per-user server when one is running
(`orchestrator.cli.client`, standard library only, decides before anything heavy is
imported), and runs in-process otherwise, or with `--no-server`. Exit codes are the run's
terminal reason (`orchestrator.outcome.exit_code`); 2 is a bad command line or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from orchestrator.cli.commands import COMMANDS, is_command
from policies.claude_names import CLAUDE_MODE_NAMES, MODE_ALIASES

if TYPE_CHECKING:
    from sandbox.probe import KnownFloor
    from sandbox.spare import SpareSource

__all__ = ["COMMANDS", "build_parser", "exit_now", "main", "run_and_exit", "run_in_process"]

EXIT_CODES = (
    "Exit codes: 0 completed, 1 model error, 2 usage or configuration (nothing ran), 3 max "
    "turns, 4 prompt too long, 5 budget exceeded, 6 hook blocked, 7 permission denied, 8 state "
    "could not be written (io_error), 9 the reply stayed cut at the output token limit "
    "(output_truncated), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP, 141 stdout closed "
    "by its reader (| head)."
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("warren")
    except PackageNotFoundError:
        return "0+unknown"


class _VersionAction(argparse.Action):
    """`-v` / `--version`: argparse's own version action wants the text when the parser is
    built, and looking the version up (`importlib.metadata`) would then cost every run's
    start, not only `warren --version`."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings, dest, default=argparse.SUPPRESS, nargs=0,
            help="show the version and exit",
        )  # fmt: skip

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"warren {_version()}")
        parser.exit()


def _run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a run (`warren [PROMPT]`, `warren -p PROMPT`)."""
    parser.add_argument(
        "-p",
        "--print",
        dest="prompt",
        metavar="PROMPT",
        help="run headless with this prompt (or give the prompt on stdin)",
    )
    parser.add_argument(
        "--output-format",
        choices=["text", "json", "stream-json"],
        default="text",
        help="what to print on stdout (default: text)",
    )
    parser.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="model requests per run (default: the policy's limits.max_turns, else 100)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="read-only tool calls run at once (default: the policy's "
        "limits.max_concurrency, else 10)",
    )
    parser.add_argument(
        "--max-budget-usd",
        type=float,
        default=None,
        metavar="USD",
        help="dollars the session may spend on the model, subagents included; a request that "
        "would pass it is not sent and the run ends budget_exceeded, exit 5 (default: the "
        "policy's limits.max_budget_usd, else no limit)",
    )
    parser.add_argument(
        "--compact-threshold",
        type=float,
        default=None,
        metavar="F",
        help="fraction of the model's context window (0.5 to 0.95) a request may fill before "
        "the conversation is compacted (default: the policy's limits.compact_threshold, else "
        "0.8)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="Claude model id or alias (sonnet, opus, haiku), or scripted:PATH to replay a "
        "script (default: claude-sonnet-4-6)",
    )
    parser.add_argument(
        "--max-thinking-tokens",
        type=int,
        default=None,
        metavar="N",
        help="extended thinking with a budget of N tokens per response (at least 1024; "
        "max_tokens is raised above it); default: the policy's limits.max_thinking_tokens, "
        "else no extended thinking",
    )
    parser.add_argument(
        "--cwd",
        type=Path,
        default=None,
        help="the workspace to work in (default: the current directory)",
    )
    parser.add_argument(
        "--permission-mode",
        choices=[*CLAUDE_MODE_NAMES, *MODE_ALIASES],
        default=None,
        help="default: read-only calls run, others ask (denied when headless); accept-edits: "
        "edits in the workspace run too; plan: read-only tools only; dont-ask: asks become "
        "denials; bypass: everything except deny rules, protected paths and critical deletes "
        "(default: the policy files' mode; Claude Code's spellings acceptEdits, dontAsk, "
        "bypassPermissions are the same modes)",
    )
    parser.add_argument(
        "--i-know-there-is-no-sandbox",
        dest="no_sandbox_consent",
        action="store_true",
        help="let --permission-mode bypass run without a proven sandbox floor",
    )
    parser.add_argument(
        "--allowed-tools",
        action="append",
        metavar="TOOLS",
        help="tools that run without asking (comma or space separated)",
    )
    parser.add_argument(
        "--disallowed-tools", action="append", metavar="TOOLS", help="tools that are always denied"
    )
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument(
        "--resume",
        metavar="SESSION_ID",
        nargs="?",
        const="",
        help="continue a session (`warren sessions` lists them); without an id, at a "
        "terminal, pick one from a list",
    )
    resume.add_argument(
        "-c",
        "--continue",
        dest="continue_last",
        action="store_true",
        help="continue the most recent session in this directory",
    )
    parser.add_argument(
        "--sandbox",
        choices=["required", "off"],
        default="required",
        help="required (default): prove the bubblewrap floor and run every tool call inside "
        "it, or refuse to start; off: run tools unsandboxed, with a warning on every run",
    )
    parser.add_argument(
        "--pool",
        choices=["local", "ray"],
        default=None,
        help="where subagents run: local (sandboxed processes here, at most 10 at once) or "
        "ray (a Ray cluster at $RAY_ADDRESS, else the policy's [pool] address; up to 64; the "
        "API key, model calls, decisions and transcripts stay here). Default: the policy's "
        "[pool] backend, else local",
    )
    parser.add_argument(
        "--fail-on-denial",
        action="store_true",
        help="a run that completed with denied tool calls exits 7 (permission_denied) instead "
        "of 0; the denials are listed either way",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress on stderr (shown only when stderr is a terminal)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="logs on stderr, readable (structlog)"
    )
    parser.add_argument("-v", "--version", action=_VersionAction)


# -- Claude Code compatibility (issue 16) ------------------------------------------------------
# Claude Code's spellings of Warren's options, and every flag the pinned `claude-agent-sdk`
# (0.2.184, `SubprocessCLITransport._build_command`) can put on a command line: each one works,
# or is an error that names it; none is accepted and then ignored
# (tests/orchestrator/test_cli_claude_code.py holds the list against the SDK's builder).


UNSUPPORTED_CLAUDE_CODE_FLAGS: dict[str, tuple[bool, str]] = {
    "--strict-mcp-config": (False, "MCP servers from --mcp-config only"),
    "--betas": (True, "API beta headers"),
    "--task-budget": (True, "task budgets; --max-budget-usd limits the spend"),
    "--include-hook-events": (False, "hook events in stream-json"),
    "--resume-session-at": (True, "resuming at a message"),
    "--resume-drops-turn": (True, "dropping a turn on resume"),
    "--session-mirror": (False, "an external session store"),
    "--plugin-dir": (True, "plugins"),
    "--thinking": (True, "adaptive thinking; --max-thinking-tokens N turns extended thinking on"),
    "--thinking-display": (True, "thinking display options"),
    "--effort": (True, "effort levels"),
    "--json-schema": (True, "structured output"),
}
"""Claude Code flags Warren does not support: (takes a value, what it would do). Each is an
error naming it (`_Unsupported`); one Warren learns moves out of this table."""


class _Unsupported(argparse.Action):
    """A Claude Code flag Warren does not support: a usage error that names it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        _, what = UNSUPPORTED_CLAUDE_CODE_FLAGS[self.option_strings[0]]
        parser.error(f"{option_string} is a Claude Code flag Warren does not support ({what})")


def _claude_code_options(parser: argparse.ArgumentParser) -> None:
    """Claude Code's flags, under their own heading in `--help`."""
    group = parser.add_argument_group(
        "Claude Code compatibility",
        "Claude Code's spellings, for scripts and SDKs written for it (`-v` is --version, as "
        "in Claude Code; logs are --verbose).",
    )
    group.add_argument(
        "--allowedTools", dest="allowed_tools", action="append", metavar="TOOLS",
        help="= --allowed-tools",
    )  # fmt: skip
    group.add_argument(
        "--disallowedTools", dest="disallowed_tools", action="append", metavar="TOOLS",
        help="= --disallowed-tools",
    )  # fmt: skip
    group.add_argument(
        "--dangerously-skip-permissions",
        action="store_true",
        help="= --permission-mode bypass (the same floor gate: refused without a proven "
        "sandbox unless --i-know-there-is-no-sandbox)",
    )
    group.add_argument(
        "--system-prompt",
        metavar="TEXT",
        help="replaces Warren's base system prompt (empty: none); the workspace context "
        "(git state, memory files) still follows",
    )
    group.add_argument(
        "--system-prompt-file", type=Path, metavar="FILE", help="--system-prompt from a file"
    )
    group.add_argument(
        "--append-system-prompt", metavar="TEXT", help="added after the base system prompt"
    )
    group.add_argument(
        "--add-dir",
        dest="add_dirs",
        action="append",
        type=Path,
        metavar="DIR",
        help="another directory tools may write (under the floor, as [sandbox] "
        "writable_roots; protected paths inside stay read-only)",
    )
    group.add_argument(
        "--mcp-config",
        dest="mcp_configs",
        action="append",
        metavar="FILE_OR_JSON",
        help="MCP servers in .mcp.json's format (a file, or its JSON text), at the command "
        "line's level; repeatable",
    )
    group.add_argument(
        "--fallback-model",
        metavar="MODEL",
        help="the model that answers once the model is overloaded (529, after retries), for "
        "the rest of the session",
    )
    group.add_argument(
        "--session-id", metavar="UUID", help="the id of the new session (a UUID not in use)"
    )
    group.add_argument(
        "--fork-session",
        action="store_true",
        help="with --resume/--continue: continue in a new session, the old one unchanged",
    )
    group.add_argument(
        "--tools",
        metavar="TOOLS",
        help="the built-in tools offered to the model (comma separated; `default`: all; "
        "empty: none)",
    )
    group.add_argument(
        "--settings",
        metavar="FILE_OR_JSON",
        help="a Claude Code settings file (or its JSON text) at the command line's level: "
        "its permissions and hooks",
    )
    group.add_argument(
        "--setting-sources",
        metavar="SOURCES",
        help="which Claude Code settings and agents are read: user, project, local (comma "
        "separated; default all three; empty: none)",
    )
    unsupported: list[str] = []
    for flag, (takes_value, _) in UNSUPPORTED_CLAUDE_CODE_FLAGS.items():
        try:
            group.add_argument(
                flag,
                action=_Unsupported,
                nargs="?" if takes_value else 0,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
        except argparse.ArgumentError:  # Warren supports it now, declared above
            continue
        unsupported.append(flag)
    group.description = (
        f"{group.description} Not supported, an error naming the flag: {', '.join(unsupported)}."
    )
    parser.add_argument(
        "--no-server",
        action="store_true",
        help="run in this process even when a warm server is running (or set "
        "WARREN_NO_SERVER=1); `warren server --help` explains the server",
    )


def _sdk_options(parser: argparse.ArgumentParser) -> None:
    """Claude Code's flags for being driven by an SDK host (`claude-agent-sdk`'s `cli_path`):
    JSON lines on stdin, permission asks put to the host, partial messages. Declared before
    any table of Claude Code flags Warren refuses, which skips what is declared already."""
    group = parser.add_argument_group("Claude Code SDK host")
    group.add_argument(
        "--input-format",
        choices=["text", "stream-json"],
        default="text",
        help="text (default): the prompt from -p or stdin; stream-json: user messages and "
        "control requests as JSON lines on stdin, one run per message, as Claude Code reads "
        "them from the Agent SDK (needs --output-format stream-json)",
    )
    group.add_argument(
        "--include-partial-messages",
        action="store_true",
        help="stream-json also carries the model's text as it streams (`stream_event` lines)",
    )
    group.add_argument(
        "--permission-prompt-tool",
        metavar="stdio",
        default=None,
        help="stdio: put the policy's permission asks to the SDK host (its can_use_tool) "
        "with --input-format stream-json; deny rules and the sandbox still bind",
    )


def _sdk_fallbacks(parser: argparse.ArgumentParser) -> None:
    """The one other flag the Agent SDK always passes, `--system-prompt ""`, for a build
    without Claude Code's aliases: declared only if nothing declared it (those aliases own
    it and win), and then only empty (Warren's base prompt) is accepted."""
    if "--system-prompt" not in parser._option_string_actions:
        parser.add_argument(
            "--system-prompt",
            dest="sdk_system_prompt",
            metavar="TEXT",
            default=None,
            help=argparse.SUPPRESS,
        )


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
    _run_options(parser)
    _sdk_options(parser)
    _claude_code_options(parser)  # after the SDK host's flags: it skips what is declared
    _sdk_fallbacks(parser)
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
    demo.set_defaults(handler=_demo)
    doctor.add_commands(sub, COMMANDS)
    policy.add_commands(sub, COMMANDS)
    hooks.add_commands(sub, COMMANDS)
    mcp.add_commands(sub, COMMANDS)
    sessions.add_commands(sub, COMMANDS)
    undo.add_commands(sub, COMMANDS)
    server.add_commands(sub, COMMANDS)
    return parser


def _prompt_parser() -> argparse.ArgumentParser:
    """`warren [options] PROMPT`: the run options and the prompt as a positional."""
    parser = argparse.ArgumentParser(
        prog="warren", usage="warren [options] [PROMPT]", epilog=EXIT_CODES
    )
    _run_options(parser)
    _sdk_options(parser)
    _claude_code_options(parser)  # after the SDK host's flags: it skips what is declared
    _sdk_fallbacks(parser)
    parser.add_argument("words", nargs="?", metavar="PROMPT", help="the prompt")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`warren ARGV`: a run goes to the warm server when one takes it, else runs here."""
    argv = sys.argv[1:] if argv is None else argv
    if not is_command(argv):
        from orchestrator.cli.client import run_through_server

        code = run_through_server(argv)
        if code is not None:
            return code
    return run_in_process(argv)


def run_and_exit() -> NoReturn:
    """`main()`, then out at once (`exit_now`). The `warren` command itself is
    `orchestrator.cli.run_and_exit`, which tries the warm server before importing this."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """Out at once with `code`. Every part a session started was stopped before its run
    returned (each is owned by a nursery and reaped), so what is left is the interpreter's
    own teardown of thousands of imported objects, a second on a busy machine after the
    result is on the screen: flush what is buffered and exit
    (`tests/orchestrator/server/test_fast_exit.py` checks nothing is left behind)."""
    import logging
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()  # the JSON log file's handler
    os._exit(code)


def run_in_process(
    argv: list[str],
    terminal: Path | None = None,
    known_floor: KnownFloor | None = None,
    *,
    spares: SpareSource | None = None,
) -> int:
    """`warren ARGV` in this process: what a server's session process runs too, with the
    client's `terminal` (its path) for permission asks, the floor the server proved and its
    spare tool hosts."""
    _import_structlog()
    try:
        if is_command(argv):
            args = build_parser().parse_args(argv)
            handler: Callable[[argparse.Namespace], int] = args.handler
            return handler(args)
        return _prompt(_prompt_parser().parse_args(argv), terminal, known_floor, spares)
    finally:
        _flush_stdout()


def _import_structlog() -> None:
    """Import structlog with rich hidden from it. structlog imports rich (and through it
    pygments) at its own import when rich is installed, for pretty tracebacks that Warren's
    logs never use (`orchestrator.records.logs` formats exceptions plainly): a third of the cost of
    importing structlog, on every run's start. rich stays importable for the REPL."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def _flush_stdout() -> None:
    """Flush stdout now, so a closed terminal or pipe is not a traceback at exit."""
    import os

    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _tool_list(values: list[str] | None) -> frozenset[str]:
    """The rules given to --allowed-tools / --disallowed-tools, each split the policy's way
    (commas and blanks between rules, never inside `Bash(npm run test:*)`)."""
    from policies.files import PolicyError, split_tool_list

    try:
        return frozenset(split_tool_list(values or []))
    except PolicyError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr and sys.stderr.isatty())
    except ValueError:  # closed
        return False


def _at_terminal() -> bool:
    """A person can answer permission asks: stdin and stderr are terminals."""
    return bool(sys.stdin and sys.stdin.isatty() and sys.stderr.isatty())


def _interactive_terminal() -> bool:
    """`warren` / `warren PROMPT` open the interactive session: stdin and stdout are
    terminals (a pipe on either side keeps a run headless, as `echo ... | warren`)."""
    return bool(sys.stdin and sys.stdout and sys.stdin.isatty() and sys.stdout.isatty())


def _prompt(
    args: argparse.Namespace,
    terminal: Path | None = None,
    known_floor: KnownFloor | None = None,
    spares: SpareSource | None = None,
) -> int:
    import dataclasses
    import os

    import trio
    from pydantic import ValidationError

    from orchestrator.cli.run import run_prompt
    from orchestrator.cli.wiring import session_parts
    from orchestrator.outcome import EXIT_USAGE
    from orchestrator.session.config import DEFAULT_MODEL, SessionConfig

    if args.prompt is not None and args.words is not None:
        print("warren: give the prompt once: as PROMPT or with -p", file=sys.stderr)
        return EXIT_USAGE
    refused = _sdk_refusal(args)
    if refused is not None:
        print(f"warren: {refused}", file=sys.stderr)
        return EXIT_USAGE
    prompt = args.prompt if args.prompt is not None else args.words
    streamed = args.input_format == "stream-json"
    if (
        args.resume == "" and not streamed
    ):  # `--resume` without an id: pick one (then run, or open the session)
        picked = _pick_session(args)
        if picked is None or isinstance(picked, int):
            return picked or 0
        args.resume = picked
    interactive = args.prompt is None and not streamed and _interactive_terminal()
    if prompt is None and not interactive and not streamed:
        if sys.stdin is None or sys.stdin.isatty():
            _prompt_parser().print_usage(sys.stderr)
            print(
                "warren: give a prompt (warren PROMPT, -p PROMPT, or on stdin; the interactive "
                "session needs stdin and stdout at a terminal); `warren --help` lists the "
                "commands",
                file=sys.stderr,
            )
            return EXIT_USAGE
        prompt = sys.stdin.read()
    if prompt is not None and not prompt.strip() and not streamed:
        if not interactive:
            print("warren: the prompt is empty", file=sys.stderr)
            return EXIT_USAGE
        prompt = None
    claude_code = _claude_code_config(args)
    if isinstance(claude_code, int):
        return claude_code
    try:
        config = SessionConfig(
            **claude_code,
            cwd=(args.cwd or Path.cwd()).absolute(),
            model=args.model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
            output_format=args.output_format,
            max_turns=args.max_turns,
            max_concurrency=args.max_concurrency,
            max_budget_usd=args.max_budget_usd,
            compact_threshold=args.compact_threshold,
            max_thinking_tokens=args.max_thinking_tokens,
            allowed_tools=_tool_list(args.allowed_tools),
            disallowed_tools=_tool_list(args.disallowed_tools),
            resume=args.resume,
            continue_last=args.continue_last,
            verbose=args.verbose,
            fail_on_denial=args.fail_on_denial,
            sandbox=args.sandbox,
            pool=args.pool,
            no_sandbox_consent=args.no_sandbox_consent,
            include_partial_messages=args.include_partial_messages,
            asks="terminal" if _at_terminal() else "deny",
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        print(f"warren: {problems}", file=sys.stderr)
        return EXIT_USAGE
    at_terminal = not args.quiet and _stderr_is_terminal()
    progress = None
    if (
        at_terminal
        and not interactive  # the interactive session draws its own
        and not (args.output_format == "stream-json" and sys.stdout.isatty())
    ):
        from orchestrator.cli.live_progress import TerminalProgress, stderr_console

        progress = TerminalProgress(stderr_console(), pause_on_ask=config.asks == "terminal")
    host = None
    if known_floor is not None:
        from sandbox.probe import reuse_known

        reused = reuse_known(known_floor)
        host = reused[0] if reused is not None else None
    parts = dataclasses.replace(session_parts(spares, host), known_floor=known_floor)
    if terminal is not None:
        parts = dataclasses.replace(parts, terminal=terminal)
    try:
        if streamed:
            from orchestrator.cli.stream_input import run_stream_input

            return trio.run(
                partial(run_stream_input, host_asks=args.permission_prompt_tool == "stdio"),
                config,
                parts,
            )
        if interactive:
            from orchestrator.cli.repl.app import run_repl

            return trio.run(run_repl, config, prompt, parts)
        assert prompt is not None
        return trio.run(
            partial(run_prompt, progress=progress, show_session=at_terminal),
            config,
            prompt,
            parts,
        )
    except KeyboardInterrupt:  # before the signal watch started, or after it stopped
        print("warren: interrupted", file=sys.stderr)
        return 130


def _sdk_refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with the SDK host flags, or None (Claude Code's rules for them)."""
    streamed = args.input_format == "stream-json"
    if streamed and args.output_format != "stream-json":
        return "--input-format stream-json needs --output-format stream-json"
    if streamed and (args.prompt is not None or args.words is not None):
        return "--input-format stream-json reads the prompts on stdin; give no PROMPT or -p"
    if streamed and args.resume == "":
        return "--resume needs a session id with --input-format stream-json"
    tool = args.permission_prompt_tool
    if tool is not None and tool != "stdio":
        return (
            f"--permission-prompt-tool {tool}: Warren asks an SDK host only over stdio "
            "(--permission-prompt-tool stdio); MCP permission tools are not supported"
        )
    if tool == "stdio" and not streamed:
        return "--permission-prompt-tool stdio needs --input-format stream-json"
    if args.include_partial_messages and args.output_format != "stream-json":
        return "--include-partial-messages needs --output-format stream-json"
    if getattr(args, "sdk_system_prompt", None):
        return "--system-prompt with a text is not supported on this build; leave it empty"
    return None


def _claude_code_config(args: argparse.Namespace) -> dict[str, object] | int:
    """The session settings Claude Code's flags (and `--permission-mode`) give, or the exit
    code of a one-line error."""
    from orchestrator.outcome import EXIT_USAGE
    from policies.claude_names import warren_mode, warren_tool

    def fail(message: str) -> int:
        print(f"warren: {message}", file=sys.stderr)
        return EXIT_USAGE

    mode = warren_mode(args.permission_mode) or args.permission_mode
    if args.dangerously_skip_permissions:
        if mode not in (None, "bypass"):
            return fail(
                f"--dangerously-skip-permissions is --permission-mode bypass; it cannot be "
                f"used with --permission-mode {args.permission_mode}"
            )
        mode = "bypass"
    system = args.system_prompt
    if args.system_prompt_file is not None:
        if system is not None:
            return fail("give --system-prompt or --system-prompt-file, not both")
        try:
            system = args.system_prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return fail(f"--system-prompt-file {args.system_prompt_file}: {exc}")
    add_dirs: list[Path] = []
    for directory in args.add_dirs or ():
        resolved = directory.expanduser().resolve()
        if not resolved.is_dir():
            return fail(f"--add-dir {directory}: not a directory")
        add_dirs.append(resolved)
    tools = None
    if args.tools is not None and args.tools.strip() != "default":
        tools = tuple(warren_tool(t.strip()) for t in args.tools.split(",") if t.strip())
    sources = None
    if args.setting_sources is not None:
        names = {s.strip() for s in args.setting_sources.split(",") if s.strip()}
        unknown = sorted(names - {"user", "project", "local"})
        if unknown:
            return fail(
                f"--setting-sources: unknown source {', '.join(unknown)} (user, project, local)"
            )
        sources = frozenset(names)
    return {
        "permission_mode": mode,
        "system_prompt": system,
        "append_system_prompt": args.append_system_prompt,
        "add_dirs": tuple(add_dirs),
        "session_id": args.session_id,
        "fork_session": args.fork_session,
        "tools": tools,
        "settings": args.settings,
        "setting_sources": sources,
        "fallback_model": args.fallback_model,
        "mcp_configs": tuple(args.mcp_configs or ()),
    }


def _pick_session(args: argparse.Namespace) -> str | int | None:
    """`--resume` without an id: the session picked at a terminal, None for none picked, or
    the exit code of a one-line error (no terminal to pick at)."""
    from orchestrator.cli.subcommands.sessions import pick_session
    from orchestrator.outcome import EXIT_USAGE

    if not _at_terminal():
        print(
            "warren: --resume needs a session id when not at a terminal; "
            "`warren sessions` lists them (or --continue takes the latest)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        return pick_session((args.cwd or Path.cwd()).resolve())
    except (EOFError, KeyboardInterrupt):
        print(file=sys.stderr)
        return None


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.cli.demo.run import demo_main
    from orchestrator.cli.wiring import session_parts

    return demo_main(
        keep=args.keep,
        verbose=args.verbose,
        parts=session_parts(),
        parallel_writers=args.parallel_writers,
    )
