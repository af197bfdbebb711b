"""State that cannot be written, end to end with the real `warren` process: a full or
read-only state directory, a read-only HOME, ENOSPC while the transcript is written. Always
one clear line, never a traceback: exit 2 at start-up (nothing ran), `io_error` (exit 8)
mid-run. The directories are real mounts (a tiny tmpfs, a read-only bind mount), since root
ignores permission bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here (tests run as root in CI): {done.stderr.strip()}")


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def full_tmpfs(path: Path, size: str, mounts: list[Path]) -> Path:
    path.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    mounts.append(path)
    return path


def read_only(path: Path, mounts: list[Path]) -> Path:
    path.mkdir()
    _mount("--bind", str(path), str(path))
    mounts.append(path)
    _mount("-o", "remount,ro,bind", str(path))
    return path


def script(tmp_path: Path, turns: list[dict[str, object]]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def warren(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, *args, "--cwd", str(cwd)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


HELLO = [{"content": [{"type": "text", "text": "hello"}]}]


def _one_clear_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("sandbox", ["required", "off"])
def test_a_full_state_directory_at_start_up_is_exit_2(
    tmp_path: Path, workspace: Path, mounts: list[Path], sandbox: str
) -> None:
    state = full_tmpfs(tmp_path / "state", "8k", mounts)
    with pytest.raises(OSError, match="No space left"):
        (state / "filler").write_bytes(b"x" * 16384)  # now it is full
    done = warren(
        ["-p", "hi", "--model", script(tmp_path, HELLO), "--sandbox", sandbox],
        {"XDG_STATE_HOME": str(state), "HOME": str(tmp_path)},
        workspace,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    line = _one_clear_line(done.stderr.replace(_SANDBOX_OFF_WARNING, ""))
    assert "No space left on device" in line and "XDG_STATE_HOME" in line


_SANDBOX_OFF_WARNING = (
    "warning: --sandbox=off: tool calls run directly on this machine, with your full "
    "permissions, network and secrets; only the permission checks stand between the model "
    "and your system.\n"
)


def test_a_read_only_state_directory_is_exit_2(
    tmp_path: Path, workspace: Path, mounts: list[Path]
) -> None:
    state = read_only(tmp_path / "state", mounts)
    done = warren(
        ["-p", "hi", "--model", script(tmp_path, HELLO)],
        {"XDG_STATE_HOME": str(state), "HOME": str(tmp_path)},
        workspace,
    )
    assert done.returncode == 2, done.stderr
    line = _one_clear_line(done.stderr)
    assert "Read-only file system" in line and str(state) in line


def test_a_read_only_home_is_exit_2(tmp_path: Path, workspace: Path, mounts: list[Path]) -> None:
    home = read_only(tmp_path / "home", mounts)
    done = warren(["-p", "hi", "--model", script(tmp_path, HELLO)], {"HOME": str(home)}, workspace)
    assert done.returncode == 2, done.stderr
    line = _one_clear_line(done.stderr)
    assert "Read-only file system" in line and str(home) in line


def test_enospc_while_writing_the_transcript_ends_io_error(
    tmp_path: Path, workspace: Path, mounts: list[Path]
) -> None:
    """The state directory has room for the start, not for a 90 kB Read result: the run
    ends `io_error`, exit 8, its result printed, and the transcript keeps what fit."""
    state = full_tmpfs(tmp_path / "state", "64k", mounts)
    big = workspace / "big.txt"
    big.write_text(("y" * 99 + "\n") * 900)
    turns = [
        {"content": [{"type": "tool_use", "name": "Read", "input": {"file_path": str(big)}}]},
        {"content": [{"type": "text", "text": "done"}]},
    ]
    done = warren(
        ["-p", "read it", "--model", script(tmp_path, turns), "--output-format", "json"],
        {"XDG_STATE_HOME": str(state), "HOME": str(tmp_path)},
        workspace,
    )
    assert done.returncode == 8, done.stderr
    assert "Traceback" not in done.stderr
    result = json.loads(done.stdout)
    assert result["terminal_reason"] == "io_error" and result["is_error"] is True
    assert "No space left on device" in result["result"]
    [transcript] = [
        p for p in (state / "warren" / "sessions").glob("*.jsonl") if ".audit." not in p.name
    ]
    records = [json.loads(line) for line in transcript.read_text().splitlines()[:2]]
    assert records[0]["type"] == "session"
    assert records[1]["message"]["content"][0]["text"] == "read it"


def test_io_error_in_text_mode_is_one_line(
    tmp_path: Path, workspace: Path, mounts: list[Path]
) -> None:
    state = full_tmpfs(tmp_path / "state", "64k", mounts)
    big = workspace / "big.txt"
    big.write_text(("y" * 99 + "\n") * 900)
    turns = [{"content": [{"type": "tool_use", "name": "Read", "input": {"file_path": str(big)}}]}]
    done = warren(
        ["-p", "read it", "--model", script(tmp_path, turns)],
        {"XDG_STATE_HOME": str(state), "HOME": str(tmp_path)},
        workspace,
    )
    assert done.returncode == 8, done.stderr
    line = _one_clear_line(done.stderr)
    assert line.startswith("warren: run ended: io_error: could not write the transcript")
