"""`warren sessions` and the `--resume` picker: past sessions of a directory, newest first.

    warren sessions [--cwd DIR] [--all] [--limit N]
    warren --resume [-p PROMPT]      (no id, at a terminal: pick one from a numbered list)

Each row: the session id, when it started, its turns and cost so far, and the head of its
first prompt on one line. The summaries come from `SessionStore.summaries` (a small file per
session, never a whole transcript). Every field was written by the user or the model, so it is
escaped (`escape_controls`) and cut to one line before it reaches the terminal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.cli.subcommands.parsers import add_cwd, command_parser
from orchestrator.records.transcripts import SessionStore, SessionSummary
from orchestrator.text import escape_controls

__all__ = ["add_commands", "pick_session", "session_rows"]

_PICKER_ROWS = 15
"""Sessions the `--resume` picker offers (the newest)."""


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `sessions` to the `warren` subparsers."""
    sessions = command_parser(
        sub,
        "sessions",
        summaries,
        more="; resume one with `warren --resume ID -p PROMPT` (or `warren --resume` to pick)",
    )
    add_cwd(sessions, of="the directory")
    sessions.add_argument(
        "--all", action="store_true", help="the sessions of every directory, with their cwd"
    )
    sessions.add_argument(
        "--limit", type=int, default=20, metavar="N", help="show the newest N (default 20)"
    )
    sessions.set_defaults(handler=_list)


def _store() -> SessionStore:
    from orchestrator.paths import WarrenDirs

    return SessionStore(WarrenDirs.from_env().sessions)


def _one_line(text: str | None, width: int) -> str:
    """`text` on one line, control characters escaped, cut to `width` characters."""
    if not text:
        return "-"
    flat = escape_controls(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def session_rows(found: list[SessionSummary], *, with_cwd: bool = False) -> list[str]:
    """The listing's lines: a header, then one line per session."""
    lines = [f"{'ID':36}  {'STARTED':16}  {'TURNS':>5}  {'COST':>8}  {'TASKS':>5}  FIRST PROMPT"]
    for summary in found:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary.started))
        turns = "?" if summary.turns is None else str(summary.turns)
        cost = "?" if summary.cost_usd is None else f"${summary.cost_usd:.4f}"
        tasks = "?" if summary.tasks is None else str(summary.tasks)
        prompt = _one_line(summary.first_prompt, 70)
        where = f"  ({_one_line(summary.cwd, 60)})" if with_cwd else ""
        lines.append(
            f"{summary.session_id:36}  {started:16}  {turns:>5}  {cost:>8}  {tasks:>5}  "
            f"{prompt}{where}"
        )
    return lines


def _list(args: argparse.Namespace) -> int:
    cwd = (args.cwd or Path.cwd()).resolve()
    if args.limit < 1:
        print("warren: --limit must be at least 1", file=sys.stderr)
        return 2
    found = _store().summaries(None if args.all else cwd)
    if not found:
        where = "anywhere" if args.all else f"in {_one_line(str(cwd), 200)}"
        print(f"no sessions {where} yet" + ("" if args.all else " (--all lists every one)"))
        return 0
    for line in session_rows(found[: args.limit], with_cwd=args.all):
        print(line)
    if len(found) > args.limit:
        print(f"... {len(found) - args.limit} older (--limit {len(found)} shows them all)")
    return 0


def pick_session(cwd: Path) -> str | None:
    """Offer this directory's newest sessions on stderr and read a number from stdin (a
    terminal); the chosen session id, or None when the user picked none.

    **Errors:** `EOFError` at the end of input (Ctrl-D); `KeyboardInterrupt` on Ctrl-C.
    """
    found = _store().summaries(cwd)[:_PICKER_ROWS]
    if not found:
        print(
            f"warren: no session to resume in {_one_line(str(cwd), 200)} "
            "(`warren sessions --all` lists every directory's)",
            file=sys.stderr,
        )
        return None
    header, *rows = session_rows(found)
    print(f"     {header}", file=sys.stderr)
    for number, row in enumerate(rows, 1):
        print(f"{number:>3}  {row}", file=sys.stderr)
    while True:
        print(f"resume which session? [1-{len(rows)}, Enter for none] ", end="", file=sys.stderr)
        sys.stderr.flush()
        answer = input().strip()
        if not answer:
            return None
        if answer.isdigit() and 1 <= int(answer) <= len(rows):
            return found[int(answer) - 1].session_id
        print(f"  {_one_line(answer, 20)} is not one of the numbers", file=sys.stderr)
