"""`warren mcp add|get|list|remove` through the real CLI: the policy file is edited with its
comments kept, a trusted repository stays trusted after its user's own edit, and a bad entry
changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _warren(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args[:2], "--cwd", str(cwd), *args[2:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_add_get_list_remove(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".warren").mkdir(parents=True)
    local = ws / ".warren" / "policy.local.toml"
    local.write_text("# my own settings\n[permissions]\nallow = [\"Read\"]  # reads are fine\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    trusted = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "trust", str(ws)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert trusted.returncode == 0, trusted.stderr + trusted.stdout

    added = _warren(
        "mcp", "add", "git", "--env", "A=b", "--timeout", "5", "--network", "--",
        "mcp-server-git", "-r", ".",
        env=env, cwd=ws,
    )  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    text = local.read_text()
    assert "# my own settings" in text and "# reads are fine" in text
    assert "[mcp.servers.git]" in text

    listed = _warren("mcp", "list", env=env, cwd=ws)
    assert "git: mcp-server-git -r ." in listed.stdout, listed.stdout + listed.stderr
    assert "sandboxed, workspace read-only, HOST NETWORK" in listed.stdout
    got = _warren("mcp", "get", "git", env=env, cwd=ws)
    assert 'command = "mcp-server-git"' in got.stdout and "timeout_s = 5.0" in got.stdout
    assert 'A = "b"' in got.stdout and str(local) in got.stdout
    assert "network = true" in got.stdout

    bad = _warren("mcp", "add", "x__y", "--", "srv", env=env, cwd=ws)
    assert bad.returncode != 0 and "no `__`" in bad.stdout + bad.stderr
    neither = _warren("mcp", "add", "x", env=env, cwd=ws)
    assert neither.returncode == 2 and "either `command`" in neither.stderr
    assert "\nx:" not in "\n" + _warren("mcp", "list", env=env, cwd=ws).stdout

    removed = _warren("mcp", "remove", "git", env=env, cwd=ws)
    assert removed.returncode == 0, removed.stdout
    assert "not trusted" not in removed.stdout  # the user's own edit keeps the trust
    assert "mcp-server-git" not in local.read_text() and "# reads are fine" in local.read_text()
    again = _warren("mcp", "remove", "git", env=env, cwd=ws)
    assert again.returncode != 0 and "nothing changed" in again.stdout
    assert "no MCP servers in force" in _warren("mcp", "list", env=env, cwd=ws).stdout
