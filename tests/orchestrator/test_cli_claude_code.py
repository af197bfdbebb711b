"""Claude Code's flags at Warren's parser (issue 16, item 1), held against the pinned
`claude-agent-sdk`: every flag its command builder can emit is declared (it works, or it is
an error naming it), and what the SDK passes by default parses into a session's options."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from pathlib import Path

import pytest

from orchestrator.claude_code import flags as cc_flags
from orchestrator.cli import options as cli_options

cli = importlib.import_module("orchestrator.cli.main")  # the package exports `main`, a function


def _sdk_flags() -> set[str]:
    """Every `--flag` the SDK's `_build_command` can write (its source, read: `extra_args`
    aside, the builder writes only literal flags)."""
    from claude_agent_sdk._internal.transport.subprocess_cli import SubprocessCLITransport

    source = inspect.getsource(SubprocessCLITransport._build_command)
    flags = set(re.findall(r'"(--[a-zA-Z][a-zA-Z-]*)', source))
    return flags | set(re.findall(r'f"(--[a-zA-Z][a-zA-Z-]*)=', source))


def _declared(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_every_flag_the_sdk_can_emit_is_declared() -> None:
    flags = _sdk_flags()
    assert {"--allowedTools", "--system-prompt", "--setting-sources", "--fork-session"} <= flags
    missing = flags - _declared(cli_options.prompt_parser())
    assert not missing, f"Claude Code flags Warren neither supports nor refuses: {missing}"


@pytest.mark.parametrize("flag", sorted(cc_flags.UNSUPPORTED_CLAUDE_CODE_FLAGS))
def test_an_unsupported_flag_is_an_error_naming_it(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    takes_value, what = cc_flags.UNSUPPORTED_CLAUDE_CODE_FLAGS[flag]
    argv = ["-p", "hi", flag, *(["x"] if takes_value else [])]
    parser = cli_options.prompt_parser()
    if flag not in {
        a.option_strings[0] for a in parser._actions if isinstance(a, cc_flags._Unsupported)
    }:
        pytest.skip(f"{flag} is supported now")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    assert (
        f"{flag} is a Claude Code flag Warren does not support ({what})" in capsys.readouterr().err
    )


def test_the_sdks_spellings_become_warrens_options(tmp_path: Path) -> None:
    """What `ClaudeAgentOptions(...)` makes the SDK pass (input format aside, the other
    helper's), through the parser and into the session's options."""
    argv = [
        "--output-format", "stream-json", "--verbose", "--system-prompt", "",
        "--allowedTools", "Bash(npm test *),Read", "--disallowedTools", "WebFetch",
        "--permission-mode", "bypassPermissions", "--add-dir", str(tmp_path),
        "--session-id=0b5f3a3e-6a43-4a8e-9d55-1c2b3d4e5f60", "--setting-sources=user,project",
        "--tools", "Read,Task", "--max-thinking-tokens", "2048", "-p", "hi",
    ]  # fmt: skip
    args = cli_options.prompt_parser().parse_args(argv)
    options = cc_flags.claude_code_config(args)
    assert not isinstance(options, int)
    assert options["system_prompt"] == ""
    assert options["permission_mode"] == "bypass"
    assert options["add_dirs"] == (tmp_path.resolve(),)
    assert options["tools"] == ("Read", "dispatch_agent")
    assert options["setting_sources"] == frozenset({"user", "project"})
    assert cli_options.tool_list(args.allowed_tools) == frozenset({"Bash(npm test *)", "Read"})
    assert args.verbose and args.max_thinking_tokens == 2048


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dangerously-skip-permissions", "--permission-mode", "plan"], "cannot be used with"),
        (["--add-dir", "/no/such/dir"], "not a directory"),
        (["--setting-sources", "user,policy"], "unknown source policy"),
        (["--system-prompt", "a", "--system-prompt-file", "f"], "not both"),
    ],
)
def test_contradictions_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cli_options.prompt_parser().parse_args(["-p", "hi", *argv])
    assert cc_flags.claude_code_config(args) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("warren: ") and message in line


def test_dangerously_skip_permissions_is_bypass() -> None:
    args = cli_options.prompt_parser().parse_args(["-p", "hi", "--dangerously-skip-permissions"])
    options = cc_flags.claude_code_config(args)
    assert not isinstance(options, int) and options["permission_mode"] == "bypass"


def test_a_subcommands_option_is_not_read_as_a_claude_code_flag() -> None:
    """`--all` once abbreviated `--allowed-tools` alone; with `--allowedTools` beside it the
    top-level parser called it ambiguous before `sessions` could read it."""
    args = cli.build_parser().parse_args(["sessions", "--all"])
    assert args.command == "sessions" and args.all
