"""Where Warren keeps its own files (XDG): sessions, logs, audit, config.

Computed from the environment each time (no module state), so tests point HOME or
XDG_STATE_HOME at a temporary directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WarrenDirs"]


@dataclass(frozen=True)
class WarrenDirs:
    state: Path
    """Sessions, logs and audit logs: `$XDG_STATE_HOME/warren` (default ~/.local/state/warren)."""
    config: Path
    """User policy and settings: `$XDG_CONFIG_HOME/warren` (default ~/.config/warren)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WarrenDirs:
        env = dict(os.environ) if env is None else env
        home = Path(env.get("HOME") or Path.home())
        state = Path(env.get("XDG_STATE_HOME") or home / ".local" / "state") / "warren"
        config = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "warren"
        return cls(state=state, config=config)

    @property
    def sessions(self) -> Path:
        return self.state / "sessions"

    @property
    def objects(self) -> Path:
        """File contents kept for undoing writing turns (orchestrator/changes/recorder.py)."""
        return self.state / "objects"

    @property
    def workflows(self) -> Path:
        """Workflow runs: each run's script, record and journal (orchestrator/workflows/)."""
        return self.state / "workflows"

    @property
    def logs(self) -> Path:
        return self.state / "logs"
