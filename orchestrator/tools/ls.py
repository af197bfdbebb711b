"""The LS tool: a bounded tree view of a directory.

Breadth first, so when the entry cap cuts the listing the model still sees the top levels
of the tree (the part that orients it) rather than one deep corner. Hidden directories and
generated trees (node_modules, __pycache__, virtualenvs) are skipped and named in a footer.
"""

from __future__ import annotations

import fnmatch
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from orchestrator.tools._files import missing_file_message, non_regular_problem, path_problem
from orchestrator.tools.base import BlockingTool, ToolContext, ToolInput, ToolOutput
from policies.facts import ToolFacts

__all__ = ["MAX_LS_ENTRIES", "SKIPPED_DIRS", "LSInput", "LSTool"]

MAX_LS_ENTRIES = 1000
"""Entries listed at most; the result says when the directory holds more."""

SKIPPED_DIRS = frozenset(
    {"node_modules", "__pycache__", "venv", "bower_components", "site-packages"}
)
"""Directory names not descended into (besides every hidden directory, like .git)."""


class LSInput(ToolInput):
    path: str = Field(description="Absolute path of the directory to list.")
    ignore: list[str] | None = Field(
        default=None,
        description='Glob patterns of names or relative paths to leave out, e.g. ["*.pyc", '
        '"build"].',
    )


@dataclass
class _Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)
    """(path relative to the root, is a directory), breadth first."""
    truncated: bool = False
    skipped: set[str] = field(default_factory=set)


def _ignored(rel: str, name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


def _walk(root: Path, patterns: list[str]) -> _Listing:
    """Collect up to MAX_LS_ENTRIES entries under `root`, breadth first. Blocking."""
    listing = _Listing()
    queue: deque[str] = deque([""])
    while queue:
        rel_dir = queue.popleft()
        try:
            with os.scandir(root / rel_dir) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # unreadable subdirectory: listed, but its content is not
        for item in items:
            rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
            try:
                is_dir = item.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir and (item.name.startswith(".") or item.name in SKIPPED_DIRS):
                listing.skipped.add(item.name)
                continue
            if _ignored(rel, item.name, patterns):
                continue
            if len(listing.entries) >= MAX_LS_ENTRIES:
                listing.truncated = True
                return listing
            listing.entries.append((rel, is_dir))
            if is_dir:
                queue.append(rel)
    return listing


def _render(root: Path, listing: _Listing) -> str:
    children: dict[str, list[tuple[str, bool]]] = {}
    for rel, is_dir in listing.entries:
        parent, _, name = rel.rpartition("/")
        children.setdefault(parent, []).append((name, is_dir))
    lines = [f"- {str(root).rstrip('/')}/"]
    # An explicit stack, not recursion: a chain of nested directories can be deeper than
    # Python's recursion limit.
    stack = [("", name, is_dir, 1) for name, is_dir in sorted(children.get("", []), reverse=True)]
    while stack:
        parent, name, is_dir, depth = stack.pop()
        lines.append(f"{'  ' * depth}- {name}{'/' if is_dir else ''}")
        if is_dir:
            rel = f"{parent}/{name}" if parent else name
            for child, child_is_dir in sorted(children.get(rel, []), reverse=True):
                stack.append((rel, child, child_is_dir, depth + 1))
    if not listing.entries:
        lines.append("  (empty)")
    if listing.truncated:
        lines.append(
            f"\n[There are more than {MAX_LS_ENTRIES} entries under {root}; only the first "
            f"{MAX_LS_ENTRIES} (breadth first) are listed. LS a subdirectory, or use Glob to "
            "find specific files.]"
        )
    if listing.skipped:
        names = ", ".join(sorted(listing.skipped)[:10])
        lines.append(
            f"\n[Not descended into (hidden or generated directories): {names}. LS one of "
            "them by its full path to see inside.]"
        )
    return "\n".join(lines)


def _check(input: LSInput, ctx: ToolContext) -> str | None:
    problem = path_problem(input.path, ctx, param="path")
    if problem:
        return problem
    path = Path(input.path)
    if path.is_file():
        return f"{path} is a file, not a directory. Use Read to see its content."
    if not path.exists():
        return missing_file_message(path, ctx)
    return non_regular_problem(path)


class LSTool(BlockingTool[LSInput]):
    name: ClassVar[str] = "LS"
    facts: ClassVar[ToolFacts] = ToolFacts(family="read", path_fields=("path",))
    input_model: ClassVar[type[ToolInput]] = LSInput
    read_only: ClassVar[bool] = True
    description: ClassVar[str] = f"""Lists files and directories under a path as a tree.

- path must be an absolute path to a directory (not a relative one).
- Breadth first, at most {MAX_LS_ENTRIES} entries; the result says when more exist.
- Hidden directories (.git, .venv, ...) and generated ones (node_modules, __pycache__) are \
not descended into; LS them directly if you need to. ignore takes extra glob patterns to \
leave out.
- To find files by name pattern Glob is usually better; to search contents use Grep."""

    async def validate(self, input: LSInput, ctx: ToolContext) -> str | None:
        return _check(input, ctx)

    def run(self, input: LSInput, ctx: ToolContext) -> ToolOutput:
        root = Path(input.path)
        patterns = [p.rstrip("/") for p in input.ignore or [] if p.rstrip("/")]
        listing = _walk(root, patterns)
        more = "more than " if listing.truncated else ""
        return ToolOutput.text(
            _render(root, listing), summary=f"Listed {more}{len(listing.entries)} entries"
        )

    def render_use(self, input: LSInput) -> str:
        return f"LS({input.path})"
