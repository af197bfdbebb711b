"""`warren doctor` and `warren sandbox run` as plain functions (the CLI wires them later)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox.commands import EXIT_SANDBOX_ERROR, doctor, sandbox_run


@pytest.fixture(autouse=True)
def private_state(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the doctor's probe and stub registry out of the real home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(scratch / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(scratch / "cache"))


def test_doctor_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(json_output=True) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["proven"] is True
    assert {c["name"] for c in payload["checks"]} >= {"no_capabilities", "network_fails"}
    assert payload["bwrap_version"]


def test_doctor_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor(json_output=False) == 0
    assert capsys.readouterr().out.startswith("floor: PROVEN")


def test_sandbox_run_passes_the_exit_code_through(scratch: Path) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    assert sandbox_run(ws, False, "off", ["sh", "-c", "echo hi > out; exit 3"]) == 3
    assert (ws / "out").read_text() == "hi\n"


def test_sandbox_run_read_only(scratch: Path) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    assert sandbox_run(ws, True, "off", ["touch", "x"]) != 0
    assert not (ws / "x").exists()


def test_sandbox_run_refusals(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sandbox_run(scratch, False, "on", ["true"]) == 2
    assert sandbox_run(scratch, False, "off", []) == 2
    assert sandbox_run(scratch / "missing", False, "off", ["true"]) == EXIT_SANDBOX_ERROR
    assert "does not exist" in capsys.readouterr().err
