"""Hooks from Warren's policy files and Claude Code's settings, through the real `warren` CLI
(issue 12, items 2-3): `warren hooks list` and `warren policy show` name each hook's file and
list the ones that do not run; a broken settings file is exit 2 and one line; an untrusted
repository's hooks are announced once at start-up of a real run, over the real SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
NOTICE = "this repository's hooks will not run until you trust it"

CLAUDE_SETTINGS = {
    "permissions": {"allow": ["Bash(npm test)"]},
    "hooks": {
        "PreToolUse": [
            {
                "matcher": "Edit|Write",
                "hooks": [{"type": "command", "command": "./fmt.sh", "timeout": 30}],
            }
        ],
        "Stop": [
            {
                "hooks": [
                    {"type": "prompt", "prompt": "Are the tests green?"},
                    {"type": "command", "command": "echo done"},
                ]
            }
        ],
    },
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "ANTHROPIC_API_KEY": "sk-test-hooks",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # nothing listens unless a test says so
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / ".claude").mkdir(parents=True)
    (repo / ".warren").mkdir()
    (repo / ".claude/settings.json").write_text(json.dumps(CLAUDE_SETTINGS, indent=2))
    (repo / ".warren/policy.toml").write_text(
        '[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash(git push:*)"\n'
        "command = \"echo 'no pushing' >&2; exit 2\"\n"
    )
    return repo


def warren(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_hooks_list_and_policy_show_name_each_hook_s_file(repo: Path, env: dict[str, str]) -> None:
    user = Path(env["HOME"]) / ".claude/settings.json"
    user.write_text(
        json.dumps({"hooks": {"Notification": [{"hooks": [{"type": "command", "command": "n"}]}]}})
    )
    done = warren(["hooks", "list", "--cwd", str(repo)], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Notification: n  ({user})",
        f"not trusted: 3 hooks in {repo}/.claude/settings.json will not run until you trust "
        "the repository (`warren trust`)",
        f"not trusted: 1 hook in {repo}/.warren/policy.toml will not run until you trust the "
        "repository (`warren trust`)",
    ]

    assert warren(["trust", str(repo)], env).returncode == 0
    done = warren(["hooks", "list", "--cwd", str(repo)], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"Notification: n  ({user})",
        f"PreToolUse [regex Edit|Write]: ./fmt.sh  timeout 30s  ({repo}/.claude/settings.json)",
        f"Stop: echo done  ({repo}/.claude/settings.json)",
        f"PreToolUse [Bash(git push:*)]: echo 'no pushing' >&2; exit 2  "
        f"({repo}/.warren/policy.toml)",
        f'unsupported: Stop prompt "Are the tests green?"  ({repo}/.claude/settings.json: '
        'hooks.Stop[0].hooks[0]): type "prompt" hooks are not supported (only "command")',
    ]

    show = warren(["policy", "show", "--cwd", str(repo)], env)
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    assert f"  project      {repo}/.claude/settings.json" in lines
    hooks = lines[lines.index("hooks:") + 1 :]
    assert [f"  {line}" for line in done.stdout.splitlines()] == hooks


def test_no_hooks(repo: Path, env: dict[str, str]) -> None:
    (repo / ".claude/settings.json").unlink()
    (repo / ".warren/policy.toml").unlink()
    done = warren(["hooks", "list", "--cwd", str(repo)], env)
    assert (done.returncode, done.stdout) == (0, "no hooks in force\n")


def test_a_hook_command_cannot_drive_the_terminal(repo: Path, env: dict[str, str]) -> None:
    settings = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x\x1b]0;pwn\x07"}]}]}}
    (repo / ".claude/settings.json").write_text(json.dumps(settings))
    assert warren(["trust", str(repo)], env).returncode == 0
    done = warren(["hooks", "list", "--cwd", str(repo)], env)
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "x\\x1b]0;pwn\\x07" in done.stdout


def test_a_malformed_settings_file_is_one_line_and_exit_2(repo: Path, env: dict[str, str]) -> None:
    """A repository's broken file is not read while untrusted and cannot be trusted; the
    user's own broken file stops every command and every run with one line."""
    broken = dict(CLAUDE_SETTINGS)
    broken["hooks"] = {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": "5"}]}]}
    (repo / ".claude/settings.json").write_text(json.dumps(broken))
    assert warren(["hooks", "list", "--cwd", str(repo)], env).returncode == 0  # not read
    where = f"{repo}/.claude/settings.json: hooks.Stop[0].hooks[0].timeout: must be a number"
    done = warren(["trust", str(repo)], env)
    assert done.returncode == 2 and done.stdout.startswith(f"error: {where}")
    assert done.stdout.count("\n") == 1
    assert "NOT trusted" in warren(["policy", "show", "--cwd", str(repo)], env).stdout

    user = Path(env["HOME"]) / ".claude/settings.json"
    user.write_text(json.dumps(broken))
    where = f"{user}: hooks.Stop[0].hooks[0].timeout: must be a number"
    for args in (["hooks", "list"], ["policy", "show"]):
        done = warren([*args, "--cwd", str(repo)], env)
        assert done.returncode == 2
        assert done.stdout.startswith(f"error: {where}") and done.stdout.count("\n") == 1
    user.write_text('{"hooks": {"Stop": [}')
    done = warren(["-p", "hi", "--cwd", str(repo)], env)
    assert done.returncode == 2
    assert done.stderr == (
        f"warren: policy: {user}:1: JSON syntax error: Expecting value (column 21)\n"
    )


def test_an_untrusted_repository_s_hooks_are_announced_once_at_start_up(
    repo: Path, env: dict[str, str]
) -> None:
    with FakeMessagesAPI([Reply.text("ok"), Reply.text("ok")]) as api:
        env = {**env, "ANTHROPIC_BASE_URL": api.base_url}
        done = warren(["-p", "hi", "--cwd", str(repo)], env)
        assert done.returncode == 0, done.stderr
        assert done.stderr.count(NOTICE) == 1, done.stderr
        [line] = [line for line in done.stderr.splitlines() if NOTICE in line]
        assert "(3 in .claude/settings.json, 1 in .warren/policy.toml)" in line
        assert "`warren trust`" in line
        assert warren(["trust", str(repo)], env).returncode == 0
        done = warren(["-p", "hi", "--cwd", str(repo)], env)
        assert done.returncode == 0, done.stderr
        assert NOTICE not in done.stderr
