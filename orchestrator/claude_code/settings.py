"""`--settings`: a Claude Code settings file named on the command line, or its JSON text.

Reading Claude Code's settings files is the policy's own work (`policies.claude_settings`:
policy loading and trust hashing need it, and `policies/` imports nothing of the
orchestrator's); what the command line adds is only telling a file from its text, here. The
session's policy (orchestrator/calls/policy.py) puts the result at the command line's level.
"""

from __future__ import annotations

from pathlib import Path

from policies.claude_settings import ClaudeSettings, parse_claude_settings, read_claude_settings
from policies.sources import PolicyError

__all__ = ["settings_flag"]


def settings_flag(value: str) -> ClaudeSettings:
    """`--settings`: JSON text (it starts with `{`) or the path of a settings file.

    **Errors:** `PolicyError` naming `--settings` or the file.
    """
    if value.lstrip().startswith("{"):
        return parse_claude_settings(value, file="--settings")
    path = Path(value).expanduser()
    found = read_claude_settings(path)
    if found is None:
        raise PolicyError("no such file", file=str(path), key="--settings")
    return found
