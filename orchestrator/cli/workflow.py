"""`warren workflow`: run a saved workflow, resume a stopped run, list the runs.

    warren workflow run NAME [ARGS...] [--args JSON] [run options]
    warren workflow resume RUN_ID [run options]
    warren workflow list [--cwd DIR]

`run` and `resume` open a headless session with the run options a prompt would take
(`--permission-mode`, `--pool ray`, `--allowedTools`, `--cwd`, ...) and run the workflow in the
foreground: its phases and agents on stderr, its result as JSON on stdout. Words after the name
are the script's `args`, as one string; `--args` gives a JSON value instead. Exit 0 when the
run completed, 1 when it failed, 2 for a bad command line or a workflow that cannot start, and
128 + the signal when stopped (the run can then be resumed: the line says how).
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from orchestrator.events import Event, WorkflowChanged
from orchestrator.outcome import EXIT_USAGE
from orchestrator.text import escape_controls

__all__ = ["WorkflowRequest", "workflow_main"]

USAGE = (
    "usage: warren workflow run NAME [ARGS...] [--args JSON] [run options]\n"
    "       warren workflow resume RUN_ID [run options]\n"
    "       warren workflow list [--cwd DIR]"
)
HELP = (
    "run and resume open a headless session with the run options a prompt takes "
    "(--permission-mode, --pool ray, --allowedTools, --cwd, ...) and run the workflow in the "
    "foreground: its phases and agents on stderr, its result as JSON on stdout. Words after "
    "the name are the script's args, as one string; --args gives a JSON value instead. Exit 0 "
    "when the run completed, 1 when it failed, 2 for a bad command line or a workflow that "
    "cannot start, 128 + the signal when stopped (resume it then)."
)


@dataclass(frozen=True)
class WorkflowRequest:
    """What to run: a saved workflow by name with its args, or an earlier run to resume."""

    name: str | None = None
    args: Any = None
    resume: str | None = None


def workflow_main(argv: list[str]) -> int:
    """`warren workflow ARGV` (see the module docstring)."""
    if argv[:1] in (["-h"], ["--help"]):  # as argparse does for every other command
        print(f"{USAGE}\n\n{HELP}")
        raise SystemExit(0)
    if not argv:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    action, rest = argv[0], argv[1:]
    if action == "list":
        return _list(rest)
    if action not in ("run", "resume") or not rest or rest[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    target, rest = rest[0], rest[1:]
    if action == "resume":
        return _run(WorkflowRequest(resume=target), rest)
    words: list[str] = []
    while rest and not rest[0].startswith("-"):
        words.append(rest.pop(0))
    args: Any = " ".join(words) if words else None
    if "--args" in rest:
        at = rest.index("--args")
        if at + 1 >= len(rest):
            print("warren workflow: --args needs a JSON value", file=sys.stderr)
            return EXIT_USAGE
        try:
            args = json.loads(rest[at + 1])
        except ValueError as exc:
            print(f"warren workflow: --args is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
        del rest[at : at + 2]
    return _run(WorkflowRequest(name=target, args=args), rest)


def _run(request: WorkflowRequest, options: list[str]) -> int:
    from orchestrator.cli.in_process import session_config, session_parts_here
    from orchestrator.cli.options import prompt_parser

    try:
        parsed = prompt_parser().parse_args([*options, "-p", "workflow"])
    except SystemExit as exc:  # argparse said why on stderr
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    config = session_config(parsed)
    if isinstance(config, int):
        return config
    parts = session_parts_here()
    printer = _ProgressLines(quiet=parsed.quiet)
    parts = replace(parts, extra_sinks=(*parts.extra_sinks, printer))
    try:
        return trio.run(_run_session, config, parts, request)
    except KeyboardInterrupt:
        print("warren: interrupted", file=sys.stderr)
        return 130


async def _run_session(config: Any, parts: Any, request: WorkflowRequest) -> int:
    from orchestrator.errors import ConfigError, SessionError
    from orchestrator.session.open import open_session
    from orchestrator.workflows.meta import WorkflowError

    stopped: list[int] = []
    record = None
    opened: list[Any] = []
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        nursery.start_soon(_watch_signals, scope, stopped)
        refused: str | None = None
        try:
            with scope:
                async with open_session(config, parts) as session:
                    opened.append(session)
                    try:  # here: leaving the session's nurseries, it would be a group
                        record = await session.run_workflow(_start(session, request))
                    except (SessionError, WorkflowError) as exc:
                        refused = str(exc)
        except ConfigError as exc:
            refused = str(exc)
        finally:
            nursery.cancel_scope.cancel()
    if refused is not None:
        print(f"warren workflow: {escape_controls(refused)}", file=sys.stderr)
        return EXIT_USAGE
    if record is not None:
        _say_end(record)
        return 0 if record.status == "completed" else 1
    runs = opened[0].workflows if opened else None
    live = list(runs.live) if runs is not None else []
    _say(
        "warren: workflow stopped"
        + (f"; resume it with: warren workflow resume {live[-1]}" if live else "")
    )
    return 128 + (stopped[0] if stopped else signal.SIGINT)


def _start(session: Any, request: WorkflowRequest) -> Any:
    """The `RunStart` of a request, its script found in the session's saved workflows or
    the earlier run's directory."""
    from orchestrator.workflows.runs import RunStart

    runs = session.workflows
    if runs is None:
        return RunStart("", None)  # run_workflow says why
    if request.resume is not None:
        earlier = runs.earlier(request.resume)
        _say(f"warren: resuming workflow run {earlier.run_id} ({earlier.name})")
        return RunStart(
            runs.store.script(earlier.run_id), earlier.args, saved=None, resume=earlier.run_id
        )
    assert request.name is not None
    return RunStart(runs.saved(request.name), request.args, saved=request.name)


