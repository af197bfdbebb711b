"""Trust in a repository: whether its own policy may loosen what Warren does.

A project's `.warren/policy.toml` travels with the repository, so anyone who can push to it
could write `allow = ["Bash"]`. Its allow rules (and later its hooks and agent definitions)
therefore take effect only after the user trusts that repository; its deny and ask rules
apply at once, since they only make Warren more careful.

Trust is stored per resolved repository path in the user's state directory
(`$XDG_STATE_HOME/warren/trust.json`), together with a hash of the project's policy files
(`.warren/policy.toml` and `.warren/policy.local.toml`). When either file changes, the hash no
longer matches and the repository is untrusted until the user trusts it again. The store is
read on every question and written atomically, so two Warren processes never see half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CURRENT",
    "LOCAL_POLICY",
    "PROJECT_POLICY",
    "TRUST_FILE_NAME",
    "TrustRecord",
    "TrustState",
    "TrustStore",
    "policy_hash",
    "project_policy_files",
    "project_policy_hash",
]

TRUST_FILE_NAME = "trust.json"
PROJECT_POLICY = Path(".warren/policy.toml")
"""The project's policy, committed with the repository (relative to its root)."""
LOCAL_POLICY = Path(".warren/policy.local.toml")
"""The user's own policy for one repository, ignored by git (relative to its root)."""

TrustState = Literal["trusted", "untrusted", "changed", "no project policy"]
"""`changed`: trusted once, but a policy file changed since (untrusted until re-trusted)."""


def policy_hash(files: Iterable[Path]) -> str | None:
    """A hash over the named files' names and contents; None when none of them exists.

    A missing file hashes differently from an empty one, so creating an empty local policy
    file next to a trusted project policy also asks again.
    """
    digest = hashlib.sha256()
    found = False
    for path in files:
        digest.update(path.name.encode() + b"\0")
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            digest.update(b"missing\0")
            continue
        found = True
        digest.update(b"%d\0" % len(content) + content)
    return digest.hexdigest() if found else None


def project_policy_files(root: Path) -> tuple[Path, Path]:
    """The project and local policy files of the repository at `root`."""
    return root / PROJECT_POLICY, root / LOCAL_POLICY


def project_policy_hash(root: Path) -> str | None:
    """`policy_hash` of the repository's project and local policy files."""
    return policy_hash(project_policy_files(root))


class _Current:
    """Sentinel: hash the project's policy files as they are now."""


CURRENT = _Current()


@dataclass(frozen=True)
class TrustRecord:
    path: str
    """The resolved repository path."""
    policy_hash: str | None
    """`policy_hash` of the project policy files when the user trusted them."""
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
        self.file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = json.dumps({"version": 1, "projects": projects}, indent=2, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=".trust-", dir=self.file.parent)
        done = False
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
            os.replace(tmp, self.file)
            done = True
        finally:
            if not done:
                Path(tmp).unlink(missing_ok=True)

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
        """Trust the repository at `path` with its policy files as they hash now.

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
        """The trust state of a repository whose project policy files hash to `current_hash`."""
        if current_hash is None:
            return "no project policy"
        record = self.record(path)
        if record is None:
            return "untrusted"
        return "trusted" if record.policy_hash == current_hash else "changed"
