"""Trust in a repository: whether what it contributes may loosen what Warren does.

A project's `.warren/policy.toml` travels with the repository, so anyone who can push to it
could write `allow = ["Bash"]`. Its allow rules, hooks (its own and those of its Claude Code
settings), agent definitions and MCP servers therefore take effect only after the user trusts
that repository; its deny and ask rules apply at once, since they only make Warren more
careful.

Trust is stored per resolved repository path in the user's state directory
(`$XDG_STATE_HOME/warren/trust.json`), together with a hash of everything the repository
contributes (`repository_files`): the project and local policy files (rules, mode, limits,
hooks), Claude Code's settings files (`.claude/settings.json`, `.claude/settings.local.json`:
permissions and hooks), agent definitions (`.warren/agents/*.md`, `.claude/agents/*.md`),
MCP configuration
(`.mcp.json`, `.warren/mcp.json`) and memory files: the root's `MEMORY_FILES`, and every other
file `orchestrator.conversation.context` puts in the system prompt from the repository
(`_memory_files`: memory files in the directories from the repository root down, the targets of
links among them, their `@imports`). When any of them changes, appears or goes, the hash no longer
matches and the repository is untrusted until the user trusts it again.

Hashing reads repository content on the host, so it goes through `policies.atomic`: no link
is followed (a link hashes as its target's text, never the target's bytes), a FIFO or device
is a state and never read, and a file over `MAX_HASHED_BYTES` hashes as `too large` with its
size and time. The store is read on every question and replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from policies import memory_files
from policies.atomic import open_directory, read_regular, write_atomic
from policies.claude_settings import claude_settings_files

__all__ = [
    "AGENTS_DIR",
    "CLAUDE_AGENTS_DIR",
    "CURRENT",
    "LOCAL_POLICY",
    "MAX_HASHED_BYTES",
    "MCP_FILES",
    "MEMORY_FILES",
    "PROJECT_POLICY",
    "TRUST_FILE_NAME",
    "TrustRecord",
    "TrustState",
    "TrustStore",
    "policy_hash",
    "project_policy_files",
    "project_policy_hash",
    "repository_files",
]

TRUST_FILE_NAME = "trust.json"
PROJECT_POLICY = Path(".warren/policy.toml")
"""The project's policy, committed with the repository (relative to its root)."""
LOCAL_POLICY = Path(".warren/policy.local.toml")
"""The user's own policy for one repository, ignored by git (relative to its root)."""
AGENTS_DIR = Path(".warren/agents")
"""Project agent definitions, `*.md` (`orchestrator.agents.types.load_agent_types`)."""
CLAUDE_AGENTS_DIR = Path(".claude/agents")
"""Claude Code's agent definitions in a repository, read as Warren's are."""
MCP_FILES: Final = (Path(".mcp.json"), Path(".warren/mcp.json"))
"""MCP server configuration. Hashed before Warren reads them, so a file planted today is not
trusted unseen on the day MCP support reads it."""
MEMORY_FILES: Final = memory_files.MEMORY_FILES
"""Memory files at the repository root, always hashed (missing is a state too); the others
the prompt holds are added when they exist (`_memory_files`)."""
MAX_HASHED_BYTES: Final = 1 << 20
"""A larger file hashes as `too large` with its size and modification time, unread."""

TrustState = Literal["trusted", "untrusted", "changed", "no project policy"]
"""`changed`: trusted once, but a file it contributes changed since (untrusted until
re-trusted). `no project policy`: the repository contributes nothing (none of the files
exists), so there is nothing to trust."""


def policy_hash(files: Iterable[Path], *, root: Path | None = None) -> str | None:
    """A hash over the named files' names, kinds and contents; None when none of them exists.

    A missing file hashes differently from an empty one, so creating an empty local policy
    file next to a trusted project policy also asks again. With `root`, names are relative
    to it and no directory below it is followed through a link. No file is followed through
    a link, read past `MAX_HASHED_BYTES`, or read at all when it is not a regular file.
    """
    digest = hashlib.sha256()
    found = False
    for path in files:
        inside = root is not None and path.is_relative_to(root)
        # A memory file above the workspace is named `../CLAUDE.md`.
        name = path.name if root is None else os.path.relpath(path, root)
        try:
            seen = read_regular(path, limit=MAX_HASHED_BYTES, beneath=root if inside else None)
        except OSError as exc:  # unreadable: a state of its own, so trust cannot pass it by
            digest.update(f"{name}\0unreadable {exc.errno}\0".encode())
            found = True
            continue
        digest.update(f"{name}\0{seen.state}\0".encode("utf-8", "surrogateescape"))
        if seen.state == "missing":
            continue
        found = True
        detail = seen.detail.encode("utf-8", "surrogateescape")
        digest.update(b"%d\0" % len(detail) + detail)
        digest.update(b"%d\0" % len(seen.content) + seen.content)
    return digest.hexdigest() if found else None


def project_policy_files(root: Path) -> tuple[Path, Path]:
    """The project and local policy files of the repository at `root`."""
    return root / PROJECT_POLICY, root / LOCAL_POLICY


def repository_files(root: Path, *, policy_files: Iterable[Path] | None = None) -> list[Path]:
    """Every file the repository at `root` contributes, in a fixed order (see the module
    docstring). `policy_files` replaces the two standard policy files (a test seam)."""
    files = list(project_policy_files(root) if policy_files is None else policy_files)
    files += claude_settings_files(root)
    files += [root / name for name in MCP_FILES]
    files += [root / name for name in MEMORY_FILES]
    files += _agent_files(root)
    files += _memory_files(root)
    return files


