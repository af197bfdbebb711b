"""`/init`'s starter WARREN.md: a template filled with what the repository shows at a glance.

What it fills in comes from names only (the top-level entries) and the test and build
commands `warren policy init` detects; nothing is executed. The file is created, never
overwritten, and not through a link (`O_EXCL | O_NOFOLLOW`).
"""

from __future__ import annotations

import os
from pathlib import Path

from policies.commands import detect_project_commands

__all__ = ["starter_memory", "write_starter_memory"]

MEMORY_FILE = "WARREN.md"
_SKIPPED = {".git", ".warren", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache"}


def starter_memory(root: Path) -> str:
    """The text of a starter WARREN.md for the repository at `root`."""
    commands = [rule.removeprefix("Bash(").removesuffix(")").removesuffix(":*")
                for rule, _ in detect_project_commands(root)]  # fmt: skip
    try:
        entries = sorted(
            (e for e in os.scandir(root) if e.name not in _SKIPPED), key=lambda e: e.name
        )
    except OSError:
        entries = []
    layout = [
        f"- `{e.name}{'/' if e.is_dir(follow_symlinks=False) else ''}`"
        for e in entries
        if not e.name.startswith(".")
    ][:30]
    listed = "\n".join(f"- `{c}`" for c in commands) or "- (none found: add them here)"
    return f"""\
# {root.name}

Notes for Warren (and people) working in this repository. Warren reads this file at the
start of every session; keep it short and true.

## Commands

{listed}

## Layout

{chr(10).join(layout) or "- (empty)"}

## Conventions

- (how code here is written, tested and reviewed)
"""


def write_starter_memory(root: Path) -> str:
    """Create `root/WARREN.md` from the template; a sentence saying what happened."""
    target = root / MEMORY_FILE
    text = starter_memory(root)
    try:
        fd = os.open(
            target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
    except FileExistsError:
        return f"{target} exists; edit it instead (nothing was written)"
    except OSError as exc:
        return f"could not write {target}: {exc.strerror or exc}"
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return f"wrote {target}"
