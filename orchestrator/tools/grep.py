"""The Grep tool: search file contents with ripgrep, in three output modes.

The early kernel's Grep returned file names only; this one also returns matching lines with
context (`path:line:text`) and per-file counts, so the model rarely needs Bash to search. rg
runs as a subprocess without a shell; its output is capped twice (the caller's `head_limit`
and a hard cap), and the result always says when something was cut.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar, Literal

import trio
from pydantic import Field

from orchestrator.tools._files import (
    newest_first,
    non_regular_problem,
    run_ripgrep,
    search_path_problem,
)
from orchestrator.tools.base import (
    Tool,
    ToolContext,
    ToolError,
    ToolInput,
    ToolOutput,
    ToolProgress,
)
from orchestrator.tools.glob import RG_COMMON, plan_glob
from policies.facts import ToolFacts

__all__ = ["MAX_GREP_CHARS", "MAX_GREP_LINES", "GrepInput", "GrepTool"]

MAX_GREP_LINES = 500
"""Lines (content mode) or entries (other modes) returned at most, whatever head_limit says."""
MAX_GREP_CHARS = 60_000
"""Characters returned at most; lines beyond are dropped whole."""
MAX_LINE_COLUMNS = 500
"""Longer matching lines (minified code) are replaced by a preview of this many columns."""

OutputMode = Literal["content", "files_with_matches", "count"]


class GrepInput(ToolInput):
    pattern: str = Field(
        description=(
            "Regular expression to search for (ripgrep / Rust regex syntax: escape literal "
            r"braces and parentheses, e.g. `interface\{\}` or `foo\(`)."
        )
    )
    path: str | None = Field(
        default=None,
        description="Absolute path of a file or directory to search (default: the current "
        "working directory).",
    )
    glob: str | None = Field(
        default=None,
        description='Only search files matching this glob, e.g. "*.js", "*.{ts,tsx}", '
        '"src/**/*.py" (rg --glob).',
    )
    type: str | None = Field(
        default=None,
        description='Only search files of this rg type, e.g. "py", "js", "rust", "go" (rg '
        "--type); more efficient than glob for standard file types.",
    )
    output_mode: OutputMode = Field(
        default="files_with_matches",
        description='"files_with_matches" (default): paths of matching files, newest first; '
        '"content": matching lines as path:line:text (supports -A/-B/-C, -n); "count": '
        "matching lines per file.",
    )
    case_insensitive: bool = Field(
        default=False, alias="-i", description="Case-insensitive search (rg -i)."
    )
    line_numbers: bool = Field(
        default=True,
        alias="-n",
        description="Show line numbers (content mode only; default true).",
    )
    after_context: int | None = Field(
        default=None, ge=0, alias="-A", description="Lines to show after each match (content mode)."
    )
    before_context: int | None = Field(
        default=None,
        ge=0,
        alias="-B",
        description="Lines to show before each match (content mode).",
    )
    context: int | None = Field(
        default=None,
        ge=0,
        alias="-C",
        description="Lines to show before and after each match (content mode).",
    )
    multiline: bool = Field(
        default=False,
        description="Let the pattern span lines, with . matching newlines (rg -U "
        "--multiline-dotall). Default false.",
    )
    head_limit: int | None = Field(
        default=None,
        ge=1,
        description="Return only the first N lines (content) or entries (other modes). "
        f"Results are capped at {MAX_GREP_LINES} in any case.",
    )


def _search_target(input: GrepInput, ctx: ToolContext) -> tuple[Path, list[str], Path | None]:
    """The path rg searches, the rg flags that select files (glob and type), and the
    directory rg runs in (None when the target does not exist). Blocking (stats)."""
    target = Path(input.path) if input.path else ctx.cwd
    select = ["--type", input.type] if input.type else []
    if input.glob is not None and target.is_dir():
        if input.type:  # both: rg's own semantics (the glob decides; see glob.py's docstring)
            select.append(f"--glob={input.glob}")
        else:
            plan = plan_glob(input.glob)
            target, select = Path(os.path.normpath(target / plan.subdir)), plan.rg_args()
    if target.is_dir():
        return target, select, target
    # ripgrep reads a path it is given even when it is a FIFO or a device (it skips them only
    # in directory walks), so one put in place since validation is refused here too.
    problem = non_regular_problem(target)
    if problem:
        raise ToolError(problem)
    return target, select, target.parent if target.exists() else None


def _rg_args(input: GrepInput, target: Path, select: list[str]) -> list[str]:
    args = [*RG_COMMON, *select, f"--max-columns={MAX_LINE_COLUMNS}", "--max-columns-preview"]
    if input.case_insensitive:
        args.append("--ignore-case")
    if input.multiline:
        args += ["--multiline", "--multiline-dotall"]
    match input.output_mode:
        case "files_with_matches":
            args.append("--files-with-matches")
        # No --sort=path: it makes ripgrep single-threaded (1.6x plain rg over 10,000 files,
        # tests/bench/bench_tools.py). Output is put in path order afterwards (_by_path), with
        # --null marking where each path ends.
        case "count":
            args += ["--count", "--with-filename", "--null"]
        case "content":
            args += ["--no-heading", "--with-filename", "--null"]
            args.append("--line-number" if input.line_numbers else "--no-line-number")
            context = {
                "--context": input.context,
                "--after-context": input.after_context,
                "--before-context": input.before_context,
            }
            args += [f"{flag}={lines}" for flag, lines in context.items() if lines is not None]
    return [*args, "--regexp", input.pattern, "--", str(target)]


def _without_denied(lines: list[str], cwd: Path, ctx: ToolContext) -> list[str]:
    """rg's lines minus those of files a `Read` deny rule covers (rg follows no links, so the
    paths it prints are checked as written; each path once)."""
    verdicts: dict[str, bool] = {}
    kept = []
    for line in lines:
        path = line.partition("\0")[0]
        denied = verdicts.get(path)
        if denied is None:
            full = path if path[:1] == "/" else os.path.join(cwd, path)  # rg's, as it wrote it
            denied = verdicts[path] = ctx.read_denied(full, resolve=False)
        if not denied:
            kept.append(line)
    return kept


def _by_path(lines: list[str], *, hunk_separators: bool) -> list[str]:
    """`path\0rest` lines (ripgrep --null) grouped per file, files in path order, each file's
    lines in ripgrep's order, printed as `path:rest` (`path-rest` for context lines).

    ripgrep prints each file's lines together, so grouping only moves whole files. `--` lines
    (between context hunks) are kept inside a file and put between files when
    `hunk_separators` is set.
    """
    groups: dict[str, list[str]] = {}
    pending_separator = False
    for line in lines:
        path, nul, rest = line.partition("\0")
        if not nul:
            pending_separator = line == "--"
            continue
        group = groups.setdefault(path, [])
        if pending_separator and group:
            group.append("--")
        pending_separator = False
        digits = len(rest) - len(rest.lstrip("0123456789"))
        separator = "-" if digits and rest[digits : digits + 1] == "-" else ":"
        group.append(f"{path}{separator}{rest}")
    out: list[str] = []
    for path in sorted(groups):
        if out and hunk_separators:
            out.append("--")
        out.extend(groups[path])
    return out


def _cap(lines: list[str], head_limit: int | None, unit: str, more: bool) -> tuple[list[str], str]:
    """At most head_limit / MAX_GREP_LINES lines within MAX_GREP_CHARS, and a note if cut."""
    limit = min(head_limit or MAX_GREP_LINES, MAX_GREP_LINES)
    kept: list[str] = []
    size = 0
    for line in lines[:limit]:
        size += len(line) + 1
        if size > MAX_GREP_CHARS and kept:
            break
        kept.append(line)
    total = f"{'more than ' if more else ''}{len(lines)}"
    if len(kept) == len(lines) and not more:
        return kept, ""
    if head_limit is not None and len(kept) == head_limit:
        return kept, f"[Showing the first {len(kept)} of {total} {unit} (head_limit={head_limit}).]"
    return kept, (
        f"[Showing the first {len(kept)} of {total} {unit}; the output was capped. Narrow the "
        "search with a more specific pattern, path, glob or type, or page with head_limit.]"
    )


def _check(input: GrepInput, ctx: ToolContext) -> str | None:
    problem = search_path_problem(input.path, ctx, directory=False)
    if problem:
        return problem
    if input.glob and ".." in input.glob.split("/"):
        return "glob must not contain '..'; give the directory to search as path instead."
    return None


class GrepTool(Tool[GrepInput]):
    name: ClassVar[str] = "Grep"
    facts: ClassVar[ToolFacts] = ToolFacts(
        family="read", path_fields=("path",), path_defaults_to_workspace=True
    )
    input_model: ClassVar[type[ToolInput]] = GrepInput
    read_only: ClassVar[bool] = True
    description: ClassVar[str] = f"""Searches file contents with ripgrep (regular expressions).

