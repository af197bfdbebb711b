"""A hostile repository against Warren's start-up, through the real `warren` CLI process.

Context gathering (git branch and status, the listing, memory files) reads workspace content
before the first model request. Each test plants an attack a repository (or an agent in an
earlier session) could leave behind, starts `warren -p` against the fake Messages API, and
then checks the host: no marker file written by repository code, no secret in the request the
API received, start-up neither hung nor blew up. Both with the sandbox on (the probe runs in a
read-only sandbox) and off (the probe runs on the host, hardened on its own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.git_repo import git, make_repo

REPO = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- secret-4b1d"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host directory outside /tmp (sandboxes have a private /tmp): the fake home and the
    attack's marker files live here, where a sandbox could read (but not write) them."""
    root = Path("/var/tmp") / f"warren-ctx-{uuid.uuid4().hex[:10]}"
    root.mkdir(mode=0o755)
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / "home" / ".ssh" / "id_rsa").write_text(SECRET + "\n")
    (root / "markers").mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def env(tmp_path: Path, outside: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(outside / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(outside / "home" / ".config"),
        "ANTHROPIC_API_KEY": "sk-test-ctx",
        "PYTHONPATH": str(REPO),
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def plant_fsmonitor(repo: Path, marker: Path) -> None:
    """`core.fsmonitor` names a hook git runs on `status`; it drops `marker` on the host."""
    hook = repo / "x.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))


def start(
    cwd: Path, env: dict[str, str], sandbox: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`warren -p hi` in `cwd`; the first request's body as text."""
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        done = subprocess.run(
            [*WARREN, "-p", "hi", "--cwd", str(cwd), "--sandbox", sandbox],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        body = json.dumps(api.requests[0].body) if api.requests else ""
    return done, body


def assert_attack_is_live(repo: Path, marker: Path, *args: str) -> None:
    """The planted hook does fire under a plain `git status` on the host (so the test can
    fail); the marker is removed again before Warren starts."""
    subprocess.run(["git", *args, "status", "--short"], cwd=repo, capture_output=True, check=False)
    assert marker.exists(), "the attack does not work on this git: the test proves nothing"
    marker.unlink()


SANDBOX_MODES = ["required", "off"]


@pytest.mark.parametrize("sandbox", SANDBOX_MODES)
def test_fsmonitor_in_the_repository_does_not_run(
    tmp_path: Path, outside: Path, env: dict[str, str], sandbox: str
) -> None:
    repo = make_repo(tmp_path / "ws")
    marker = outside / "markers" / "fsmonitor-ran"
    plant_fsmonitor(repo, marker)
    assert_attack_is_live(repo, marker)
    done, body = start(repo, env, sandbox)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert "Git branch: main" in body  # the context is still there


@pytest.mark.parametrize("sandbox", SANDBOX_MODES)
def test_fsmonitor_in_a_gitlink_submodule_does_not_run(
    tmp_path: Path, outside: Path, env: dict[str, str], sandbox: str
) -> None:
    """An agent committed a nested repository as a gitlink: `git status` recurses into it."""
    repo = make_repo(tmp_path / "ws")
    sub = make_repo(repo / "sub")
    git(repo, "add", "sub")
    git(repo, "commit", "-q", "-m", "gitlink")
    marker = outside / "markers" / "submodule-fsmonitor-ran"
    plant_fsmonitor(sub, marker)
    (sub / "README.md").write_text("changed\n")
    assert_attack_is_live(repo, marker)
    done, _ = start(repo, env, sandbox)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("sandbox", SANDBOX_MODES)
def test_fsmonitor_in_a_nested_repository_does_not_run(
    tmp_path: Path, outside: Path, env: dict[str, str], sandbox: str
) -> None:
    repo = make_repo(tmp_path / "ws")
    nested = make_repo(repo / "vendor" / "lib")
    marker = outside / "markers" / "nested-fsmonitor-ran"
    plant_fsmonitor(nested, marker)
    assert_attack_is_live(nested, marker)
    # Warren started inside the nested repository runs its git there.
    done, _ = start(nested, env, sandbox)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("sandbox", SANDBOX_MODES)
def test_memory_file_links_and_fifos_are_not_followed(
    tmp_path: Path, outside: Path, env: dict[str, str], sandbox: str
) -> None:
    """`CLAUDE.md -> ~/.ssh/id_rsa` stays out of the prompt, a FIFO `WARREN.md` does not hang
    start-up (bounded by the subprocess timeout), a link inside the workspace still works."""
    repo = make_repo(tmp_path / "ws")
    (repo / "CLAUDE.md").symlink_to(outside / "home" / ".ssh" / "id_rsa")
    os.mkfifo(repo / "WARREN.md")
    (repo / "docs").mkdir()
    (repo / "docs" / "notes.md").write_text("in-workspace memory\n")
    (repo / "AGENTS.md").symlink_to("docs/notes.md")
    done, body = start(repo, env, sandbox)
    assert done.returncode == 0, done.stderr
    assert "secret-4b1d" not in body
    assert "in-workspace memory" in body


@pytest.mark.parametrize("sandbox", SANDBOX_MODES)
def test_memory_files_are_bounded(tmp_path: Path, env: dict[str, str], sandbox: str) -> None:
    """`AGENTS.md -> /dev/zero` and `WARREN.md -> /dev/urandom` are refused, a huge regular
    `CLAUDE.md` is cut: start-up completes and the request stays small."""
    repo = make_repo(tmp_path / "ws")
    (repo / "AGENTS.md").symlink_to("/dev/zero")
    (repo / "WARREN.md").symlink_to("/dev/urandom")
    (repo / "CLAUDE.md").write_text("x" * 5_000_000)
    done, body = start(repo, env, sandbox)
    assert done.returncode == 0, done.stderr
    assert len(body) < 200_000
    assert "CLAUDE.md cut at" in body


# --- other places the coordinator reads workspace content on the host ---------------------


def test_project_agent_definitions_do_not_follow_links_or_fifos(
    tmp_path: Path, outside: Path
) -> None:
    """`.warren/agents/*.md` (a trusted project's) goes into a subagent's system prompt."""
    from orchestrator.agents.types import load_agent_types
    from orchestrator.errors import ConfigError

    for plant in ("symlink", "fifo", "device"):
        ws = tmp_path / plant
        agents = ws / ".warren" / "agents"
        agents.mkdir(parents=True)
        target = agents / "spy.md"
        if plant == "symlink":
            target.symlink_to(outside / "home" / ".ssh" / "id_rsa")
        elif plant == "fifo":
            os.mkfifo(target)
        else:
            target.symlink_to("/dev/zero")
        with pytest.raises(ConfigError) as caught:
            load_agent_types(ws, trusted=True, config_dir=tmp_path / "config")
        assert "cannot read the agent definition" in str(caught.value)  # refused, not parsed
        assert "secret-4b1d" not in str(caught.value)
        assert caught.value.source == str(target)


def test_policy_init_reads_project_files_as_bounded_regular_files(
    tmp_path: Path, outside: Path
) -> None:
    from policies.commands import detect_project_commands

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "Makefile").symlink_to(outside / "home" / ".ssh" / "id_rsa")
    os.mkfifo(ws / "package.json")
    (ws / "pyproject.toml").symlink_to("/dev/zero")
    found = detect_project_commands(ws)  # returns at once: nothing blocks or runs away
    assert "secret-4b1d" not in repr(found)
