"""The Glob tool: find files by name pattern, newest first, with ripgrep's file walker.

ripgrep walks in parallel and honours .gitignore, .ignore and .rgignore, which keeps build
output and vendored trees out of the results. One subtlety decides how a pattern is passed:
an rg `--glob` match overrides ignore files, so `--glob '*.log'` would list ignored logs. A
pattern whose last part is a file-name glob is therefore split into a literal directory to
search and a file type (`--type-add`), which rg applies after its ignore rules; only other
patterns go through `--glob`, and their results are then intersected with the ignore-aware
listing (tests/orchestrator/tools/test_search.py pins both). Grep reuses `plan_glob`.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import trio
from pydantic import Field

from orchestrator.tools._files import newest_first, path_problem, run_ripgrep, search_path_problem
from orchestrator.tools.base import (
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolOutput,
    ToolProgress,
)
from policies.facts import ToolFacts

__all__ = [
    "MAX_GLOB_RESULTS",
    "RG_COMMON",
    "GlobInput",
    "GlobPlan",
    "GlobTool",
    "plan_glob",
]

MAX_GLOB_RESULTS = 100
"""Paths returned at most; the result says how many more matched."""

RG_COMMON = (
    "--no-config",
    "--color=never",
    "--hidden",
    "--no-require-git",
    "--glob=!.git",
    "--glob=!.hg",
    "--glob=!.svn",
)
"""Flags every rg call of ours shares: hidden files are searched (`.github/` matters) but
version-control internals are not, and .gitignore applies even outside a git checkout."""

_TYPE_NAME = "warrenglob"


@dataclass(frozen=True)
class GlobPlan:
    """How a glob pattern is handed to rg."""

    subdir: str
    """Literal leading directories of the pattern ("" for none), searched instead of the root."""
    name: str | None
    """A file-name glob applied as an rg type (ignore-aware), when the pattern allows it."""
    max_depth: int | None
    """1 when `name` must match directly inside `subdir` (`src/*.py`), else None."""
    glob: str | None
    """Otherwise the rest of the pattern, relative to `subdir`, for `--glob`."""

    def rg_args(self) -> list[str]:
        if self.name is not None:
            args = [f"--type-add={_TYPE_NAME}:{self.name}", f"--type={_TYPE_NAME}"]
            if self.max_depth is not None:
                args.append(f"--max-depth={self.max_depth}")
            return args
        return [f"--glob={self.glob}"]


def _is_magic(part: str) -> bool:
    return any(c in part for c in "*?[]{}")


def plan_glob(pattern: str) -> GlobPlan:
    """Split a gitignore-style glob into a literal directory and what rg should match.

    `*.py` and `**/*.py` match at any depth, `src/*.py` only directly in `src`, as in rg.
    Literal leading directories become the search root, so like `path` they are searched
    even when ignored (`build/*.py` lists generated files the model asked for by name).
    """
    parts = pattern.split("/")
    while len(parts) > 1 and parts[0] == ".":
        parts.pop(0)
    literal: list[str] = []
    while len(parts) > 1 and not _is_magic(parts[0]):
        literal.append(parts.pop(0))
    subdir = "/".join(literal)
    if all(p == "**" for p in parts[:-1]):  # "**/" parts, then one file-name glob
        name = parts[-1] if parts[-1] not in ("", "**") else "*"
        depth = None if "**" in parts or not literal else 1
        return GlobPlan(subdir=subdir, name=name, max_depth=depth, glob=None)
    return GlobPlan(subdir=subdir, name=None, max_depth=None, glob="/".join(parts))


def search_root(pattern: str, path: str | None, ctx: ToolContext) -> tuple[Path, GlobPlan]:
    """The directory rg walks and the plan for the pattern; an absolute pattern names its
    own directory."""
    if pattern.startswith("/"):
        plan = plan_glob(pattern[1:])
        base = Path("/")
    else:
        plan = plan_glob(pattern)
        base = Path(path) if path else ctx.cwd
    return Path(os.path.normpath(base / plan.subdir)), plan


class GlobInput(ToolInput):
    pattern: str = Field(
        description=(
            'Glob to match file paths against, e.g. "**/*.py", "src/**/*.{ts,tsx}", '
            '"tests/test_*.py". A pattern without "/" matches file names at any depth.'
        )
    )
    path: str | None = Field(
        default=None,
        description=(
            "Absolute path of the directory to search in. Omit it to search the current "
            "working directory (do not pass null or 'undefined')."
        ),
    )


def _check(input: GlobInput, ctx: ToolContext) -> str | None:
    problem = search_path_problem(input.path, ctx, directory=True)
    if problem:
        return problem
    root, _plan = search_root(input.pattern, input.path, ctx)
    if input.pattern.startswith("/") or ".." in input.pattern.split("/"):
        return path_problem(str(root), ctx, param="pattern")
    return None


class GlobTool(Tool[GlobInput]):
    name: ClassVar[str] = "Glob"
    facts: ClassVar[ToolFacts] = ToolFacts(
        family="read", path_fields=("path",), path_defaults_to_workspace=True
    )
    input_model: ClassVar[type[ToolInput]] = GlobInput
    read_only: ClassVar[bool] = True
    description: ClassVar[str] = f"""Finds files by name pattern (a fast file search that \
works in a codebase of any size).

