"""Memory files: which ones a workspace contributes and how their `@path` imports expand.

Memory files (`WARREN.md`, `AGENTS.md`, `CLAUDE.md`) are the project's standing instructions to
the model. They are found where users expect them from other agents: in every directory from
the repository's root (`memory_root`) down to the working directory, the most specific last,
and a file may pull in others with `@path` (relative to the importing file, `~/` for the home,
or absolute), up to `MAX_IMPORT_DEPTH` levels deep, each file once (cycles end quietly).

Two callers walk the same files with the same rules (`gather`) but different eyes:

- the context probe (`orchestrator.conversation.context_probe`), inside the read-only sandbox, for
the
  system prompt: its `resolve` (`resolver`) refuses a file outside the repository, behind a
  link leading out of it, or covered by a `Read` deny rule (`WirePattern`), with a note for
  the model;
- trust (`policies.trust.repository_files`), on the host, for the hash that makes a changed
  memory file or import ask for trust again: only files inside the repository (`resolver`
  without deny rules), opened without following links.

Stdlib only and free of Warren imports: the probe loads this file by path (`python -I -S`)
without importing the `policies` package. Nothing here reads a file itself: callers pass
`read`, so each side keeps its own way of reading safely.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

__all__ = [
    "MAX_IMPORT_DEPTH",
    "MAX_MEMORY_BYTES",
    "MAX_MEMORY_FILES",
    "MAX_MEMORY_TOTAL_BYTES",
    "MEMORY_FILES",
    "MemoryEntry",
    "Skipped",
    "WirePattern",
    "find_imports",
    "gather",
    "memory_chain",
    "memory_root",
    "resolver",
    "wire_denied",
    "within",
]

MEMORY_FILES = ("WARREN.md", "AGENTS.md", "CLAUDE.md")
"""Names of memory files, read in this order in each directory."""
MAX_MEMORY_BYTES = 40_000
"""Bytes read from each memory file; the rest is cut with a note."""
MAX_MEMORY_TOTAL_BYTES = 160_000
"""Bytes of memory in one prompt, all files together; later files are left out with a note."""
MAX_MEMORY_FILES = 64
"""Memory files in one prompt, imports included."""
MAX_IMPORT_DEPTH = 5
"""Import levels followed below a memory file (Claude Code's limit): a file five imports
away is read, its own imports are not."""

WirePattern = tuple[str, str, bool, str | None]
"""A compiled `Read` deny rule as plain JSON values (`policies.rules.PathPattern.wire`):
root, glob, anchored, and the glob's regex (None when the glob is literal)."""

_IMPORT = re.compile(r"(?:^|(?<=\s))@((?:[^\s\\]|\\ )+)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_TRAILING = ".,;:!?)]}>\"'"


class Skipped(Exception):
    """A memory file or import that is refused; the text says why (for the model's note)."""


class MemoryEntry:
    """One memory file read: where it was named, where it really is, and its text (with
    notes about the imports it asked for that were left out). A plain class: `dataclasses`
    imports `inspect`, which was a third of the context probe's start in its sandbox."""

    __slots__ = ("label", "notes", "real", "text")

    def __init__(self, label: str, real: str, text: str, notes: list[str] | None = None) -> None:
        self.label = label
        self.real = real
        self.text = text
        self.notes: list[str] = [] if notes is None else notes

    def rendered(self) -> str:
        return "\n".join([self.text, *(f"[{note}]" for note in self.notes)])


def within(path: str, root: str) -> bool:
    """Is the normalised absolute `path` `root` or below it (never a string-prefix test)?"""
    return path == root or path.startswith(root.rstrip("/") + "/")


