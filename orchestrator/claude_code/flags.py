"""Claude Code's flags on Warren's command line (issue 16), and what they mean in Warren's terms.

Scripts and SDKs written for `claude -p` call `warren` with Claude Code's spellings: its
aliases of Warren's options (`--allowedTools`), its own options (`--system-prompt`,
`--add-dir`, `--settings`, ...), the flags an SDK host drives it with (`--input-format
stream-json`, `--permission-prompt-tool stdio`) and the permission modes as it spells them
(`acceptEdits`). Every flag the pinned `claude-agent-sdk` (0.2.184,
`SubprocessCLITransport._build_command`) can put on a command line works, or is an error that
names it; none is accepted and then ignored (tests/orchestrator/test_cli_claude_code.py holds
the list against the SDK's builder).

The front end (orchestrator/cli/options.py) declares them with `add_flags` and turns what was
parsed into a session's options with `claude_code_config`; the rest of Warren never sees a
Claude Code spelling. The name tables themselves are `policies.claude_names`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

from policies.claude_names import CLAUDE_MODE_NAMES, MODE_ALIASES, warren_mode, warren_tool

__all__ = [
    "PERMISSION_MODE_CHOICES",
    "SETTING_SOURCES",
    "UNSUPPORTED_CLAUDE_CODE_FLAGS",
    "add_flags",
    "claude_code_config",
    "sdk_refusal",
]

PERMISSION_MODE_CHOICES: Final[tuple[str, ...]] = (*CLAUDE_MODE_NAMES, *MODE_ALIASES)
"""What `--permission-mode` takes: Warren's modes, and Claude Code's spellings of them."""

SETTING_SOURCES: Final = frozenset({"user", "project", "local"})
"""The Claude Code settings levels `--setting-sources` may name."""

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


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Declare Claude Code's flags on `parser`, after Warren's own run options: an SDK host's
    first, then Claude Code's spellings (the table of refused flags skips what is declared
    already), then the SDK's one fallback."""
    _sdk_host_options(parser)
    _claude_code_options(parser)
    _sdk_fallbacks(parser)


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


def _sdk_host_options(parser: argparse.ArgumentParser) -> None:
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


def sdk_refusal(args: argparse.Namespace) -> str | None:
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


def claude_code_config(args: argparse.Namespace) -> dict[str, object] | int:
    """The session settings Claude Code's flags (and `--permission-mode`) give, by
    `SessionConfig` field, in Warren's names; or the exit code of a one-line error."""
    from orchestrator.outcome import EXIT_USAGE

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
        unknown = sorted(names - SETTING_SOURCES)
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
