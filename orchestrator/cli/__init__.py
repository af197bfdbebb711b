"""The `warren` command: the one composition root, where flags become a `Session` and the
orchestrator is wired to the sandbox, the tool hosts, the worker pool and the broker.

    main.py         the command line: `warren [PROMPT]`, `-p`, and the subcommands
    options.py      the options of a run (Claude Code's declared by orchestrator/claude_code/)
    in_process.py   a run in this process: its argv read into a SessionConfig, then run
    run.py          a headless run: a Session, its result, signals and the exit code
    stream_input.py a session served to an SDK host (`--input-format stream-json`)
    wiring.py       the concrete parts a session gets (tool hosts, worker pool, broker)
    subcommands/    one module per subcommand: doctor, policy, hooks, mcp, sessions, undo
    commands.py     the subcommands' names and summaries (standard library only)
    client.py       the thin client: a run handed to the warm server (standard library only)
    warm/           `warren server`: the per-user server that forks a session process per run

Entry point: `warren = "orchestrator.cli:run_and_exit"` (pyproject.toml). It imports only
the standard library and the thin client until it knows the warm server will not take the
run (`tests/orchestrator/server/test_client_imports.py`): a warm launch is that cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself costs a warm launch milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

__all__ = ["main", "run_and_exit"]


def run_and_exit() -> NoReturn:
    """The `warren` command: hand a run to the warm server when one takes it and exit with
    its session's code; otherwise (a subcommand, no server) run it here
    (`orchestrator.cli.main` for a subcommand, `orchestrator.cli.in_process` for a run)."""
    import os
    import sys

    from orchestrator.cli.client import run_through_server
    from orchestrator.cli.commands import is_command

    argv = sys.argv[1:]
    if is_command(argv):
        from orchestrator.cli.in_process import exit_now
        from orchestrator.cli.main import run_command

        exit_now(run_command(argv))
    code = run_through_server(argv)
    if code is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    from orchestrator.session import startup_gc

    startup_gc.pause()  # resumed when the run's parts start
    from orchestrator.cli.in_process import exit_now, run_in_process

    exit_now(run_in_process(argv))


def __getattr__(name: str) -> Callable[..., int]:
    """`orchestrator.cli.main` is loaded only when asked for (`from orchestrator.cli import
    main`)."""
    if name == "main":
        from orchestrator.cli.main import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
