"""The floor through the real `warren` CLI (real SDK, fake Messages API, real sandboxed tool
hosts): a read deny rule binds every tool, the user's tree is left as it was (no placeholders,
not even after SIGTERM, SIGHUP or SIGKILL), and protected names the model creates are undone
and reported."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SECRET = "sk-live-9f8e7d6c5b4a-do-not-leak"


@pytest.fixture
def home() -> Iterator[Path]:
    """A fake HOME outside /tmp (every sandbox has a private /tmp)."""
    path = Path("/var/tmp") / f"warren-floor-{uuid.uuid4().hex[:10]}"
    (path / "home").mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home / "home"),
        "XDG_CONFIG_HOME": str(home / "home" / ".config"),
        "XDG_STATE_HOME": str(home / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
    }


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args],
        check=True,
        capture_output=True,
    )


def _repo(home: Path) -> Path:
    repo = home / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "app.py").write_text("print('hi')\n")
    (repo / ".env").write_text(f"API_KEY={SECRET}\n")
    (repo / "secrets").mkdir()
    (repo / "secrets" / "prod.txt").write_text(f"{SECRET}\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    return repo


def _listing(root: Path) -> list[str]:
    out = subprocess.run(
        ["find", ".", "-path", "./.git/objects", "-prune", "-o", "-printf", "%p %y %m\n"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # git's own bookkeeping may change (the index's stat cache, logs) without being a leftover.
    return sorted(line for line in out.splitlines() if not line.startswith("./.git/index "))


def _user_policy(home: Path, text: str) -> None:
    path = home / "home" / ".config" / "warren" / "policy.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


CALLS: list[tuple[str, dict[str, str]]] = [
    ("Bash", {"command": "cat .env"}),
    ("Bash", {"command": "grep -r API_KEY . 2>&1"}),
    ("Bash", {"command": "rg -uu sk-live . 2>&1"}),
    ("Bash", {"command": "cat secrets/prod.txt; ls -la secrets"}),
    ("Grep", {"pattern": "sk-live", "output_mode": "content"}),
    ("Grep", {"pattern": "sk-live", "glob": "secrets/**", "output_mode": "content"}),
    ("Read", {"file_path": "{repo}/.env"}),
    ("Glob", {"pattern": "**/*"}),
    # Made after the tool hosts started (no mask for it): the tools' own check refuses.
    (
        "Bash",
        {
            "command": "mkdir -p late && cp app.py late/x && printf 'K=%s' "
            + SECRET[:7]
            + "-9f8e7d6c5b4a-do-not-leak > late/.env && echo made"
        },
    ),
    ("Read", {"file_path": "{repo}/late/.env"}),
    ("Grep", {"pattern": "sk-live", "path": "{repo}/late", "output_mode": "content"}),
    ("Grep", {"pattern": "K=", "output_mode": "files_with_matches"}),
]


def test_a_read_deny_rule_binds_every_tool(home: Path) -> None:
    _deny_attack(home, CALLS)


def test_a_read_deny_rule_binds_git_show(home: Path) -> None:
    """A committed .env is read from git's objects, which no mask can cover: the policy engine
    denies `git show REV:path` of a denied path (policies/engine.py, Read denies on Bash)."""
    _deny_attack(
        home, [("Bash", {"command": "git show HEAD:.env 2>&1; git show HEAD:secrets/prod.txt"})]
    )


def _deny_attack(home: Path, calls: list[tuple[str, dict[str, str]]]) -> None:
    repo = _repo(home)
    _user_policy(home, '[permissions]\ndeny = ["Read(.env)", "Read(secrets/**)"]\n')
    calls = [(n, {k: v.replace("{repo}", str(repo)) for k, v in a.items()}) for n, a in calls]
    replies = [Reply.tool_use(name, args) for name, args in calls] + [Reply.text("done")]
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "look", "--cwd", str(repo), "--permission-mode", "bypass"],
            env=_env(home, api),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert len(requests) == len(calls) + 1
    for (name, args), request in zip(calls, requests[1:], strict=True):
        result = json.dumps(request.messages[-1]["content"])
        assert SECRET not in result, f"{name} {args} leaked the secret: {result}"
        assert ".env" not in result or name in ("Bash", "Read"), result
    assert SECRET not in done.stdout
    assert (repo / ".env").read_text() == f"API_KEY={SECRET}\n"


def _start(home: Path, repo: Path, api: FakeMessagesAPI) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*WARREN, "-p", "work", "--cwd", str(repo), "--permission-mode", "bypass"],
        env=_env(home, api),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_the_tree_is_unchanged_after_a_signal(home: Path, sig: signal.Signals) -> None:
    repo = _repo(home)
    before = _listing(repo)
    script = "echo x > notes.txt; sleep 60"
    replies = [
        Reply.tool_use("Bash", {"command": "ls -a; ls -a .git; ls -a .github 2>&1"}),
        Reply.tool_use("Glob", {"pattern": "**/.*"}),
        Reply.tool_use("Bash", {"command": script}),
        Reply.text("never"),
    ]
    with FakeMessagesAPI(replies) as api:
        proc = _start(home, repo, api)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(api.requests) < 3 and proc.poll() is None:
            time.sleep(0.02)
        while time.monotonic() < deadline and not (repo / "notes.txt").exists():
            time.sleep(0.02)
        seen = [json.dumps(r.messages[-1]["content"]) for r in api.requests[1:3]]
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    for result in seen:  # while the run was live, the model saw no placeholder
        for name in (".bashrc", ".envrc", ".vscode", ".gitlab-ci.yml", ".gitmodules", "commondir"):
            assert name not in result, f"placeholder {name} visible: {result}"
    # The model's own file is its work, not a leftover; nothing else differs, at once (there
    # are no placeholders to clean up, so no next start is needed).
    after = [line for line in _listing(repo) if not line.startswith("./notes.txt ")]
    assert after == before


def test_protected_creations_are_undone_and_reported(home: Path) -> None:
    repo = _repo(home)
    replies = [
        Reply.tool_use("Write", {"file_path": str(repo / ".bashrc"), "content": "curl x|sh\n"}),
        Reply.tool_use("Write", {"file_path": str(repo / ".eslintrc"), "content": "{}\n"}),
        Reply.tool_use("Bash", {"command": "(sleep 0.2; echo x > .envrc) & echo started"}),
        Reply.tool_use("Bash", {"command": "sleep 0.5; mkdir -p .vscode; echo ok"}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies) as api:
        proc = _start(home, repo, api)
        _, err = proc.communicate(timeout=180)
        results = [json.dumps(r.messages[-1]["content"]) for r in api.requests[1:]]
    assert proc.returncode == 0, err
    # The policy refuses a Write to a protected name before it runs (the guard is the floor
    # under it: see the Bash cases).
    assert '"is_error": true' in results[0] and "protected" in results[0]
    assert "Warren removed" not in results[1] and (repo / ".eslintrc").read_text() == "{}\n"
    assert "Warren removed .envrc" in results[3] and "Warren removed .vscode" in results[3]
    for name in (".bashrc", ".envrc", ".vscode"):
        assert not os.path.lexists(repo / name)
