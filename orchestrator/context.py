"""What the model is told about where it works: the system prompt and a context snapshot.

Gathered concurrently at start-up (git branch and status, a bounded top-level listing, the
project's memory files) so that it costs the slowest probe, not their sum.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import trio

__all__ = ["MEMORY_FILES", "ContextSnapshot", "gather_context", "system_prompt"]

MEMORY_FILES = ("WARREN.md", "AGENTS.md", "CLAUDE.md")
"""Project memory files read from the workspace root, in this order."""

_MAX_MEMORY_CHARS = 40_000
_MAX_STATUS_LINES = 40
_MAX_TREE_ENTRIES = 60

BASE_PROMPT = """\
You are Warren, a coding agent working in a software repository on the user's Linux machine.
You help with software engineering tasks: understanding code, refactoring, fixing bugs, running
tests. Use the tools to inspect and change the repository; paths you pass to tools must be
absolute.

How to work:
- Look before you change: read the files you will edit (Edit and Write refuse unread files).
- Prefer the dedicated tools (Read, Grep, Glob, LS, Edit) over shell equivalents.
- Several read-only tool calls in one message run in parallel: batch independent reads.
- Every tool call runs in a sandbox: the workspace may be writable, everything else is
  read-only and there is no network. A refused call says why; adapt instead of retrying
  blindly.
- Keep changes focused; run the project's tests when you change code.
- Finish with a short summary of what you did and anything left undone.
"""


@dataclass(frozen=True)
class ContextSnapshot:
    cwd: Path
    platform: str
    date: str
    git_branch: str | None
    git_status: str | None
    tree: str
    memory: tuple[tuple[str, str], ...]
    """(file name, contents) of each memory file found."""

    def render(self) -> str:
        lines = [
            "<context>",
            f"Working directory: {self.cwd}",
            f"Platform: {self.platform}",
            f"Today's date: {self.date}",
        ]
        if self.git_branch is not None:
            lines.append(f"Git branch: {self.git_branch}")
            lines.append("Git status (short):")
            lines.append(self.git_status or "(clean)")
        else:
            lines.append("Not a git repository.")
        lines.append("Top-level entries:")
        lines.append(self.tree or "(empty)")
        lines.append("</context>")
        for name, text in self.memory:
            lines.append(f'<memory file="{name}">\n{text}\n</memory>')
        return "\n".join(lines)


async def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = await trio.run_process(
            ["git", *args],
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=b"",
        )
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return bytes(done.stdout).decode("utf-8", "replace").rstrip("\n")


def _tree(cwd: Path) -> str:
    try:
        entries = sorted(os.scandir(cwd), key=lambda e: e.name)
    except OSError:
        return ""
    shown = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries]
    shown = [name for name in shown if name != ".git/"]
    more = len(shown) - _MAX_TREE_ENTRIES
    text = "\n".join(f"- {name}" for name in shown[:_MAX_TREE_ENTRIES])
    return text + (f"\n- ... and {more} more" if more > 0 else "")


def _memory(cwd: Path) -> tuple[tuple[str, str], ...]:
    found = []
    for name in MEMORY_FILES:
        path = cwd / name
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if len(text) > _MAX_MEMORY_CHARS:
            text = text[:_MAX_MEMORY_CHARS] + f"\n[... {name} cut at {_MAX_MEMORY_CHARS} chars]"
        found.append((name, text))
    return tuple(found)


async def gather_context(cwd: Path, *, today: dt.date | None = None) -> ContextSnapshot:
    """Collect the snapshot; every probe runs at once, each failing soft."""
    results: dict[str, object] = {}

    async def put(key: str, value: object) -> None:
        results[key] = value

    async def branch() -> None:
        await put("branch", await _git(cwd, "rev-parse", "--abbrev-ref", "HEAD"))

    async def status() -> None:
        out = await _git(cwd, "status", "--short")
        if out is not None:
            lines = out.splitlines()
            if len(lines) > _MAX_STATUS_LINES:
                more = len(lines) - _MAX_STATUS_LINES
                lines = [*lines[:_MAX_STATUS_LINES], f"... and {more} more"]
            out = "\n".join(lines)
        await put("status", out)

    async def files() -> None:
        await put("tree", await trio.to_thread.run_sync(_tree, cwd))
        await put("memory", await trio.to_thread.run_sync(_memory, cwd))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(branch)
        nursery.start_soon(status)
        nursery.start_soon(files)
    branch_name = results.get("branch")
    status_text = results.get("status")
    tree_text = results.get("tree")
    memory = results.get("memory")
    return ContextSnapshot(
        cwd=cwd,
        platform=f"{platform.system()} {platform.release()}",
        date=(today or dt.date.today()).isoformat(),
        git_branch=branch_name if isinstance(branch_name, str) else None,
        git_status=status_text if isinstance(status_text, str) else None,
        tree=tree_text if isinstance(tree_text, str) else "",
        memory=memory if isinstance(memory, tuple) else (),
    )


def system_prompt(snapshot: ContextSnapshot, *, extra: str | None = None) -> list[str]:
    """System blocks, most stable first (the client caches up to the last block)."""
    blocks = [BASE_PROMPT]
    if extra:
        blocks.append(extra)
    blocks.append(snapshot.render())
    return blocks
