"""Choosing bwrap: version checks, refusals, never a bwrap from $PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox.binary import MIN_BWRAP_VERSION, find_bwrap, parse_bwrap_version
from sandbox.errors import SandboxUnavailable


@pytest.mark.parametrize(
    ("text", "version"),
    [("bubblewrap 0.11.0\n", (0, 11, 0)), ("bubblewrap 0.8", (0, 8, 0)), ("nonsense", None)],
)
def test_parse_version(text: str, version: tuple[int, int, int] | None) -> None:
    assert parse_bwrap_version(text) == version


def _script(path: Path, version: str) -> Path:
    path.write_text(f'#!/bin/sh\necho "bubblewrap {version}"\n')
    path.chmod(0o755)
    return path


async def test_bundled_or_system_bwrap_is_found() -> None:
    binary = await find_bwrap()
    assert binary.version >= MIN_BWRAP_VERSION
    assert binary.source in ("system", "bundled")
    assert binary.describe().startswith("bwrap ")


async def test_path_is_never_searched(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(scratch / "bwrap", "9.9.9")
    monkeypatch.setenv("PATH", f"{scratch}:{os.environ['PATH']}")
    binary = await find_bwrap()
    assert binary.path != scratch / "bwrap"


async def test_too_old_is_refused(scratch: Path) -> None:
    with pytest.raises(SandboxUnavailable, match=r"older than 0\.8\.0") as info:
        await find_bwrap(explicit=_script(scratch / "bwrap", "0.7.0"))
    assert len(info.value.tried) == 1


async def test_setuid_is_refused(scratch: Path) -> None:
    path = _script(scratch / "bwrap", "0.11.0")
    path.chmod(0o755 | stat.S_ISUID)
    with pytest.raises(SandboxUnavailable, match="setuid"):
        await find_bwrap(explicit=path)


async def test_missing_is_refused(scratch: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="missing"):
        await find_bwrap(explicit=scratch / "nope")