async def _watch_signals(scope: trio.CancelScope, stopped: list[int]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            stopped.append(signum)
            scope.cancel()


def _say_end(record: Any) -> None:
    if record.status == "completed":
        print(json.dumps(record.result, ensure_ascii=False, indent=2))
        _say(f"warren: workflow {record.name} ({record.run_id}) completed")
    else:
        _say(f"warren: workflow {record.name} ({record.run_id}) failed: {record.error}")


def _say(line: str) -> None:
    try:
        sys.stderr.write(escape_controls(line) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _ProgressLines:
    """A run's phases and agents as lines on stderr (`--quiet`: none)."""

    def __init__(self, *, quiet: bool) -> None:
        self._quiet = quiet

    def __call__(self, event: Event) -> None:
        if self._quiet or not isinstance(event, WorkflowChanged):
            return
        if event.what == "phase":
            _say(f"workflow {event.name}: phase {event.text}")
        elif event.what == "log":
            _say(f"workflow {event.name}: {event.text}")
        elif event.status in ("done", "failed", "cached"):
            tokens = f", {event.tokens} tokens" if event.tokens else ""
            _say(f"  [{event.key}] {event.label}: {event.status}{tokens}")


def _list(rest: list[str]) -> int:
    from orchestrator.paths import WarrenDirs
    from orchestrator.workflows.journal import WorkflowStore

    cwd = Path.cwd()
    if rest[:1] == ["--cwd"] and len(rest) == 2:
        cwd = Path(rest[1])
    elif rest:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    store = WorkflowStore(WarrenDirs.from_env().workflows)
    runs = [r for r in store.runs() if Path(r.workspace) == cwd.resolve()]
    if not runs:
        print("no workflow runs in this directory")
        return 0
    print(f"{'RUN':16} {'STATUS':10} {'NAME':20} DESCRIPTION")
    for record in runs:
        print(f"{record.run_id:16} {record.status:10} {record.name[:20]:20} {record.description}")
    return 0