def memory_root(cwd: str, home: str | None) -> str:
    """The directory memory files are looked for from: the nearest of `cwd` and its ancestors
    holding a `.git` (a directory or a worktree's file), else `cwd` itself.

    Only names are looked at (`lstat`), nothing is read or run. The search stops below the
    home directory: a home that is itself a repository (dotfiles) does not make every
    directory under it one project; the user's own memory lives in fixed files instead.
    """
    cwd = os.path.normpath(cwd)
    stops: set[str] = set()
    probe = os.path.normpath(home) if home else None
    while probe is not None:
        stops.add(probe)
        parent = os.path.dirname(probe)
        probe = None if parent == probe else parent
    here = cwd
    while True:
        if here in stops and here != cwd:
            return cwd
        if os.path.lexists(os.path.join(here, ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return cwd
        here = parent


def memory_chain(root: str, cwd: str) -> list[str]:
    """The memory file paths (existing or not) from `root` down to `cwd`, in prompt order."""
    root, cwd = os.path.normpath(root), os.path.normpath(cwd)
    if not within(cwd, root):
        root = cwd
    dirs = [root]
    rest = cwd[len(root) :].strip("/")
    for part in rest.split("/") if rest else []:
        dirs.append(os.path.join(dirs[-1], part))
    return [os.path.join(d, name) for d in dirs for name in MEMORY_FILES]


def find_imports(text: str) -> list[str]:
    """The `@path` references of a memory file, in order: `@` at the start of a line or after
    a blank, not inside a code block or code span; `\\ ` is a blank in the path; trailing
    punctuation (`see @docs/a.md.`) is not part of it."""
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _IMPORT.finditer(_CODE_SPAN.sub(" ", line)):
            path = match.group(1).replace("\\ ", " ").rstrip(_TRAILING)
            if path and path not in found:
                found.append(path)
    return found


def _target(reference: str, importer_dir: str, home: str | None) -> str | None:
    if reference == "~" or reference.startswith("~/"):
        if not home:
            return None
        return os.path.normpath(home + reference[1:])
    if reference.startswith("~"):
        return None  # `~user/...`: another user's home is never memory
    return os.path.normpath(os.path.join(importer_dir, reference))


Resolve = Callable[[str], str]
"""Lexical absolute path -> the real path to read. Raises `FileNotFoundError` for a missing
file (left out quietly: `@someone` in prose is no import) or `Skipped` with the reason."""
Read = Callable[[str, int], tuple[bytes, bool]]
"""Real path, byte limit -> (bytes, whether there was more). Raises `OSError`."""


def gather(
    paths: Sequence[str], *, resolve: Resolve, read: Read, home: str | None
) -> list[MemoryEntry]:
    """Read `paths` in order, each followed by its imports (depth first, in the order they
    appear), every real file once, within the size and count budgets.

    A refused or unreadable import becomes a note on the importing file; a refused top-level
    file is left out quietly (it was never asked for by name).
    """
    entries: list[MemoryEntry] = []
    seen: set[str] = set()
    budget = [MAX_MEMORY_TOTAL_BYTES]

    def visit(path: str, depth: int) -> str | None:
        try:
            real = resolve(path)
        except FileNotFoundError:
            return None
        except Skipped as exc:
            return f"@{path} not imported: {exc}"
        if real in seen:
            return None  # a cycle, or imported twice: once is enough
        seen.add(real)
        if len(entries) >= MAX_MEMORY_FILES or budget[0] <= 0:
            return f"@{path} not imported: the memory budget is spent"
        limit = min(MAX_MEMORY_BYTES, budget[0])
        try:
            data, cut = read(real, limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            return f"@{path} not imported: {reason}"
        budget[0] -= len(data)
        text = data.decode("utf-8", "replace")
        if cut:
            text += f"\n[... {os.path.basename(path)} cut at {limit} bytes]"
        entry = MemoryEntry(label=path, real=real, text=text)
        entries.append(entry)
        for reference in find_imports(text):
            target = _target(reference, os.path.dirname(real), home)
            if target is None:
                continue
            if depth >= MAX_IMPORT_DEPTH:
                entry.notes.append(
                    f"@{reference} not imported: deeper than {MAX_IMPORT_DEPTH} imports"
                )
                continue
            note = visit(target, depth + 1)
            if note is not None:
                entry.notes.append(note)
        return None

    for path in paths:
        visit(os.path.normpath(path), 0)
    return entries


def resolver(top: str, real_top: str, deny: Sequence[WirePattern] = ()) -> Callable[[str], str]:
    """The `resolve` of `gather` for a repository at `top` (`real_top`, its real path): a
    path's real path, or `Skipped` for one outside the repository, behind a link leading out
    of it (`CLAUDE.md -> AGENTS.md` is fine, `CLAUDE.md -> ~/.ssh/id_rsa` is not followed),
    or covered by a `deny` pattern as written or where its link leads; `FileNotFoundError`
    for one that does not exist."""

    def resolve(path: str) -> str:
        if not within(path, top):
            raise Skipped("outside the repository")
        if wire_denied(deny, path):
            raise Skipped("a Read deny rule covers it")
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        real = os.path.realpath(path)
        if not within(real, real_top):
            raise Skipped("a link leading outside the repository")
        if wire_denied(deny, real):
            raise Skipped("a Read deny rule covers it")
        return real

    return resolve


def wire_denied(patterns: Sequence[WirePattern], path: str) -> bool:
    """Does one of the `Read` deny rules cover the normalised absolute `path`? The same test
    as `policies.rules.PathPattern.matches` (tests/policies/test_memory_files.py checks they
    agree), on values the probe received as JSON."""
    for root, glob, anchored, regex in patterns:
        if root == "/":
            relative = path[1:]
        elif path == root:
            relative = ""
        elif path.startswith(root + "/"):
            relative = path[len(root) + 1 :]
        else:
            continue
        if not glob:
            return True
        if regex is None:
            if anchored:
                if relative == glob or relative.startswith(glob + "/"):
                    return True
            elif glob in relative.split("/"):
                return True
        elif re.fullmatch(regex, relative) is not None:
            return True
    return False
