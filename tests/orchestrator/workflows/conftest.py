"""Fixtures of the workflow tests: the machine's sandbox facts, found once per module, and a
workspace with a file in it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from sandbox.host import SandboxHost, detect_host


@pytest.fixture(scope="module")
def sandbox_host() -> SandboxHost:
    return trio.run(detect_host)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("print('original')\n")
    return root
