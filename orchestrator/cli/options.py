"""The options of a run, `warren [options] [PROMPT]`: Warren's own and, declared by the Claude
Code room (`orchestrator.claude_code.flags`), Claude Code's.

`add_run_options` puts them on a parser (the whole command line's in `orchestrator.cli.main`,
or `prompt_parser`'s, which reads a run's argv: `orchestrator.cli.in_process`). Cheap to
import: argparse and the name tables only, nothing a run needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.claude_code.flags import PERMISSION_MODE_CHOICES, add_flags
from policies.claude_names import MODE_ALIASES

__all__ = ["EXIT_CODES", "add_run_options", "prompt_parser", "tool_list"]

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


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a run (`warren [PROMPT]`, `warren -p PROMPT`): Warren's, then Claude
    Code's."""
    _what_to_run(parser)
    _how_to_run(parser)
    add_flags(parser)


def prompt_parser() -> argparse.ArgumentParser:
    """`warren [options] PROMPT`: the run options and the prompt as a positional."""
    parser = argparse.ArgumentParser(
        prog="warren", usage="warren [options] [PROMPT]", epilog=EXIT_CODES
    )
    add_run_options(parser)
    parser.add_argument("words", nargs="?", metavar="PROMPT", help="the prompt")
    return parser


def _what_to_run(parser: argparse.ArgumentParser) -> None:
    """A run's prompt, output, limits, model and workspace."""
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


def _how_to_run(parser: argparse.ArgumentParser) -> None:
    """What a run may do, which session it continues, where it runs, what it shows."""
    parser.add_argument(
        "--permission-mode",
        choices=PERMISSION_MODE_CHOICES,
        default=None,
        help="default: read-only calls run, others ask (denied when headless); accept-edits: "
        "edits in the workspace run too; plan: read-only tools only; dont-ask: asks become "
        "denials; bypass: everything except deny rules, protected paths and critical deletes, "
        "which include a delete hidden in text the shell evaluates later (arithmetic, let, "
        "declare -i, eval or sh -c of text not literal, when the command holds rm, unlink, "
        "rmdir, shred, truncate, mv, find -delete, git clean or git reset --hard) and any "
        "text decoded or generated and then run (base64 -d | sh, bash <(...), eval \"$(...)\") "
        f"(default: the policy files' mode; Claude Code's spellings {', '.join(MODE_ALIASES)} "
        "are the same modes)",
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
    parser.add_argument(
        "--no-server",
        action="store_true",
        help="run in this process even when a warm server is running (or set "
        "WARREN_NO_SERVER=1); `warren server --help` explains the server",
    )


def tool_list(values: list[str] | None) -> frozenset[str]:
    """The rules given to --allowed-tools / --disallowed-tools, each split the policy's way
    (commas and blanks between rules, never inside `Bash(npm run test:*)`)."""
    from policies.files import PolicyError, split_tool_list

    try:
        return frozenset(split_tool_list(values or []))
    except PolicyError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
