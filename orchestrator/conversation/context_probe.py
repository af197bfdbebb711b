"""The workspace facts the system prompt shows (git branch and status, a top-level listing,
the repository's memory files), collected without letting the repository run code or point us
elsewhere.

`orchestrator.conversation.context` runs this file as a script inside a one-shot read-only sandbox
(`python -I -S context_probe.py CWD ROOT DENY`, JSON on stdout; ROOT is the repository root
mounted read-only, DENY the `Read` deny rules as JSON), and calls `collect` in-process only
when the user turned the sandbox off. Either way it is hardened on its own: git's
code-running settings are disabled (fsmonitor, hooks, external diff, pager; no system config;
submodules ignored, so a gitlink's configuration is never read), and memory files (from ROOT
down to CWD, with their `@imports`: `policies.memory_files`) are opened as bounded regular
files, never outside ROOT, never through a link leading out of it, never when a deny rule
covers them (`sandbox.safe_read`).

Stdlib only, imports nothing of Warren's package `__init__`s: the sandboxed run must start in
milliseconds, so the safe-read and memory-file helpers are loaded by file path, and only when
a memory file exists. Every module it imports is paid for by each launch (in its sandbox, the
interpreter imports nothing in advance): not `typing`, `pathlib`, `dataclasses` or
`importlib.util`, and not `subprocess` or `json` either (with `re`, `enum`, `signal` and
`threading` behind them, two thirds of the probe's own time): git is started with
`os.posix_spawnp` (`git -C CWD`, as spawning has no working directory of its own), and JSON
is read and written with the C helpers of `_json`.
"""

from __future__ import annotations

import os
import select
import sys
import time

TYPE_CHECKING = False  # `typing.TYPE_CHECKING` without importing `typing` (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from types import ModuleType
    from typing import Any

    from policies.memory_files import WirePattern

__all__ = ["MEMORY_FILES", "collect", "git_argv", "git_env"]

MEMORY_FILES = ("WARREN.md", "AGENTS.md", "CLAUDE.md")
"""Memory file names read in each directory from the repository root down, in this order
(`policies.memory_files.MEMORY_FILES`; a test keeps the two equal)."""

MAX_STATUS_LINES = 40
MAX_STATUS_BYTES = 64 * 1024
MAX_TREE_ENTRIES = 60
MAX_TREE_SCAN = 10_000
"""Directory entries looked at for the listing; more are counted as `... and more`."""
GIT_TIMEOUT_S = 5.0

MAX_REPOSITORIES = 16
"""Nested repositories whose configuration the probe reads."""
MAX_WALK_DIRS = 4000
"""Directories the search for nested repositories opens, at most."""

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_EXTERNAL_DIFF": "",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "LC_ALL": "C",
}


def git_argv(*args: str) -> list[str]:
    """`git <safety options> args...`: every code-running setting neutralised
    (`sandbox.git_safety`), no optional locks, no pager."""
    return ["git", *_git_safety().config_args(), "--no-optional-locks", "--no-pager", *args]


