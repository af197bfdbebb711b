"""What the model is told about where it works: the system prompt and a context snapshot.

The snapshot (git branch and status, a bounded top-level listing, the project's memory files)
is workspace content, so it is gathered under the floor: `orchestrator.context_probe` runs in
a one-shot read-only sandbox after the policy is loaded, while the SDK import still runs, so
start-up does not wait for it (tests/bench/bench_loop.py measures launch -> first request).
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from orchestrator import context_probe
from orchestrator.context_probe import MEMORY_FILES, collect
from sandbox.host import SandboxHost
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

__all__ = [
    "MEMORY_FILES",
    "ContextSandbox",
    "ContextSnapshot",
    "context_spec",
    "gather_context",
    "system_prompt",
]

_PROBE_WALL_S = 10.0
"""Seconds the probe may take before the snapshot goes without its facts."""

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


@dataclass(frozen=True)
class ContextSandbox:
    """Where the probe runs when the floor is on: a read-only spec of the workspace (with
    the policy's masks) and the session's sandbox host."""

    spec: SandboxSpec
    host: SandboxHost | None = None


def context_spec(
    cwd: Path, *, deny_read: tuple[str, ...] = (), home_allow: tuple[str, ...] = ()
) -> SandboxSpec:
    """The one-shot sandbox the probe runs in: the workspace read-only, the policy's secrets
    masked, small limits (git on a huge repository must not stall the start)."""
    return SandboxSpec(
        workspaces=(WorkspaceRoot(path=cwd, mode="ro"),),
        extra_deny_read=deny_read,
        extra_home_allow=home_allow,
        limits=Limits(
            wall_time_s=_PROBE_WALL_S,
            cpu_time_s=10,
            memory_bytes=2 * 1024**3,
            processes=32,
            file_size_bytes=1024**2,
            output_bytes=1024**2,
            tmp_bytes=16 * 1024**2,
        ),
    )


async def gather_context(
    cwd: Path, *, sandbox: ContextSandbox | None = None, today: dt.date | None = None
) -> ContextSnapshot:
    """Collect the snapshot (see `orchestrator.context_probe`), failing soft.

    With `sandbox`, the probe runs in a one-shot read-only sandbox: nothing the repository
    configures or links to is run or read on the host. Without (the user turned the sandbox
    off), it runs here with git's code-running settings disabled and memory files read as
    bounded regular files.
    """
    facts: dict[str, Any] = {}
    if sandbox is not None:
        facts = await _sandboxed(cwd, sandbox)
    else:
        with trio.move_on_after(_PROBE_WALL_S):
            facts = await trio.to_thread.run_sync(collect, cwd, abandon_on_cancel=True)
    branch = facts.get("branch")
    status = facts.get("status")
    tree = facts.get("tree")
    memory = facts.get("memory")
    return ContextSnapshot(
        cwd=cwd,
        platform=f"{platform.system()} {platform.release()}",
        date=(today or dt.date.today()).isoformat(),
        git_branch=branch if isinstance(branch, str) else None,
        git_status=status if isinstance(status, str) else None,
        tree=tree if isinstance(tree, str) else "",
        memory=_pairs(memory),
    )


async def _sandboxed(cwd: Path, sandbox: ContextSandbox) -> dict[str, Any]:
    from sandbox.errors import SandboxError
    from sandbox.run import run_sandboxed

    argv = [sys.executable, "-I", "-S", context_probe.__file__, str(cwd)]
    try:
        done = await run_sandboxed(sandbox.spec, argv, host=sandbox.host)
    except (SandboxError, OSError):
        return {}
    if done.exit_code != 0 or done.killed_by_limit is not None:
        return {}
    try:
        value = json.loads(done.stdout)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _pairs(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        (item[0], item[1])
        for item in value
        if isinstance(item, list)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], str)
    )


def system_prompt(snapshot: ContextSnapshot, *, extra: str | None = None) -> list[str]:
    """System blocks, most stable first (the client caches up to the last block)."""
    blocks = [BASE_PROMPT]
    if extra:
        blocks.append(extra)
    blocks.append(snapshot.render())
    return blocks
