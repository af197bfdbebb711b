"""The `warren` command line as a parser and a printer: every command listed with a summary,
a first word that is not a command is the prompt, and the sandbox commands' values printed
(tests/sandbox/test_commands.py covers the values themselves)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.main import COMMANDS, main

WARREN = [sys.executable, "-m", "orchestrator.cli"]
ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in ("doctor", "sandbox", "policy", "trust", "untrust", "demo"):
        assert f"{name} {' '.join(COMMANDS[name].split())}" in out
    assert "--max-budget-usd" in out and "8 state could not be written" in out


@pytest.mark.parametrize("flag", ["-v", "--version"])
def test_version_is_looked_up_when_asked(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code in (0, None)
    assert capsys.readouterr().out == f"warren {version('warren')}\n"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_its_own_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert f"warren {command}" in capsys.readouterr().out


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"content": [{"type": "text", "text": "hello"}]}]}))
    return subprocess.run(
        [*WARREN, *args, "--model", f"scripted:{script}", "--sandbox", "off"],
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["fix the build"],
        ["-p", "fix the build"],
        ["--output-format", "text", "fix the build"],
        ["fix the build", "--output-format", "text"],
    ],
)
def test_a_first_word_that_is_no_command_is_the_prompt(args: list[str], tmp_path: Path) -> None:
    done = _run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello\n"
    sessions = tmp_path / "state" / "warren" / "sessions"
    [transcript] = [p for p in sessions.glob("*.jsonl") if ".audit." not in p.name]
    first = [json.loads(x) for x in transcript.read_text().splitlines()][1]
    assert first["message"]["content"][0]["text"] == "fix the build"


def test_the_prompt_given_twice_is_a_usage_error(tmp_path: Path) -> None:
    done = _run(["-p", "one", "two"], tmp_path)
    assert done.returncode == 2
    assert "give the prompt once" in done.stderr and "Traceback" not in done.stderr


def test_doctor_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    assert capsys.readouterr().out.startswith("floor: PROVEN")
    assert main(["doctor", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["proven"] is True and "stubs_swept" in payload


def test_sandbox_run_exit_codes_and_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    assert main(["sandbox", "run", "--workspace", str(ws), "--", "sh", "-c", "exit 3"]) == 3
    assert main(["sandbox", "run", "--workspace", str(ws)]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["sandbox", "run", "--workspace", str(tmp_path / "missing"), "--", "true"]) == 125
    assert "does not exist" in capsys.readouterr().err