def git_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without any `GIT_*` variable, plus the ones that keep git from reading the
    system configuration, prompting, paging, taking optional locks or running a proxy
    (`sandbox.git_safety.NEUTRAL_ENV`)."""
    kept = {k: v for k, v in environ.items() if not k.startswith("GIT_")}
    return kept | _GIT_ENV | dict(_git_safety().NEUTRAL_ENV)


_Git = tuple[int, int, float]
"""A started git: its pid, the read end of its stdout, and its deadline (`time.monotonic`)."""


def collect(
    cwd: Path | str, *, root: Path | str | None = None, deny: Sequence[WirePattern] = ()
) -> dict[str, Any]:
    """The facts as plain JSON values: `branch`, `status` (None outside a repository),
    `tree` (listing text) and `memory` (list of `[path, text]`, from `root`, default `cwd`,
    down to `cwd`; `deny`: the `Read` deny rules, `policies.rules.PathPattern.wire`)."""
    env = git_env(os.environ)
    # Both git commands at once: start-up costs the slower one, not their sum.
    branch = _start(["-C", str(cwd), "rev-parse", "--abbrev-ref", "HEAD"], env)
    status = _start(
        ["-C", str(cwd), "status", "--short", "--ignore-submodules=all", "--no-renames"], env
    )
    tree = _tree(cwd)
    memory = _memory(cwd, root or cwd, deny)
    branch_text = _finish(branch, 4096)
    status_text = _finish(status, MAX_STATUS_BYTES)
    if status_text is not None:
        lines = status_text.splitlines()
        if len(lines) > MAX_STATUS_LINES:
            more = len(lines) - MAX_STATUS_LINES
            lines = [*lines[:MAX_STATUS_LINES], f"... and {more} more"]
        status_text = "\n".join(lines)
    return {
        "branch": branch_text,
        "status": status_text if branch_text is not None else None,
        "tree": tree,
        "memory": memory,
        "git_risk": _git_risk(cwd, env) if branch_text is not None else None,
    }


def _git_risk(cwd: Path | str, env: dict[str, str]) -> str | None:
    """Why git may not run here without asking: a repository the workspace holds (its own,
    or one nested in it) whose own configuration names a program under a driver's or
    remote's name (`sandbox.git_safety.risky_key`), or nested repositories too many to
    read; None when there is none."""
    safety = _git_safety()
    # What the search does not reach (a huge tree, more repositories) is guarded when a git
    # command runs: the read-only one-shot's git refuses such a repository then.
    found = _nested_repositories(str(cwd))
    listings = [
        (path, _start(["-C", path, *_CONFIG_LISTING], env)) for path in [str(cwd), *found]
    ]
    for path, listing in listings:
        text = _finish(listing, MAX_STATUS_BYTES) or ""
        for line in text.splitlines():
            scope, _, name = line.partition("\t")
            if scope in ("local", "worktree") and safety.risky_key(name):
                where = os.path.relpath(path, cwd)
                what = "its own repository" if where == "." else f"the repository at {where}"
                return f"{what} configures `{name}`, a program git runs"
    return None


_CONFIG_LISTING = ("config", "--list", "--includes", "--show-scope", "--name-only")
"""What a repository's own configuration names (with what it includes), by scope."""


def _nested_repositories(top: str) -> list[str]:
    """Directories below `top` holding a `.git` (a nested repository, a submodule, a
    worktree), links never followed: at most `MAX_REPOSITORIES`, from at most
    `MAX_WALK_DIRS` directories."""
    found: list[str] = []
    pending = [top]
    opened = 0
    while pending and opened < MAX_WALK_DIRS and len(found) < MAX_REPOSITORIES:
        directory = pending.pop()
        opened += 1
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name == ".git":
                        if directory != top:
                            found.append(directory)
                    elif entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
        except OSError:
            continue
    return found[:MAX_REPOSITORIES]


def _start(args: list[str], env: dict[str, str]) -> _Git | None:
    """`git <safety options> args...` started with its stdout on a pipe, stdin and stderr on
    /dev/null; None when it cannot be started."""
    read_end, write_end = os.pipe()  # both close on exec: the child gets only its dup
    try:
        pid = os.posix_spawnp(
            "git",
            git_argv(*args),
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write_end, 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
        )
    except OSError:
        os.close(read_end)
        return None
    finally:
        os.close(write_end)
    return pid, read_end, time.monotonic() + GIT_TIMEOUT_S


def _finish(git: _Git | None, limit: int) -> str | None:
    """Its output (at most `limit` bytes) when it exits 0 within its deadline; else None
    (and it is killed)."""
    if git is None:
        return None
    pid, fd, deadline = git
    out = bytearray()
    try:
        while len(out) < limit:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                _kill(pid)
                return None
            chunk = os.read(fd, limit - len(out))
            if not chunk:
                break
            out += chunk
    except OSError:
        _kill(pid)
        return None
    finally:
        os.close(fd)  # a git with more to say ends on SIGPIPE
    status = _wait(pid, deadline)
    if status is None or os.waitstatus_to_exitcode(status) != 0:
        return None
    return out.decode("utf-8", "replace").rstrip("\n")


def _wait(pid: int, deadline: float) -> int | None:
    """The wait status of `pid` once it exits; None when it outlives `deadline` (it is
    killed then)."""
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if done:
            return status
        if time.monotonic() >= deadline:
            _kill(pid)
            return None
        time.sleep(0.001)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)  # SIGKILL (the `signal` module costs milliseconds to import)
        os.waitpid(pid, 0)
    except OSError:
        pass


