"""How a workflow may start, through the real `warren` CLI (real sandboxes, the real SDK
against the fake Messages API): a script the model wrote asks, so headless it is denied with
the reason; a saved workflow runs unasked (the user's, or a trusted repository's, never an
untrusted one's); a JavaScript script is refused with the Python form; `warren workflow run`
and `list`."""

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
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
ECHO = """\
META = {"name": "echo", "description": "Give the args back", "phases": ["Echo"]}
phase("Echo")
finish({"echo": args})
"""


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-wfcli-{uuid.uuid4().hex[:10]}"
    saved = path / "home" / ".config" / "warren" / "workflows"
    saved.mkdir(parents=True)
    (saved / "echo.py").write_text(ECHO)
    (path / "ws").mkdir()
    (path / "ws" / "a.txt").write_text("a\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI | None = None) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home / "home"),
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / "home" / ".config"),
        "XDG_STATE_HOME": str(home / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9" if api is None else api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _workflow_call(home: Path, input: dict[str, object], *extra: str) -> tuple[str, list[str]]:
    """The model calls Workflow once and ends; the tool_result it got back, and the
    notifications the later requests carried."""
    replies = [
        Reply.tool_use("Workflow", input),
        Reply.text("started"),
        Reply.text("noted"),
    ]
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "run it", "--cwd", str(home / "ws"), *extra],
            env=_env(home, api), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        requests = api.requests
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    result = next(
        b
        for r in requests
        for m in r.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    )
    texts = [
        b["text"]
        for r in requests
        for m in r.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "text" and "<task-id>" in b.get("text", "")
    ]
    return json.dumps(result["content"]), texts


def test_a_script_the_model_wrote_is_denied_headless_with_the_reason(home: Path) -> None:
    result, _ = _workflow_call(home, {"script": ECHO, "args": [1]})
    assert "Permission to use Workflow was not granted" in result
    assert not (home / "state" / "warren" / "workflows").exists()


def test_a_rule_lets_a_script_run_and_its_result_is_the_notification(home: Path) -> None:
    result, texts = _workflow_call(
        home, {"script": ECHO, "args": {"x": [1, 2]}}, "--allowedTools", "Workflow"
    )
    assert "started in the background as run wf-" in result
    [note] = set(texts)
    assert "<status>completed</status>" in note
    result_json = note.split("<result>")[1].split("</result>")[0]
    assert json.loads(result_json) == {"echo": {"x": [1, 2]}}


def test_a_saved_workflow_runs_unasked(home: Path) -> None:
    result, texts = _workflow_call(home, {"name": "echo", "args": "hello"})
    assert "started in the background" in result
    [note] = set(texts)
    assert json.loads(note.split("<result>")[1].split("</result>")[0]) == {"echo": "hello"}


def test_an_untrusted_repositorys_saved_workflow_is_not_read(home: Path) -> None:
    repo = home / "ws" / ".warren" / "workflows"
    repo.mkdir(parents=True)
    (repo / "mine.py").write_text(ECHO.replace('"echo"', '"mine"', 1))
    result, _ = _workflow_call(home, {"name": "mine"})
    assert "no saved workflow 'mine'" in result


def test_a_javascript_script_is_refused_with_the_python_form(home: Path) -> None:
    script = "export const meta = { name: 'x', description: 'y', phases: [] }\nawait agent('hi')\n"
    result, _ = _workflow_call(home, {"script": script}, "--allowedTools", "Workflow")
    assert "META = {" in result and "JavaScript" in result


def test_warren_workflow_run_and_list(home: Path) -> None:
    done = subprocess.run(
        [*WARREN, "workflow", "run", "echo", "two", "words", "--cwd", str(home / "ws")],
        env=_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"echo": "two words"}
    assert "phase Echo" in done.stderr and "completed" in done.stderr
    done = subprocess.run(
        [*WARREN, "workflow", "run", "echo", "--args", '{"n": 3}', "--cwd", str(home / "ws")],
        env=_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert json.loads(done.stdout) == {"echo": {"n": 3}}
    listed = subprocess.run(
        [*WARREN, "workflow", "list", "--cwd", str(home / "ws")],
        env=_env(home), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0
    assert listed.stdout.count("completed") == 2 and "echo" in listed.stdout
    missing = subprocess.run(
        [*WARREN, "workflow", "run", "nope", "--cwd", str(home / "ws")],
        env=_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "no saved workflow 'nope'" in missing.stderr and "Traceback" not in missing.stderr