- Supports glob patterns like "**/*.js" or "src/**/*.ts"; braces ("*.{{ts,tsx}}") work too. \
A pattern without "/" matches file names at any depth.
- Returns absolute paths, most recently modified first, at most {MAX_GLOB_RESULTS}; the result \
says when more matched (narrow the pattern or the path then).
- Files ignored by .gitignore (and .ignore) are left out, unless the directory is named \
explicitly (in path, or as the pattern's leading directories, e.g. "build/*.js"). Hidden \
files are included; .git is not.
- Use it to find files by name. To search file contents use Grep; to see a directory's \
layout use LS. For an open-ended search that may take several rounds of globbing and \
grepping, use dispatch_agent.
- Several searches that may be useful can be run at once in one response."""

    async def validate(self, input: GlobInput, ctx: ToolContext) -> str | None:
        return _check(input, ctx)

    async def call(
        self, input: GlobInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        root, plan = search_root(input.pattern, input.path, ctx)
        if not await trio.to_thread.run_sync(root.is_dir):
            yield ToolOutput.text(
                f"No files found: {root} does not exist.", summary="No files found"
            )
            return
        found = await run_ripgrep(["--files", *RG_COMMON, *plan.rg_args(), str(root)], cwd=root)
        if found.returncode == 2 and not found.stdout:
            raise ToolError(f"The file search failed: {found.stderr.strip()}")
        paths = found.stdout.splitlines()
        if ctx.read_deny:  # names the policy denies reading are left out
            paths = [p for p in paths if not ctx.read_denied(os.path.join(root, p), resolve=False)]
        if plan.glob is not None and paths:
            listing = await run_ripgrep(["--files", *RG_COMMON, str(root)], cwd=root)
            if not listing.truncated:
                allowed = set(listing.stdout.splitlines())
                paths = [p for p in paths if p in allowed]
        if not paths:
            yield ToolOutput.text("No files found.", summary="No files found")
            return
        ordered = await trio.to_thread.run_sync(newest_first, paths)
        shown = ordered[:MAX_GLOB_RESULTS]
        text = "\n".join(shown)
        more = "more than " if found.truncated else ""
        if len(ordered) > len(shown) or found.truncated:
            text += (
                f"\n\n[Showing the {len(shown)} most recently modified of {more}{len(ordered)} "
                "matching files. Use a more specific pattern or path to see the others.]"
            )
        yield ToolOutput.text(text, summary=f"Found {more}{len(ordered)} files")

    def render_use(self, input: GlobInput) -> str:
        where = f", {input.path}" if input.path else ""
        return f"Glob({input.pattern!r}{where})"
