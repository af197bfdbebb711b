"""`warren undo [SESSION]`: put back the files of a session's last writing turn.

    warren undo [SESSION] [--cwd DIR]
    warren undo --gc

Without an id, the newest session of the directory that recorded a writing turn. One line
says what happened; exit 0 when the turn was undone, 1 when it was not (nothing changed),
2 for a bad session id. `--gc` prunes the content store now (orchestrator/changes/store_gc.py; a
session's end does it once a day): exit 0, or 1 when a running session holds the store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.changes import store_gc
from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.recorder import change_log_path
from orchestrator.changes.undo import undo_last_turn
from orchestrator.cli.subcommands.parsers import add_cwd, command_parser
from orchestrator.errors import SessionError
from orchestrator.records.transcripts import SessionStore
from orchestrator.text import escape_controls

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `undo` to the `warren` subparsers."""
    undo = command_parser(
        sub,
        "undo",
        summaries,
        more=". Refuses, changing nothing, when a file was touched after that turn.",
    )
    undo.add_argument(
        "session",
        nargs="?",
        default=None,
        metavar="SESSION",
        help="the session id (default: the newest of this directory with a writing turn)",
    )
    add_cwd(undo, of="the directory")
    undo.add_argument(
        "--gc",
        action="store_true",
        help=f"instead: prune the stored contents no undo can need (sessions older than "
        f"{store_gc.MAX_AGE_DAYS} days; at most {store_gc.MAX_STORE_BYTES >> 20} MiB kept)",
    )
    undo.set_defaults(handler=_undo)


def _undo(args: argparse.Namespace) -> int:
    from orchestrator.paths import WarrenDirs

    dirs = WarrenDirs.from_env()
    if args.gc:
        return _gc(dirs.state, dirs.objects, dirs.sessions)
    store = SessionStore(dirs.sessions)
    if args.session is not None:
        try:
            log = change_log_path(store.path_for(args.session))
        except SessionError as exc:
            print(f"warren undo: {exc}", file=sys.stderr)
            return 2
        session_id = args.session
    else:
        cwd = (args.cwd or Path.cwd()).resolve()
        found = next(
            (
                summary.session_id
                for summary in store.summaries(cwd)
                if change_log_path(store.path_for(summary.session_id)).is_file()
            ),
            None,
        )
        if found is None:
            where = escape_controls(str(cwd))
            print(f"warren undo: no session in {where} recorded a writing turn", file=sys.stderr)
            return 1
        session_id, log = found, change_log_path(store.path_for(found))
    with store_gc.hold(dirs.objects):
        outcome = undo_last_turn(log, ContentStore(dirs.objects))
    line = escape_controls(f"session {session_id}: {outcome.message}")
    if outcome.undone:
        print(f"warren undo: {line}")
        return 0
    print(f"warren undo: {line}", file=sys.stderr)
    return 1


def _gc(state: Path, objects: Path, sessions: Path) -> int:
    try:
        collected = store_gc.collect(state, objects, sessions)
    except OSError as exc:
        print(f"warren undo --gc: {escape_controls(str(exc))}", file=sys.stderr)
        return 1
    print(f"warren undo --gc: {collected.line()}", file=sys.stdout if collected.ran else sys.stderr)
    return 0 if collected.ran else 1
