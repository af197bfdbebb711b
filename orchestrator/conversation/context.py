"""What the model is told about where it works: the system prompt and a context snapshot.

The snapshot (git branch and status, a bounded top-level listing, memory files) is what both
the main agent and every subagent are told (`ContextSnapshot.render`). The repository's part
is workspace content, so it is gathered under the floor: `orchestrator.conversation.context_probe`
runs in a one-shot read-only sandbox after the policy is loaded, while the SDK import still runs, so
start-up does not wait for it (tests/bench/bench_loop.py measures launch -> first request).

Memory files, in prompt order (`MemorySources`; the rules in `policies.memory_files`):

1. the user's own, `$XDG_CONFIG_HOME/warren/WARREN.md` (default `~/.config/warren/`) and
   `~/.claude/CLAUDE.md`. They are read here, on the host, because the sandbox hides the home
   and they are the user's, not the repository's. Still bounded regular files, and neither
   they nor their imports may reach into the repository or another writable root: each path
   is resolved one component at a time and refused the moment a name or a link's target lies
   there, so a link the repository planted cannot turn a user import into a host read of
   repository-controlled content (`_user_resolve`).
2. the repository's, in each directory from the repository root (`memory_root`: the nearest
   ancestor with `.git`, found by name only) down to the working directory, more specific
   later, with their imports: read by the probe inside the sandbox, which mounts that root
   read-only.

Each file is labelled with its path; an import left out carries a note saying why.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from orchestrator.conversation import context_probe
from orchestrator.conversation.context_probe import MEMORY_FILES, collect
from policies import memory_files
from policies.memory_files import Skipped, within
from policies.rules import PathPattern
from sandbox.host import SandboxHost
from sandbox.safe_read import read_bounded_regular
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

if TYPE_CHECKING:
    from sandbox.spare import SpareSource

__all__ = [
    "MEMORY_FILES",
    "ContextSandbox",
    "ContextSnapshot",
    "MemorySources",
    "context_spec",
    "gather_context",
    "memory_root",
    "system_prompt",
]

_MAX_LINK_HOPS = 40

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
    """(path, contents) of each memory file found, in prompt order: the user's first, then
    the repository's from its root down to `cwd`, each followed by its imports."""
    git_risk: str | None = None
    """Why git may not run here without asking (a repository of the workspace configures a
    program under a driver's or remote's name: `context_probe._git_risk`); None: it may."""

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


def memory_root(cwd: Path, home: Path | None = None) -> Path:
    """The repository root memory files are looked for from (`policies.memory_files`),
    `cwd` when it is in no repository. Looks at names only."""
    if home is None:
        home = Path(os.environ.get("HOME") or Path.home())
    return Path(memory_files.memory_root(str(cwd), str(home)))


@dataclass(frozen=True)
class MemorySources:
    """Where memory files come from for one session."""

    root: Path
    """The repository root (`memory_root`); the probe mounts it and reads no file outside."""
    user_files: tuple[Path, ...] = ()
    """The user's own memory files, read on the host, first in the prompt."""
    home: Path | None = None
    """What `@~/...` means."""
    deny: tuple[PathPattern, ...] = ()
    """The policy's `Read` deny rules: no memory file or import they cover is read."""
    writable_roots: tuple[Path, ...] = ()
    """More directories the sandbox may write: a user file never imports from them."""

    @classmethod
    def for_session(
        cls,
        cwd: Path,
        *,
        config_dir: Path,
        home: Path | None = None,
        deny: Sequence[PathPattern] = (),
        writable_roots: Sequence[Path] = (),
    ) -> MemorySources:
        """The standard sources for a session in `cwd` (resolved): `config_dir/WARREN.md`
        and `~/.claude/CLAUDE.md`, the repository from `memory_root(cwd)`."""
        if home is None:
            home = Path(os.environ.get("HOME") or Path.home())
        return cls(
            root=memory_root(cwd, home),
            user_files=(config_dir / "WARREN.md", home / ".claude" / "CLAUDE.md"),
            home=home,
            deny=tuple(deny),
            writable_roots=tuple(writable_roots),
        )


@dataclass(frozen=True)
class ContextSandbox:
    """Where the probe runs when the floor is on: a read-only spec of the workspace (with
    the policy's masks) and the session's sandbox host. `spares`: the warm server's spare
    sandboxes (`orchestrator.cli.warm.spares`), where a session adopts a probe's sandbox started
    ahead of it from the very recipe it would use now, instead of starting one: the probe
    then runs only once its code arrives, so what it reports is the workspace as it is now."""

    spec: SandboxSpec
    host: SandboxHost | None = None
    spares: SpareSource | None = None


