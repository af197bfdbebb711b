"""`--pool` and `[pool]` through the real `warren` CLI (real SDK against the fake Messages API,
real bwrap): a bad pool choice is one line and exit 2 before anything runs, and Ray's
credentials in the coordinator's environment reach no sandbox (Bash in the tool host, a
subagent's worker, a hook), no transcript, no log and no output."""

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

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
TOKEN = "ray-auth-token-5c1e-never-leaves"
RAY_ENV = {"RAY_AUTH_TOKEN": TOKEN, "RAY_AUTH_MODE": "token", "RAY_ADDRESS": "127.0.0.1:6379"}


@pytest.fixture
def root() -> Iterator[Path]:
    """Scratch space outside /tmp (every sandbox has a private /tmp)."""
    path = Path("/var/tmp") / f"warren-pool-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _setup(
    root: Path, name: str, *, user: str = "", project: str = ""
) -> tuple[Path, dict[str, str]]:
    """A repository and a home of its own; `user` and `project` as policy files."""
    base = root / name
    repo = base / "repo"
    (repo / ".warren").mkdir(parents=True)
    (repo / "app.py").write_text("print('hi')\n")
    if project:
        (repo / ".warren" / "policy.toml").write_text(project)
    config = base / "home" / ".config"
    if user:
        (config / "warren").mkdir(parents=True)
        (config / "warren" / "policy.toml").write_text(user)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(
        {
            "HOME": str(base / "home"),
            "XDG_CONFIG_HOME": str(config),
            "XDG_STATE_HOME": str(base / "state"),
            "ANTHROPIC_API_KEY": "sk-test-pool",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # nothing listens: nothing may be sent
            "PYTHONPATH": str(ROOT),
        }
    )
    return repo, env


def test_a_bad_pool_choice_is_one_line_and_exit_2(root: Path) -> None:
    """Each case starts a real `warren` (all at once: the floors proven in parallel). The
    messages themselves are pinned in tests/policies/test_pool.py; here: one line, exit 2,
    nothing on stdout, whichever front end and wherever the error arises."""
    twenty = "[limits]\nmax_subagents = 20\n"
    ray = ["-p", "hi", "--pool", "ray"]
    cases: dict[str, tuple[list[str], str, str, dict[str, str], str]] = {
        "no address": (ray, "", "", {}, "--pool ray needs the cluster's address"),
        "mcp serve": (
            ["mcp", "serve", "--pool", "ray"], "", "", {},
            "--pool ray needs the cluster's address",
        ),
        "local cap": (
            ["-p", "hi"], twenty, "", {},
            "max_subagents = 20: the local pool runs at most 10 subagents",
        ),
        "repository": (
            ["-p", "hi"], "", '[pool]\nbackend = "ray"\naddress = "evil:6379"\n', {},
            "a repository cannot send your code to a cluster",
        ),
    }  # fmt: skip
    started = {}
    for name, (args, user, project, extra, _) in cases.items():
        repo, env = _setup(root, name.replace(" ", "-"), user=user, project=project)
        started[name] = (
            repo,
            subprocess.Popen(
                [*WARREN, *args, "--cwd", str(repo)],
                env={**env, **extra},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    for name, (repo, process) in started.items():
        stdout, stderr = process.communicate(timeout=120)
        expected = cases[name][-1]
        assert process.returncode == 2, (name, stderr)
        assert stdout == "", name
        assert len(stderr.splitlines()) == 1, (name, stderr)
        assert stderr.startswith("warren: ") and expected in stderr, (name, stderr)
        if name == "repository":
            assert f"{repo}/.warren/policy.toml: pool:" in stderr


def test_ray_credentials_reach_no_sandbox_log_or_transcript(root: Path) -> None:
    """Bash in the main agent's tool host, Bash in a subagent's worker and a sandboxed
    PostToolUse hook each print their whole environment back to the model: no `RAY_`
    variable is in any of them, and the token is in no file Warren wrote and no output."""
    hook = '[[hooks]]\nevent = "PostToolUse"\nmatcher = "Bash"\ncommand = "env >&2; exit 2"\n'
    repo, env = _setup(root, "scrub", user=hook)
    agents = Path(env["XDG_CONFIG_HOME"]) / "warren" / "agents"
    agents.mkdir()
    (agents / "shell.md").write_text(
        "---\nname: shell\ndescription: Runs commands.\ntools: Bash\n---\nRun it.\n"
    )
    dispatch = {"description": "env", "prompt": "print your environment", "subagent_type": "shell"}
    replies = [
        Reply.tool_use("dispatch_agent", dispatch),
        Reply.tool_use("Bash", {"command": "env"}),  # the subagent
        Reply.text("the subagent's report"),
        Reply.tool_use("Bash", {"command": "env"}),  # the main agent
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "env", "--cwd", str(repo), "--verbose",
             "--output-format", "stream-json"],
            env={**env, **RAY_ENV, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert len(requests) == len(replies)
    sub_env = json.dumps(requests[2].messages[-1]["content"])
    main_env = json.dumps(requests[4].messages[-1]["content"])
    for seen in (sub_env, main_env):
        # The environment was printed (so the test can fail), and the hook's too.
        assert seen.count("PATH=") >= 2 and "PostToolUse hook feedback" in seen, seen
        assert "RAY_" not in seen and TOKEN not in seen, seen
    assert TOKEN not in done.stdout and TOKEN not in done.stderr
    written = [path for path in (root / "scrub").rglob("*") if path.is_file()]
    assert any(path.suffix == ".jsonl" for path in written)  # transcripts, audit, logs
    for path in written:
        assert TOKEN.encode() not in path.read_bytes(), path