def _memory_files(root: Path) -> list[Path]:
    """The memory files the context probe would read for a session in `root` besides the
    root's own `MEMORY_FILES`, by their real paths, in prompt order: the existing ones from
    the repository root (`memory_files.memory_root`) down, link targets inside the
    repository, and their imports (`memory_files.gather`, the probe's rules without the deny
    rules: hashing a denied import too only asks more). Read here as `read_regular` does,
    never through a link; a file over `MAX_HASHED_BYTES` is listed and hashed as too large.
    """
    home = os.environ.get("HOME")
    top = memory_files.memory_root(str(root), home)
    real_top = os.path.realpath(top)

    def read(path: str, limit: int) -> tuple[bytes, bool]:
        seen = read_regular(Path(path), limit=MAX_HASHED_BYTES, beneath=Path(real_top))
        if seen.state == "too large":
            return b"", True
        if seen.state != "file":
            raise OSError(f"{path}: {seen.state}")
        return seen.content[:limit], len(seen.content) > limit

    own = {str(root / name) for name in MEMORY_FILES}
    entries = memory_files.gather(
        memory_files.memory_chain(top, str(root)),
        resolve=memory_files.resolver(top, real_top),
        read=read,
        home=home,
    )
    return [Path(entry.real) for entry in entries if entry.real not in own]


def _agent_files(root: Path) -> list[Path]:
    """`*.md` files of the agents directories (Warren's, then Claude Code's), listed without
    following a link to them. A link (or anything else) where a directory should be is itself
    an entry, hashed as such."""
    return _agents_in(root, AGENTS_DIR) + _agents_in(root, CLAUDE_AGENTS_DIR)


def _agents_in(root: Path, relative: Path) -> list[Path]:
    directory = root / relative
    try:
        fd = open_directory(directory, beneath=root)
    except FileNotFoundError:
        return []
    except OSError:  # a link on the way, a file named `agents`, unreadable
        return [directory]
    try:
        return [directory / name for name in sorted(os.listdir(fd)) if name.endswith(".md")]
    finally:
        os.close(fd)


def project_policy_hash(root: Path, *, policy_files: Iterable[Path] | None = None) -> str | None:
    """`policy_hash` of everything the repository at `root` contributes (`repository_files`);
    None when it contributes nothing."""
    root = root.resolve()
    return policy_hash(repository_files(root, policy_files=policy_files), root=root)


class _Current:
    """Sentinel: hash the project's policy files as they are now."""


CURRENT = _Current()


@dataclass(frozen=True)
class TrustRecord:
    path: str
    """The resolved repository path."""
    policy_hash: str | None
    """`project_policy_hash` of the repository when the user trusted it."""
    trusted_at: float
    """Unix time of the trust decision."""


class TrustStore:
    """The user's trust decisions, in one JSON file.

    A missing or unreadable file means "nothing is trusted": a corrupt store can only make
    Warren ask more, never less. The next `trust` rewrites it.
    """

    def __init__(self, file: Path) -> None:
        self.file = file

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrustStore:
        """The store in `$XDG_STATE_HOME/warren/` (default `~/.local/state/warren/`)."""
        env = os.environ if env is None else env
        home = Path(env.get("HOME") or Path.home())
        state = Path(env.get("XDG_STATE_HOME") or home / ".local" / "state")
        return cls(state / "warren" / TRUST_FILE_NAME)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        projects = data.get("projects") if isinstance(data, dict) else None
        return projects if isinstance(projects, dict) else {}

    def _write(self, projects: dict[str, Any]) -> None:
        """Replace the store atomically. **Errors:** `OSError` (then nothing changed)."""
        text = json.dumps({"version": 1, "projects": projects}, indent=2, sort_keys=True)
        write_atomic(self.file, (text + "\n").encode("utf-8"), mode=0o600, dir_mode=0o700)

    def record(self, path: Path) -> TrustRecord | None:
        """The stored decision for `path` (resolved), if any."""
        key = str(path.resolve())
        entry = self._read().get(key)
        if not isinstance(entry, dict):
            return None
        stored_hash = entry.get("policy_hash")
        trusted_at = entry.get("trusted_at")
        return TrustRecord(
            path=key,
            policy_hash=stored_hash if isinstance(stored_hash, str) else None,
            trusted_at=float(trusted_at) if isinstance(trusted_at, int | float) else 0.0,
        )

    def trust(self, path: Path, current_hash: str | _Current | None = CURRENT) -> TrustRecord:
        """Trust the repository at `path` with what it contributes as it hashes now.

        Pass `current_hash` when the caller already hashed what the user saw, so a file that
        changed between showing and trusting is not trusted unseen.
        """
        if isinstance(current_hash, _Current):
            current_hash = project_policy_hash(path)
        record = TrustRecord(str(path.resolve()), current_hash, time.time())
        projects = self._read()
        projects[record.path] = {"policy_hash": current_hash, "trusted_at": record.trusted_at}
        self._write(projects)
        return record

    def untrust(self, path: Path) -> bool:
        """Forget the decision for `path`; True when there was one."""
        key = str(path.resolve())
        projects = self._read()
        if key not in projects:
            return False
        del projects[key]
        self._write(projects)
        return True

    def is_trusted(self, path: Path, current_hash: str | None) -> bool:
        """Trusted, with the policy files unchanged since (same hash)."""
        record = self.record(path)
        return record is not None and record.policy_hash == current_hash

    def state(self, path: Path, current_hash: str | None) -> TrustState:
        """The trust state of a repository whose contributions hash to `current_hash`."""
        if current_hash is None:
            return "no project policy"
        record = self.record(path)
        if record is None:
            return "untrusted"
        return "trusted" if record.policy_hash == current_hash else "changed"
