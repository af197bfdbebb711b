"""The set of tools a run offers the model, by name.

The registry is a value built per session (tools may hold per-session collaborators such as the
Bash command classifier); `builtin_tools()` is the standard set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.tools.base import Tool
from policies.claude_names import SUBAGENT_TOOL
from policies.facts import ToolFacts

if TYPE_CHECKING:
    from orchestrator.model.base import ToolSpec

__all__ = [
    "DISPATCH_AGENT_FACTS",
    "STATELESS_TOOLS",
    "ToolRegistry",
    "ToolSource",
    "builtin_facts",
    "builtin_tools",
]

STATELESS_TOOLS: tuple[str, ...] = ("Read", "Glob", "Grep", "LS", "Think")
"""The built-in tools whose facts say they only read (family read or meta): they cannot change
anything and leave no state behind (no shell). A Warren agent type that names no tools gets
them (`general` adds Bash, read-only by its sandbox), and a Claude Code definition naming any
other tool is a writable type (tests/orchestrator/test_tool_facts.py keeps this list equal to
the tools' declared facts)."""

DISPATCH_AGENT_FACTS = ToolFacts(family="agent", runs_in_coordinator=True)
"""The facts of `dispatch_agent` (orchestrator/agents/dispatch_agent.py), which a session adds
to its registry once it has a pool: here so that the policy commands know them without the
agents room."""


class ToolSource(Protocol):
    """Tools that come and go while a session runs (an MCP server's, once it has listed
    them): `version` changes whenever `listed()` would change."""

    @property
    def version(self) -> int: ...

    def listed(self) -> Sequence[Tool[Any]]: ...

    def get(self, name: str) -> Tool[Any] | None: ...


class ToolRegistry:
    """The tools by name: a fixed set, plus those of `sources` as they list them (a fixed
    tool's name wins)."""

    def __init__(self, tools: Iterable[Tool[Any]], sources: Sequence[ToolSource] = ()) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.sources = tuple(sources)

    @property
    def version(self) -> tuple[int, ...]:
        """Changes whenever the set of tools does (the loop then lists them again)."""
        return tuple(source.version for source in self.sources)

    def _all(self) -> dict[str, Tool[Any]]:
        if not self.sources:
            return self._tools
        found = {t.name: t for source in self.sources for t in source.listed()}
        return {**self._tools, **{name: t for name, t in found.items() if name not in self._tools}}

    def get(self, name: str) -> Tool[Any] | None:
        tool = self._tools.get(name)
        if tool is None:
            for source in self.sources:
                if (tool := source.get(name)) is not None:
                    break
        return tool

    def names(self) -> list[str]:
        return list(self._all())

    def __iter__(self) -> Iterator[Tool[Any]]:
        return iter(self._all().values())

    def __len__(self) -> int:
        return len(self._all())

    def only(self, keep: Callable[[Tool[Any]], bool]) -> ToolRegistry:
        return ToolRegistry(t for t in self._tools.values() if keep(t))

    def with_tools(self, tools: Iterable[Tool[Any]]) -> ToolRegistry:
        """These tools added to the fixed set; the same sources."""
        return ToolRegistry([*self._tools.values(), *tools], self.sources)

    def facts(self) -> dict[str, ToolFacts]:
        """Each tool's declared facts by name (for the policy commands, which decide calls
        without tool objects)."""
        return {t.name: t.facts for t in self._all().values()}

    def specs(self) -> list[ToolSpec]:
        # Imported here: a tool host builds registries but never tells a model about them.
        from orchestrator.model.base import ToolSpec

        return [ToolSpec(t.name, t.description, t.input_schema()) for t in self._all().values()]


def builtin_tools(
    *,
    bash_classifier: Callable[[str], bool] | None = None,
    backgrounds: bool = True,
    persistent_shell: bool = True,
) -> ToolRegistry:
    """Every built-in tool. `bash_classifier` decides which Bash commands are read-only;
    `backgrounds`: whether Bash offers `run_in_background` (not in a subagent's worker);
    `persistent_shell`: False runs every Bash command in a one-shot shell (a read-only
    worker's)."""
    from orchestrator.tools.bash import BashTool
    from orchestrator.tools.edit import EditTool
    from orchestrator.tools.glob import GlobTool
    from orchestrator.tools.grep import GrepTool
    from orchestrator.tools.ls import LSTool
    from orchestrator.tools.multi_edit import MultiEditTool
    from orchestrator.tools.notebook_edit import NotebookEditTool
    from orchestrator.tools.read import ReadTool
    from orchestrator.tools.think import ThinkTool
    from orchestrator.tools.write import WriteTool

    return ToolRegistry(
        [
            ReadTool(),
            GlobTool(),
            GrepTool(),
            LSTool(),
            EditTool(),
            MultiEditTool(),
            WriteTool(),
            NotebookEditTool(),
            BashTool(
                classifier=bash_classifier,
                backgrounds=backgrounds,
                persistent=persistent_shell,
            ),
            ThinkTool(),
        ]
    )


def builtin_facts() -> dict[str, ToolFacts]:
    """The facts of every built-in tool, dispatch_agent included, by name: what
    `warren policy check|test` decide with."""
    return {**builtin_tools().facts(), SUBAGENT_TOOL: DISPATCH_AGENT_FACTS}
