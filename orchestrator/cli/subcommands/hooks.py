"""`warren hooks ...`: the hooks in force, listed and tried by hand. One function per
subcommand (`_list`, `_test`), each added by `add_commands`.

    warren hooks list [--cwd DIR]
    warren hooks test EVENT [--input FILE] [--cwd DIR]

`list` prints the hooks in force with the file each comes from (Warren's `[[hooks]]` and
Claude Code's settings), then those declared that do not run: unsupported ones (a `type:
"prompt"` hook, an event Warren does not have) and an untrusted repository's, per file.

`test` runs the hooks the effective policy has for EVENT (an untrusted repository's are not
among them) against a sample input (Claude Code's field names; `--input` a JSON file, `-` for
stdin; default: a plausible event), exactly as a session would (under the floor, with their
timeouts), and prints what each one returned and the merged answer. Nothing else runs: no
model, no tool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from orchestrator.cli.subcommands.parsers import Subcommands, add_cwd, command_group

if TYPE_CHECKING:
    from orchestrator.calls.plan import CallPlan
    from orchestrator.hooks.runner import HookOutcome

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> Subcommands:
    """Add `hooks` to the `warren` subparsers; returns its parser's subcommands' parent so
    more subcommands (`hooks list`) can be added beside `test`."""
    from policies.files import HookEvent

    commands = command_group(sub, "hooks", summaries)
    listing = commands.add_parser(
        "list",
        help="the hooks in force with their files (Warren's [[hooks]] and Claude Code's "
        "settings), and those that do not run",
        description="warren hooks list [--cwd DIR]: the hooks in force with their files, then "
        "unsupported ones and an untrusted repository's (which do not run)",
    )
    add_cwd(listing)
    listing.set_defaults(handler=_list)
    test = commands.add_parser(
        "test",
        help="run the hooks of EVENT against a sample input and print what each returned",
        description="Run the hooks in force for EVENT (under the floor, as a session would) "
        "against a sample input and print each one's exit code, output and decision.",
    )
    test.add_argument("event", choices=get_args(HookEvent), metavar="EVENT", help="the event")
    test.add_argument(
        "--input",
        type=Path,
        default=None,
        help="a JSON object with the event's fields (Claude Code's names), `-` for stdin",
    )
    add_cwd(test)
    test.add_argument(
        "--sandbox",
        choices=["required", "off"],
        default="required",
        help="required (default): hooks run under the floor; off: as plain processes",
    )
    test.set_defaults(handler=_test)
    return commands


def _list(args: argparse.Namespace) -> int:
    from orchestrator.cli.subcommands.policy import printed
    from policies import commands

    return printed(commands.hooks_list((args.cwd or Path.cwd()).absolute()))


def _test(args: argparse.Namespace) -> int:
    import trio

    try:
        data = _sample(args.input)
    except (OSError, ValueError) as exc:
        print(f"warren hooks test: cannot read the input: {exc}", file=sys.stderr)
        return 2
    return trio.run(_run_test, args, data)


def _sample(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("the input must be a JSON object")
    return data


async def _run_test(args: argparse.Namespace, data: dict[str, Any]) -> int:
    from orchestrator.calls.policy import load_session_policy
    from orchestrator.errors import ConfigError
    from orchestrator.hooks.events import sample_input
    from orchestrator.session.hooks import build_hook_runner

    cwd = (args.cwd or Path.cwd()).absolute().resolve()
    sandboxed = args.sandbox == "required"
    try:
        policy = load_session_policy(cwd, floor_proven=sandboxed)
    except ConfigError as exc:
        print(f"warren hooks test: {exc}", file=sys.stderr)
        return 2
    runner = build_hook_runner(policy, workspace=cwd, sandboxed=sandboxed)
    common = {
        "session_id": "hooks-test",
        "transcript_path": "",
        "cwd": str(cwd),
        "permission_mode": policy.mode,
    }
    try:
        event_input = sample_input(args.event, common, data)
    except (TypeError, ValueError) as exc:
        print(f"warren hooks test: the input does not fit {args.event}: {exc}", file=sys.stderr)
        return 2
    plan = _plan(policy, data) if args.event in ("PreToolUse", "PostToolUse") else None
    name = getattr(event_input, "source", None) or getattr(event_input, "trigger", None)
    selected = runner.matching(args.event, plan=plan, name=name)
    origin = "" if policy.effective.trust != "untrusted" else " (this repository is not trusted)"
    if not selected:
        print(f"no {args.event} hook matches this input{origin}")
        return 0
    outcome = await runner.run(event_input, plan=plan, name=name)
    _print(outcome)
    return 0


def _plan(policy: Any, data: dict[str, Any]) -> CallPlan:
    """The call a PreToolUse/PostToolUse sample describes, planned as the pipeline would
    (so rule matchers see the same call)."""
    import pydantic

    from orchestrator.calls.plan import CallPlan, plan_call
    from orchestrator.messages import ToolUseBlock
    from orchestrator.tools.registry import builtin_tools

    name = str(data.get("tool_name", "Bash"))
    raw = data.get("tool_input", {"command": "true"})
    block = ToolUseBlock(id="toolu_test", name=name, input=raw if isinstance(raw, dict) else {})
    tool = builtin_tools().get(name)
    if tool is None:
        return CallPlan(block, None, None, f"no built-in tool {name}")
    try:
        parsed = tool.parse_input(block.input)
    except pydantic.ValidationError as exc:
        return CallPlan(block, tool, None, str(exc))
    return plan_call(block, tool, parsed, policy.assessor())


def _print(outcome: HookOutcome) -> None:
    from orchestrator.text import escape_controls

    for run in outcome.runs:
        out = run.output
        status = "did not finish" if run.exit_code is None else f"exit {run.exit_code}"
        print(f"{escape_controls(run.hook.label)} from {run.hook.source}: {status}, "
              f"{run.duration_s * 1000:.0f} ms")  # fmt: skip
        if out.error:
            print(f"  error (not blocking): {escape_controls(out.error)}")
        if out.blocked:
            print(f"  blocked: {escape_controls(out.reason or '')}")
        if out.permission:
            print(f"  permission: {out.permission}")
        if out.updated_input is not None:
            print(f"  updatedInput: {json.dumps(out.updated_input)}")
        if out.context:
            print(f"  context: {escape_controls(out.context, keep_lines=True)}")
        if out.stop:
            print(f"  continue: false ({escape_controls(out.stop_reason or '')})")
        for label, text in (("stdout", run.stdout), ("stderr", run.stderr)):
            if text.strip():
                shown = "\n".join(text.strip()[:500].splitlines()[:10])
                print(f"  {label}: {escape_controls(shown, keep_lines=True)}")
    verdict = outcome.permission or ("block" if outcome.blocked else "none")
    print(f"merged: blocked={outcome.blocked} decision={verdict}")