def _tree(cwd: Path | str) -> str:
    names: list[str] = []
    extra = 0
    try:
        with os.scandir(cwd) as entries:
            for entry in entries:
                if len(names) >= MAX_TREE_SCAN:
                    extra += 1
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
                if entry.name == ".git" and is_dir:
                    continue
                names.append(entry.name + ("/" if is_dir else ""))
    except OSError:
        return ""
    names.sort()
    more = len(names) - MAX_TREE_ENTRIES + extra
    text = "\n".join(f"- {name}" for name in names[:MAX_TREE_ENTRIES])
    return text + (f"\n- ... and {more} more" if more > 0 else "")


def _memory(cwd: Path | str, root: Path | str, deny: Sequence[WirePattern]) -> list[list[str]]:
    """Memory files from `root` down to `cwd` with their imports (`policies.memory_files`):
    inside `root` only, never through a link leading out of it, never a file a `Read` deny
    rule covers, each read as a bounded regular file."""
    if not _any_memory_file(str(cwd), str(root)):
        return []  # the usual case: no need to load the helpers
    memory = _load_memory_files()
    read = _safe_reader()
    entries = memory.gather(
        memory.memory_chain(str(root), str(cwd)),
        resolve=memory.resolver(str(root), os.path.realpath(root), deny),
        read=read,
        home=os.environ.get("HOME"),
    )
    return [[entry.label, entry.rendered()] for entry in entries]


def _any_memory_file(cwd: str, root: str) -> bool:
    """Does any name `policies.memory_files.memory_chain` would look at exist (as anything:
    what it is, `gather` decides)? The chain's directories are `root` and those below it down
    to `cwd`, or `cwd` alone when it is not below `root`; a test keeps this and
    `memory_chain` equal."""
    root, cwd = os.path.normpath(root), os.path.normpath(cwd)
    if not (cwd == root or cwd.startswith(root.rstrip("/") + "/")):
        root = cwd
    directory = root
    dirs = [root]
    for part in cwd[len(root) :].strip("/").split("/"):
        if part:
            directory = os.path.join(directory, part)
            dirs.append(directory)
    return any(os.path.lexists(os.path.join(d, name)) for d in dirs for name in MEMORY_FILES)


def _load_memory_files() -> ModuleType:
    if __name__ != "__main__":
        import policies.memory_files

        return policies.memory_files
    return _load_by_path("_warren_memory_files", ("policies", "memory_files.py"))


def _safe_reader() -> Callable[[str, int], tuple[bytes, bool]]:
    if __name__ != "__main__":
        from sandbox.safe_read import read_bounded_regular

        return read_bounded_regular
    module = _load_by_path("_warren_safe_read", ("sandbox", "safe_read.py"))
    reader: Callable[[str, int], tuple[bytes, bool]] = module.read_bounded_regular
    return reader


def _git_safety() -> ModuleType:
    if __name__ != "__main__":
        import sandbox.git_safety

        return sandbox.git_safety
    loaded = sys.modules.get("_warren_git_safety")
    if loaded is not None:
        return loaded
    return _load_by_path("_warren_git_safety", ("sandbox", "git_safety.py"))


def _load_by_path(name: str, parts: tuple[str, str]) -> ModuleType:
    """A module of ours loaded by its path below the repository root (this file is
    orchestrator/conversation/context_probe.py), with no package imported."""
    import importlib.machinery  # already loaded by the interpreter, unlike importlib.util
    import types

    here = os.path.realpath(__file__)
    location = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(here))), *parts)
    loader = importlib.machinery.SourceFileLoader(name, location)
    module = types.ModuleType(name)
    module.__file__ = location
    module.__loader__ = loader
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _dumps(value: object) -> str:
    """JSON of the facts (strings, None, lists and dicts of them) by `_json`'s string encoder:
    what `json.dumps` gives them, without importing `json`."""
    import _json

    if value is None:
        return "null"
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{_dumps(str(key))}: {_dumps(item)}" for key, item in value.items())
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"not a fact: {type(value).__name__}")


class _Decoding:
    """What `_json.make_scanner` reads from a decoder: `json.loads`'s defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name)  # NaN, Infinity, -Infinity


def _loads(text: str) -> Any:
    """`json.loads(text)` by `_json`'s scanner, without importing `json`."""
    import _json

    # typeshed types the context as a scanner; the C code reads only `_Decoding`'s attributes
    scan = _json.make_scanner(_Decoding())  # type: ignore[arg-type]
    value, end = scan(text, 0)
    if text[end:].strip():
        raise ValueError("extra data after the JSON value")
    return value


if __name__ == "__main__":
    sys.stdout.write(_dumps(collect(sys.argv[1], root=sys.argv[2], deny=_loads(sys.argv[3]))))
