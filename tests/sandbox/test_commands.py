"""`warren doctor` and `warren sandbox run` as plain functions returning values (the CLI,
orchestrator/cli/subcommands/doctor.py, prints them: tests/orchestrator/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.commands import doctor, sandbox_run
from sandbox.errors import SandboxError


@pytest.fixture(autouse=True)
def private_state(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the doctor's probe and stub registry out of the real home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(scratch / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(scratch / "cache"))


def test_doctor_proves_the_floor() -> None:
    report = doctor()
    assert report.floor.proven is True
    assert {c.name for c in report.floor.checks} >= {"no_capabilities", "network_fails"}
    assert report.floor.bwrap_version


def test_sandbox_run_passes_the_exit_code_through(scratch: Path) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    result = sandbox_run(ws, False, ["sh", "-c", "echo hi > out; exit 3"])
    assert result.exit_code == 3 and result.notes == ()
    assert (ws / "out").read_text() == "hi\n"


def test_sandbox_run_read_only(scratch: Path) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    assert sandbox_run(ws, True, ["touch", "x"]).exit_code != 0
    assert not (ws / "x").exists()


def test_sandbox_run_refusals(scratch: Path) -> None:
    with pytest.raises(ValueError, match="no command"):
        sandbox_run(scratch, False, [])
    with pytest.raises(SandboxError, match="does not exist"):
        sandbox_run(scratch / "missing", False, ["true"])
