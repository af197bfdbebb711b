"""Claude Code's names for Warren's things: each alias table written once, here.

Warren reads what was written for Claude Code (its flags, settings files, hook matchers, agent
definitions, an SDK host's requests) and answers in Claude Code's spellings where a reader
expects them (stream-json, hook inputs). The names differ in two places only:

- the subagent tool: Claude Code's `Task` (older) and `Agent` (newer) are Warren's
  `dispatch_agent`, in a tool list and in a rule (`Task(reviewer)`);
- the permission modes: `acceptEdits`, `dontAsk`, `bypassPermissions` are Warren's
  `accept-edits`, `dont-ask`, `bypass` (`default` and `plan` are spelled alike).

Every translation in `policies/` and `orchestrator/` goes through these tables; the Claude
Code room (orchestrator/claude_code/) uses them for flags, stream-json and the SDK protocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "CLAUDE_MODE_NAMES",
    "CLAUDE_SUBAGENT_TOOLS",
    "MODE_ALIASES",
    "SUBAGENT_TOOL",
    "WORKFLOW_TOOL",
    "claude_mode",
    "warren_mode",
    "warren_rule",
    "warren_tool",
]

SUBAGENT_TOOL: Final = "dispatch_agent"
"""Warren's name of the subagent tool."""
WORKFLOW_TOOL: Final = "Workflow"
"""The workflow tool, named as Claude Code names it (a rule `Workflow(NAME)` allows the saved
workflow NAME)."""
CLAUDE_SUBAGENT_TOOLS: Final[tuple[str, ...]] = ("Task", "Agent")
"""Claude Code's names of the subagent tool (older, newer)."""

CLAUDE_MODE_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "default": "default",
        "accept-edits": "acceptEdits",
        "plan": "plan",
        "dont-ask": "dontAsk",
        "bypass": "bypassPermissions",
    }
)
"""Each of Warren's modes (`policies.files.MODES`) as Claude Code spells it: what stream-json,
hook inputs and SDK hosts see."""
MODE_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {claude: warren for warren, claude in CLAUDE_MODE_NAMES.items() if claude != warren}
)
"""Claude Code's spellings that differ from Warren's, and the Warren mode each is."""

_SUBAGENT_RULE = re.compile(rf"^(?:{'|'.join(CLAUDE_SUBAGENT_TOOLS)})(?=\(|$)")


def warren_tool(name: str) -> str:
    """A tool name as Warren knows it (`Task`, `Agent` -> `dispatch_agent`)."""
    return SUBAGENT_TOOL if name in CLAUDE_SUBAGENT_TOOLS else name


def warren_rule(text: str) -> str:
    """A Claude Code rule as Warren writes it: `Task(x)` / `Agent(x)` are `dispatch_agent(x)`,
    a bare `Task` / `Agent` is `dispatch_agent`; everything else is the same syntax."""
    return _SUBAGENT_RULE.sub(SUBAGENT_TOOL, text.strip(), count=1)


def warren_mode(name: str) -> str | None:
    """The Warren mode `name` spells, in either spelling; None for no mode."""
    if name in CLAUDE_MODE_NAMES:
        return name
    return MODE_ALIASES.get(name)


def claude_mode(mode: str) -> str:
    """A Warren mode as Claude Code spells it (an unknown name unchanged)."""
    return CLAUDE_MODE_NAMES.get(mode, mode)