- Always use Grep for searching file contents; do not run grep or rg through Bash.
- Full regex syntax (Rust regex, as in ripgrep): "log.*Error", "function\\s+\\w+". Literal \
braces and parentheses need escaping: `interface\\{{\\}}` finds `interface{{}}` in Go.
- output_mode: "files_with_matches" (default) lists matching files, most recently modified \
first; "content" shows matching lines as path:line:text, with -A/-B/-C context lines and -n \
line numbers (on by default); "count" gives matching lines per file.
- Narrow with path (a file or directory), glob ("*.py", "src/**/*.ts") or type ("py", \
"rust", "js"). Files ignored by .gitignore are skipped; hidden files are searched.
- Patterns match within one line unless multiline is true (then . also matches newlines).
- Results are capped at {MAX_GREP_LINES} lines or entries (head_limit can lower that); the \
result says when something was cut. For an open-ended search needing several rounds, use \
dispatch_agent."""

    async def validate(self, input: GrepInput, ctx: ToolContext) -> str | None:
        return _check(input, ctx)

    async def call(
        self, input: GrepInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        target, select, cwd = await trio.to_thread.run_sync(_search_target, input, ctx)
        if cwd is None:
            yield ToolOutput.text(f"No matches ({target} does not exist).", summary="No matches")
            return
        found = await run_ripgrep(_rg_args(input, target, select), cwd=cwd)
        stderr = found.stderr.strip()
        if ctx.read_deny:  # a denied file is masked: its "permission denied" is no failure
            stderr = "\n".join(
                line
                for line in stderr.splitlines()
                if not (line.startswith("rg: ") and ctx.read_denied(line[4:].rsplit(": ", 1)[0]))
            )
        if found.returncode == 2 and not found.stdout and stderr:
            if "regex" in stderr:
                raise ToolError(
                    f"The pattern is not a valid regular expression:\n{stderr}\n"
                    "Grep uses Rust regex syntax (as ripgrep does): escape special characters "
                    "such as ( ) [ ] { } . * + ? with a backslash to match them literally."
                )
            raise ToolError(f"The search failed: {stderr}")
        lines = found.stdout.splitlines()
        if ctx.read_deny:  # files the policy denies reading never reach the model
            lines = _without_denied(lines, cwd, ctx)
        if input.output_mode != "files_with_matches":
            context = (input.context, input.after_context, input.before_context)
            lines = _by_path(lines, hunk_separators=any(c for c in context))
        if not lines:
            yield ToolOutput.text("No matches found.", summary="No matches")
            return
        match input.output_mode:
            case "files_with_matches":
                lines = await trio.to_thread.run_sync(newest_first, lines)
                kept, note = _cap(lines, input.head_limit, "files", found.truncated)
                header = f"Found {len(lines)} file{'s' * (len(lines) != 1)}"
                text = header + "\n" + "\n".join(kept)
                summary = header
            case "count":
                total = sum(int(line.rsplit(":", 1)[1]) for line in lines if ":" in line)
                kept, note = _cap(lines, input.head_limit, "files", found.truncated)
                header = f"Found {total} matching lines in {len(lines)} files"
                text = "\n".join(kept) + f"\n\n{header}."
                summary = header
            case "content":
                kept, note = _cap(lines, input.head_limit, "lines", found.truncated)
                text = "\n".join(kept)
                summary = f"{len(lines)} lines of results"
        if note:
            text += "\n\n" + note
        if found.returncode == 2 and stderr:
            text += f"\n\n[Some paths could not be searched: {stderr.splitlines()[0]}]"
        yield ToolOutput.text(text, summary=summary)

    def render_use(self, input: GrepInput) -> str:
        parts = [repr(input.pattern)]
        if input.path:
            parts.append(input.path)
        if input.glob:
            parts.append(f"glob={input.glob}")
        if input.type:
            parts.append(f"type={input.type}")
        if input.output_mode != "files_with_matches":
            parts.append(input.output_mode)
        return f"Grep({', '.join(parts)})"
