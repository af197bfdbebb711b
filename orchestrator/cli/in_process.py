"""A run in this process: `warren [options] [PROMPT]` read into a `SessionConfig` and run
headless, as the interactive session, or served to an SDK host (`--input-format stream-json`).

`warren` runs here when no warm server takes the run (`orchestrator.cli.main`), and so does
each session process the server forks (`orchestrator.cli.warm.server`), with the client's
terminal for permission asks, the floor the server proved and its spare tool hosts. Neither
needs the subcommands, which this module does not know: the server imports it, and
`orchestrator.cli.main` (which knows them, the server's among them) imports the server.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from orchestrator.claude_code.flags import claude_code_config, sdk_refusal
from orchestrator.cli.options import prompt_parser, tool_list

if TYPE_CHECKING:
    from orchestrator.cli.live_progress import TerminalProgress
    from orchestrator.session.config import SessionConfig, SessionParts
    from sandbox.probe import KnownFloor
    from sandbox.spare import SpareSource

__all__ = [
    "exit_now",
    "flush_stdout",
    "import_structlog",
    "run_in_process",
    "session_config",
    "session_parts_here",
]


def run_in_process(
    argv: list[str],
    terminal: Path | None = None,
    known_floor: KnownFloor | None = None,
    *,
    spares: SpareSource | None = None,
) -> int:
    """`warren ARGV` (a run, not a subcommand) in this process: what a server's session
    process runs too, with the client's `terminal` (its path) for permission asks, the floor
    the server proved and its spare tool hosts."""
    import_structlog()
    try:
        return _run(prompt_parser().parse_args(argv), terminal, known_floor, spares)
    finally:
        flush_stdout()


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


def import_structlog() -> None:
    """Import structlog with rich hidden from it. structlog imports rich (and through it
    pygments) at its own import when rich is installed, for pretty tracebacks that Warren's
    logs never use (`orchestrator.records.logs` formats exceptions plainly): a third of the
    cost of importing structlog, on every run's start. rich stays importable for the REPL."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


def flush_stdout() -> None:
    """Flush stdout now, so a closed terminal or pipe is not a traceback at exit."""
    import os

    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


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


def session_config(args: argparse.Namespace) -> SessionConfig | int:
    """A run's session options from its parsed command line (`prompt_parser`), or the exit
    code of a one-line error (`warren workflow run` parses a run's options too)."""
    return _session_config(args)


def session_parts_here() -> SessionParts:
    """The session's concrete parts for a run in this process."""
    return _parts(None, None, None)


def _run(
    args: argparse.Namespace,
    terminal: Path | None,
    known_floor: KnownFloor | None,
    spares: SpareSource | None,
) -> int:
    """The run `args` ask for, to its exit code: served to an SDK host, the interactive
    session, or headless."""
    import trio

    from orchestrator.cli.run import run_prompt

    asked = _prompt(args)
    if isinstance(asked, int):
        return asked
    prompt, interactive = asked
    config = _session_config(args)
    if isinstance(config, int):
        return config
    at_terminal = not args.quiet and _stderr_is_terminal()
    progress = _progress(args, config, at_terminal=at_terminal, interactive=interactive)
    parts = _parts(terminal, known_floor, spares)
    try:
        if args.input_format == "stream-json":
            from orchestrator.cli.stream_input import run_stream_input

            return trio.run(
                partial(run_stream_input, host_asks=args.permission_prompt_tool == "stdio"),
                config,
                parts,
            )
        if interactive:
            from orchestrator.cli.repl.app import run_repl

            # Background agents report with the next prompt: the prompt comes back at once.
            repl_config = config.model_copy(update={"wait_for_tasks": False})
            return trio.run(run_repl, repl_config, prompt, parts)
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


def _prompt(args: argparse.Namespace) -> tuple[str | None, bool] | int:
    """The first prompt (None: none yet) and whether the interactive session opens; or the
    exit code of a one-line error. Reads the prompt from stdin when none was given and no
    terminal is there to type it; `--resume` without an id picks the session first."""
    from orchestrator.outcome import EXIT_USAGE

    if args.prompt is not None and args.words is not None:
        print("warren: give the prompt once: as PROMPT or with -p", file=sys.stderr)
        return EXIT_USAGE
    refused = sdk_refusal(args)
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
            prompt_parser().print_usage(sys.stderr)
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
    return prompt, interactive


def _session_config(args: argparse.Namespace) -> SessionConfig | int:
    """The session's options from the command line (Claude Code's flags translated by
    `orchestrator.claude_code.flags`), or the exit code of a one-line error."""
    import os

    from pydantic import ValidationError

    from orchestrator.outcome import EXIT_USAGE
    from orchestrator.session.config import DEFAULT_MODEL, SessionConfig

    claude_code = claude_code_config(args)
    if isinstance(claude_code, int):
        return claude_code
    try:
        return SessionConfig(
            **claude_code,
            cwd=(args.cwd or Path.cwd()).absolute(),
            model=args.model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
            output_format=args.output_format,
            max_turns=args.max_turns,
            max_concurrency=args.max_concurrency,
            max_budget_usd=args.max_budget_usd,
            compact_threshold=args.compact_threshold,
            max_thinking_tokens=args.max_thinking_tokens,
            allowed_tools=tool_list(args.allowed_tools),
            disallowed_tools=tool_list(args.disallowed_tools),
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


def _progress(
    args: argparse.Namespace, config: SessionConfig, *, at_terminal: bool, interactive: bool
) -> TerminalProgress | None:
    """The live progress on stderr of a headless run at a terminal (the interactive session
    draws its own; stream-json at a terminal is the progress)."""
    if (
        not at_terminal
        or interactive
        or (args.output_format == "stream-json" and sys.stdout.isatty())
    ):
        return None
    from orchestrator.cli.live_progress import TerminalProgress, stderr_console

    return TerminalProgress(stderr_console(), pause_on_ask=config.asks == "terminal")


def _parts(
    terminal: Path | None, known_floor: KnownFloor | None, spares: SpareSource | None
) -> SessionParts:
    """The session's concrete parts: the server's proven floor (and the host it was proven
    on) and spare tool hosts when a server forked this process, its client's terminal."""
    import dataclasses

    from orchestrator.cli.wiring import session_parts

    host = None
    if known_floor is not None:
        from sandbox.probe import reuse_known

        reused = reuse_known(known_floor)
        host = reused[0] if reused is not None else None
    parts = dataclasses.replace(session_parts(spares, host), known_floor=known_floor)
    if terminal is not None:
        parts = dataclasses.replace(parts, terminal=terminal)
    return parts


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