def context_spec(
    root: Path, *, deny_read: tuple[str, ...] = (), home_allow: tuple[str, ...] = ()
) -> SandboxSpec:
    """The one-shot sandbox the probe runs in: `root` read-only (the repository root,
    `MemorySources.root`, which holds the working directory: git and the memory files above
    it work from a subdirectory too), the policy's secrets masked, small limits (git on a
    huge repository must not stall the start)."""
    return SandboxSpec(
        workspaces=(WorkspaceRoot(path=root, mode="ro"),),
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
    cwd: Path,
    *,
    sandbox: ContextSandbox | None = None,
    memory: MemorySources | None = None,
    today: dt.date | None = None,
) -> ContextSnapshot:
    """Collect the snapshot (see `orchestrator.conversation.context_probe`), failing soft.

    With `sandbox` (whose spec mounts `memory.root`: `context_spec`), the probe runs in a
    one-shot read-only sandbox: nothing the repository configures or links to is run or read
    on the host. Without (the user turned the sandbox off), it runs here with git's
    code-running settings disabled and memory files read as bounded regular files. The
    user's memory files are read here meanwhile (see the module docstring). `memory`
    defaults to `cwd` as the root and no user files.

    **Cancellation:** each part gives up after `_PROBE_WALL_S` and the snapshot goes without
    it; a host read stuck in the kernel (a hung network mount) is abandoned in its thread.
    """
    memory = memory or MemorySources(root=cwd)
    deny = [pattern.wire() for pattern in memory.deny]
    facts: dict[str, Any] = {}
    user: list[list[str]] = []

    async def repository() -> None:
        nonlocal facts
        if sandbox is not None:
            facts = await _sandboxed(cwd, memory.root, deny, sandbox)
        else:
            with trio.move_on_after(_PROBE_WALL_S):
                facts = await trio.to_thread.run_sync(
                    lambda: collect(cwd, root=memory.root, deny=deny), abandon_on_cancel=True
                )

    async def users() -> None:
        nonlocal user
        if not memory.user_files:
            return
        with trio.move_on_after(_PROBE_WALL_S):
            user = await trio.to_thread.run_sync(_user_memory, memory, cwd, abandon_on_cancel=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(repository)
        nursery.start_soon(users)
    branch = facts.get("branch")
    status = facts.get("status")
    tree = facts.get("tree")
    found = facts.get("memory")
    risk = facts.get("git_risk")
    return ContextSnapshot(
        cwd=cwd,
        platform=f"{platform.system()} {platform.release()}",
        date=(today or dt.date.today()).isoformat(),
        git_branch=branch if isinstance(branch, str) else None,
        git_status=status if isinstance(status, str) else None,
        tree=tree if isinstance(tree, str) else "",
        memory=_pairs(user) + _pairs(found),
        git_risk=risk if isinstance(risk, str) else None,
    )


_RUN_COMPILED = (
    "import marshal, sys; path = sys.argv[1]; sys.argv[:2] = [path]; "
    "exec(marshal.loads(sys.stdin.buffer.read()), {'__name__': '__main__', '__file__': path})"
)
"""The sandboxed interpreter's program when the probe comes compiled on its stdin."""

_RUN_PIPED = (
    "import marshal, os, sys; i, o = map(int, os.environ.pop('WARREN_PIPE_FDS').split(',')); "
    "os.dup2(o, 1); os.close(o); path = sys.argv[1]; sys.argv[:2] = [path]; "
    "f = os.fdopen(i, 'rb'); code = marshal.loads(f.read()); f.close(); "
    "exec(code, {'__name__': '__main__', '__file__': path})"
)
"""`_RUN_COMPILED` over the private pipes a spare sandbox has (`sandbox.run.PIPE_FDS_ENV`,
`open_sandboxed_process(private_pipes=True)`): the code comes on the input pipe (it waits
for it there, started ahead of the session), the JSON goes to the output pipe, made its
stdout (git's output has pipes of its own)."""

_compiled_probe: tuple[tuple[int, int, int], bytes] | None = None
"""The probe's code, compiled by the warm server before it forks sessions
(`preload_probe`), with the identity of the file it was compiled from."""


def preload_probe() -> None:
    """Compile the probe now, for the sessions this process will fork: each runs it from its
    code (`marshal`, on the sandbox's stdin) instead of compiling its source in its sandbox,
    a quarter of the probe's CPU when no bytecode cache can be written
    (`PYTHONDONTWRITEBYTECODE`; a script is compiled on every run anyway). Never raises."""
    global _compiled_probe
    import marshal

    path = context_probe.__file__
    try:
        with open(path, "rb") as source:
            stamp = _stamp(os.fstat(source.fileno()))
            code = compile(source.read(), path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return
    _compiled_probe = (stamp, marshal.dumps(code))


def _stamp(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _probe_code() -> bytes | None:
    """The preloaded probe when its file is unchanged since."""
    if _compiled_probe is None:
        return None
    stamp, code = _compiled_probe
    try:
        info = os.stat(context_probe.__file__)
    except OSError:
        return None
    return code if _stamp(info) == stamp else None


async def _sandboxed(
    cwd: Path, root: Path, deny: list[memory_files.WirePattern], sandbox: ContextSandbox
) -> dict[str, Any]:
    from sandbox.errors import SandboxError
    from sandbox.run import run_sandboxed

    probe = context_probe.__file__
    args = [str(cwd), str(root), json.dumps(deny)]
    code = _probe_code()
    if code is not None and sandbox.spares is not None:
        argv = [sys.executable, "-I", "-S", "-c", _RUN_PIPED, probe, *args]
        try:
            return await _piped(sandbox, argv, code)
        except (SandboxError, OSError):
            return {}
    if code is None:
        argv = [sys.executable, "-I", "-S", probe, *args]
    else:
        argv = [sys.executable, "-I", "-S", "-c", _RUN_COMPILED, probe, *args]
    try:
        done = await run_sandboxed(sandbox.spec, argv, stdin=code, host=sandbox.host)
    except (SandboxError, OSError):
        return {}
    if done.exit_code != 0 or done.killed_by_limit is not None:
        return {}
    return _facts(done.stdout)


def _facts(stdout: bytes) -> dict[str, Any]:
    try:
        value = json.loads(stdout)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _piped(sandbox: ContextSandbox, argv: list[str], code: bytes) -> dict[str, Any]:
    """The probe in a sandbox with private pipes: a spare of the warm server's when one was
    started from this recipe, else a fresh one, whose recipe goes to the server for the
    next session (`open_sandboxed_process(spares=...)`). Its output is capped as
    `run_sandboxed` caps it; the wall-time limit holds from the adoption on."""
    from sandbox.run import open_sandboxed_process

    cap = sandbox.spec.limits.output_bytes or 1024**2
    out = bytearray()

    async def drain(stream: trio.abc.ReceiveStream) -> None:  # the probe's stderr: unused
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while await stream.receive_some(65536):
                pass

    async with (
        open_sandboxed_process(
            sandbox.spec, argv, host=sandbox.host, private_pipes=True, spares=sandbox.spares
        ) as proc,
        trio.open_nursery() as nursery,
    ):
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stderr is not None:
            nursery.start_soon(drain, proc.stderr)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await proc.stdin.send_all(code)
            await proc.stdin.aclose()
        while len(out) <= cap and (chunk := await proc.stdout.receive_some(65536)):
            out += chunk
        if len(out) > cap:
            nursery.cancel_scope.cancel()
            return {}
        await proc.wait()
    if proc.returncode != 0 or proc.killed_by_limit is not None:
        return {}
    return _facts(bytes(out))


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


def _user_memory(memory: MemorySources, cwd: Path) -> list[list[str]]:
    """The user's memory files and their imports, read on the host (see the module
    docstring), as `[path, text]` pairs."""
    forbidden = tuple(str(p) for p in (memory.root, cwd, *memory.writable_roots))

    def resolve(path: str) -> str:
        real = _user_resolve(path, forbidden)
        if any(p.matches(path) or p.matches(real) for p in memory.deny):
            raise Skipped("a Read deny rule covers it")
        return real

    entries = memory_files.gather(
        [str(p) for p in memory.user_files],
        resolve=resolve,
        read=lambda path, limit: read_bounded_regular(Path(path), limit),
        home=None if memory.home is None else str(memory.home),
    )
    return [[entry.label, entry.rendered()] for entry in entries]


def _user_resolve(path: str, forbidden: Sequence[str]) -> str:
    """The real location of `path`, resolved one component at a time like the kernel does,
    refused (`Skipped`) as soon as a step (a name, or where a link points) lies in one of
    the `forbidden` roots: the repository controls everything there, its links included.

    **Errors:** `Skipped`; `FileNotFoundError` and other `OSError`s from `lstat`/`readlink`.
    """
    pending = path.split("/")
    current = "/"
    hops = 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, name)
        if any(within(step, root) for root in forbidden):
            raise Skipped("it lies in a workspace: a user memory file imports only user files")
        info = os.lstat(step)
        if not stat.S_ISLNK(info.st_mode):
            current = step
            continue
        hops += 1
        if hops > _MAX_LINK_HOPS:
            raise Skipped("too many links")
        target = os.readlink(step)
        if target.startswith("/"):
            current = "/"
        pending = target.split("/") + pending
    return current


def system_prompt(
    snapshot: ContextSnapshot,
    *,
    extra: str | None = None,
    base: str | None = None,
    append: str | None = None,
) -> list[str]:
    """System blocks, most stable first (the client caches up to the last block).

    `base` replaces `BASE_PROMPT` (`--system-prompt`; `""`: no base prompt) and `append`
    follows it (`--append-system-prompt`), as Claude Code's flags do; the workspace context
    comes last either way.
    """
    blocks = [BASE_PROMPT if base is None else base]
    if append:
        blocks.append(append)
    if extra:
        blocks.append(extra)
    blocks = [block for block in blocks if block]
    blocks.append(snapshot.render())
    return blocks
