"""Real git repositories for tests: `git` runs git in a directory with no user or system
configuration of the machine's (HOME is the directory itself), `make_repo` makes one with a
first commit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={**os.environ, "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"},
    )


def make_repo(path: Path) -> Path:
    """A repository at `path` (created if missing) with README.md committed on `main`."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "init")
    return path
