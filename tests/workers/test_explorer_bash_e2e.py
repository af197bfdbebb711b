"""The built-in explorer `general` with Bash (issue 34, item 7), through the real `warren` CLI:
the main agent dispatches it, its worker runs under real bwrap with the workspace read-only,
and the real SDK talks to the fake Messages API.

Its Bash calls are decided by the session's policy like the main agent's: `git log` is
read-only and runs unasked (headless, default mode); `touch x` is asked, which headless means
denied, saying why; a deny rule holds even with bypassPermissions. Approved anyway
(bypassPermissions), `touch x` runs and fails in the read-only sandbox: nothing is written.
The pool's reuse of the worker is tests/workers/test_pool.py's
`test_read_only_workers_are_reused_bash_included_and_keep_nothing_of_a_run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.git_repo import git, make_repo

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SUBJECTS = ("Add the billing module", "Fix rounding in invoices")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with three commits: `init` and `SUBJECTS`."""
    path = make_repo(tmp_path / "ws")
    for n, subject in enumerate(SUBJECTS):
        (path / f"f{n}.py").write_text(f"x = {n}\n")
        git(path, "add", ".")
        git(path, "commit", "-q", "-m", subject)
    return path


def _env(tmp_path: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-explorer",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _bash(id: str, command: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command}}


def _results(request: RecordedRequest) -> dict[str, dict[str, Any]]:
    """The tool_results of the request's last message, by tool_use id, with their text."""
    found = {}
    for block in request.messages[-1]["content"]:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            content = block.get("content")
            text = (
                content
                if isinstance(content, str)
                else "".join(p.get("text", "") for p in content or [])
            )
            found[block["tool_use_id"]] = {"text": text, "is_error": bool(block.get("is_error"))}
    return found


def _explorer_runs(
    calls: list[dict[str, Any]], seen: dict[str, Any]
) -> Callable[[RecordedRequest], FakeResponse]:
    """The main agent dispatches `general`, which makes `calls` in one turn; their results
    land in `seen["results"]`, the tools it was offered in `seen["tools"]`."""

    def route(request: RecordedRequest) -> FakeResponse:
        turn = len(request.messages)
        if _is_subagent(request):
            if turn == 1:
                seen["tools"] = {t["name"]: t for t in request.tools}
                return Reply(content=calls)
            seen["results"] = _results(request)
            return Reply.text("explored")
        if turn == 1:
            return Reply.tool_use(
                "dispatch_agent",
                {"description": "survey history", "prompt": "What changed lately?"},
            )
        seen["report"] = next(iter(_results(request).values()))["text"]
        return Reply.text("done")

    return route


def _warren(tmp_path: Path, repo: Path, api: FakeMessagesAPI, *more: str) -> dict[str, Any]:
    done = subprocess.run(
        [*WARREN, "-p", "go", "--cwd", str(repo), "--output-format", "json", *more],
        env=_env(tmp_path, api),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["result"] == "done", done.stdout
    return out


def test_the_explorer_runs_git_log_unasked_and_a_write_is_denied_headless(
    tmp_path: Path, repo: Path
) -> None:
    seen: dict[str, Any] = {}
    calls = [_bash("toolu_log", "git log --oneline | head"), _bash("toolu_touch", "touch x")]
    with FakeMessagesAPI(route=_explorer_runs(calls, seen)) as api:
        _warren(tmp_path, repo, api)

    # It was offered Bash, without run_in_background (a worker keeps no background tasks).
    bash = seen["tools"]["Bash"]
    assert "run_in_background" not in bash["input_schema"]["properties"]
    assert "run_in_background" not in bash["description"]
    assert set(seen["tools"]) == {"Read", "Glob", "Grep", "LS", "Think", "Bash"}
    log, touch = seen["results"]["toolu_log"], seen["results"]["toolu_touch"]
    # Read-only by the policy's analyser: it ran, in the read-only sandbox, unasked.
    assert not log["is_error"], log
    assert all(subject in log["text"] for subject in (*SUBJECTS, "init")), log
    # Not read-only: asked, and headless that is a denial that says why and how to allow it.
    assert touch["is_error"], touch
    assert "Permission to use Bash was not granted: this is a non-interactive run" in (
        touch["text"]
    )
    assert not (repo / "x").exists()
    assert "explored" in seen["report"]


def test_an_approved_write_fails_in_the_read_only_sandbox_and_deny_rules_still_hold(
    tmp_path: Path, repo: Path
) -> None:
    policy = tmp_path / "config" / "warren" / "policy.toml"
    policy.parent.mkdir(parents=True)
    policy.write_text('[permissions]\ndeny = ["Bash(git blame:*)"]\n')
    seen: dict[str, Any] = {}
    calls = [
        _bash("toolu_touch", "touch x && echo touched"),
        _bash("toolu_blame", "git blame README.md"),
    ]
    with FakeMessagesAPI(route=_explorer_runs(calls, seen)) as api:
        _warren(tmp_path, repo, api, "--permission-mode", "bypassPermissions")

    touch, blame = seen["results"]["toolu_touch"], seen["results"]["toolu_blame"]
    # Allowed by the mode, it ran, and the kernel refused the write.
    assert "Read-only file system" in touch["text"], touch
    assert "touched" not in touch["text"] and "Exit code: 1" in touch["text"], touch
    assert not (repo / "x").exists()
    # The user's deny rule wins over bypassPermissions, for a subagent too.
    assert blame["is_error"] and "Bash(git blame:*)" in blame["text"], blame
    assert "hello" not in blame["text"]
