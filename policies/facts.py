"""What a tool says about itself, as a plain value the policy layer can decide on.

Each tool class (orchestrator/tools/*.py) declares its `ToolFacts`; the orchestrator hands
them to `PolicyEngine.decide` with every call. Policies therefore never keep a table of tool
names: a rule keyword such as `Read(...)` covers every tool of the `read` family, and the
path a path rule is matched against is whichever input field the tool declares a path. A new
file tool that declares `family="read", path_fields=("file_path",)` is covered by every
`Read(...)` deny rule without a change here (tests/policies/test_engine.py,
`test_new_read_tool_is_covered_by_read_rules`).

The value lives here rather than in the orchestrator so that `policies` keeps importing
nothing of `orchestrator` (DESIGN.md, "Packages").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Family", "ToolFacts"]

Family = Literal["read", "edit", "exec", "agent", "external", "meta"]
"""What kind of thing a tool does.

- `read`: reads files by path (`Read(...)` rules cover the family);
- `edit`: changes files by path (`Edit(...)` rules, protected paths, `accept-edits` mode);
- `exec`: runs commands (its command field is classified by the Bash analyser);
- `agent`: hands work to a subagent;
- `external`: reaches outside Warren (MCP tools, anything a tool cannot vouch for);
- `meta`: touches nothing (Think).
"""


@dataclass(frozen=True, slots=True)
class ToolFacts:
    """The facts a tool declares, the same for every call of it."""

    family: Family
    """What kind of thing the tool does (see `Family`)."""
    path_fields: tuple[str, ...] = ()
    """Input fields that hold a path the call reads or changes, in order of importance; path
    rules and the built-in checks (protected paths, masked secrets) match the first present.
    Empty for tools that take no path."""
    path_defaults_to_workspace: bool = False
    """A call without any path field works on the workspace (Glob, Grep): rules then match
    the workspace root. False: such a call has no path to match."""
    command_field: str | None = None
    """The input field holding a shell command line that the policy's Bash analyser
    classifies (its read-only verdict is the analyser's, never the tool's). None: not a shell
    tool."""
    runs_in_coordinator: bool = False
    """The call runs in the coordinator, not in a sandboxed tool host, because it touches no
    workspace itself (dispatch_agent hands the work to a sandboxed pool worker)."""
