"""Workflows through the real `warren` CLI (issue 35's acceptance): real sandboxes for the
script and for every agent, real pool workers, the real SDK against the fake Messages API.

- A model-written workflow with two phases runs 12 read-only agents with a schema and then 3
  scoped writers: the requests in flight never pass the pool's cap (4 here), the typed results
  reach the script, one agent whose output never fits its schema is tried once more and then
  counted as failed without ending the workflow, the writers' files are on the host, and the
  main agent gets one notification carrying the workflow's result.
- `kill -9` of the coordinator in the middle of the second phase (each writer has written a
  first file and waits on the model), then `warren workflow resume RUN_ID`: the fake API gets no
  request of an agent that had finished, what the cut-off writers wrote is rolled back before
  they run again, and the result equals the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = [needs_sandbox, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SCRIBE = (
    "---\nname: scribe\ndescription: Writes files.\n"
    "tools: Read, Write\nwritable: true\n---\nWrite what you are told to.\n"
)
PACKAGES = ["billing", "catalog", "shipping"]
CAP = 4
BAD = 7
"""The survey agent whose output never fits its schema."""
SCRIPT = """\
META = {"name": "accept", "description": "Survey, then write", "phases": ["Survey", "Write"]}
N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
phase("Survey")
found = parallel([lambda i=i: agent(f"[survey:{i}] Count the modules.", schema=N,
                                    label=f"survey {i}") for i in range(12)])
log(f"{sum(1 for f in found if f)} surveys done")
phase("Write")
wrote = parallel([lambda p=p: agent(f"[write:{p}] Write out.txt in your package.",
                                    type="scribe", write_paths=[p], label=f"write {p}")
                  for p in args["packages"]])
finish({"survey": [f["n"] if f else None for f in found],
        "failed": [f.reason[:60] for f in found if not f][:1] and "one",
        "writers": [w if isinstance(w, str) else None for w in wrote]})
"""
EXPECTED = {
    "survey": [None if i == BAD else i * 10 for i in range(12)],
    "failed": "one",
    "writers": [f"wrote {p}" for p in PACKAGES],
}


@pytest.fixture
def home() -> Iterator[Path]:
    """A fake HOME, state and workspace outside /tmp (every sandbox has a private /tmp)."""
    path = Path("/var/tmp") / f"warren-wf-{uuid.uuid4().hex[:10]}"
    config = path / "home" / ".config" / "warren"
    (config / "agents").mkdir(parents=True)
    (config / "agents" / "scribe.md").write_text(SCRIBE)
    (config / "policy.toml").write_text(f"[limits]\nmax_subagents = {CAP}\n")
    for package in PACKAGES:
        (path / "ws" / package).mkdir(parents=True)
        (path / "ws" / package / "mod.py").write_text("x = 1\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home / "home"),
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / "home" / ".config"),
        "XDG_STATE_HOME": str(home / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _first_text(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def _marker(request: RecordedRequest) -> str | None:
    """`survey:3`, `write:billing`; None for the main agent."""
    text = _first_text(request)
    if not text.startswith("["):
        return None
    return text[1 : text.index("]")]


def _after_tool(request: RecordedRequest) -> bool:
    last = request.messages[-1]
    return isinstance(last["content"], list) and any(
        b.get("type") == "tool_result" for b in last["content"]
    )


def _tool(name: str, input: dict[str, Any], latency: float = 0.2) -> Reply:
    return Reply(
        content=[{"type": "tool_use", "name": name, "input": input}],
        stop_reason="tool_use",
        latency_s=latency,
    )


class _Model:
    """Answers every agent as a competent model would; the main agent starts the workflow,
    waits, and reports. `hold_writers`: writers' first requests wait for `release` (the
    test kills the coordinator while they wait)."""

    def __init__(self, ws: Path, hold_writers: bool = False) -> None:
        self.ws = ws
        self.hold_writers = hold_writers
        self.writers_waiting = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: RecordedRequest) -> FakeResponse | None:
        marker = _marker(request)
        if marker is None:
            return self._main(request)
        kind, _, name = marker.partition(":")
        if kind == "survey":
            if _after_tool(request):
                return Reply.text("Counted.")
            n: Any = f"seven-{len(request.messages)}" if int(name) == BAD else int(name) * 10
            return _tool("StructuredOutput", {"n": n})
        if self.hold_writers:  # a first write, then held until the coordinator is killed
            if not _after_tool(request):
                partial = {"file_path": str(self.ws / name / "partial.txt"), "content": "half"}
                return _tool("Write", partial)
            self.writers_waiting.set()
            self.release.wait(120)
            return Reply.text("gone")  # whoever still listens gets no more work
        if _after_tool(request):
            return Reply.text(f"wrote {name}")
        return _tool(
            "Write", {"file_path": str(self.ws / name / "out.txt"), "content": f"{name}\n"}
        )

    def _main(self, request: RecordedRequest) -> FakeResponse:
        text = json.dumps(request.messages)
        if "<task-id>" in text:
            return Reply.text("The workflow finished.")
        if _after_tool(request):
            return Reply.text("The workflow runs in the background.")
        return _tool("Workflow", {"script": SCRIPT, "args": {"packages": PACKAGES}}, 0.0)


def _start(home: Path, api: FakeMessagesAPI) -> subprocess.Popen[str]:
    """The run, its output to files (nobody reads a pipe while the test waits on the
    model: a full pipe would hold the coordinator's writes)."""
    with (home / "out").open("w") as out, (home / "err").open("w") as err:
        return subprocess.Popen(
            [*WARREN, "-p", "Run the accept workflow.", "--cwd", str(home / "ws"),
             "--permission-mode", "acceptEdits", "--allowedTools",
             "Workflow,dispatch_agent(scribe)", "--output-format", "stream-json", "--verbose"],
            env=_env(home, api), stdout=out, stderr=err, text=True, start_new_session=True,
        )  # fmt: skip


def _subagent_in_flight(requests: list[RecordedRequest]) -> int:
    spans = [(r.started_at, r.ended_at or float("inf")) for r in requests if _marker(r)]
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = now = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def _run_dir(home: Path) -> Path:
    [run] = [p for p in (home / "state" / "warren" / "workflows").iterdir() if p.is_dir()]
    return run


def test_a_two_phase_workflow_through_the_cli(home: Path) -> None:
    model = _Model(home / "ws")
    with FakeMessagesAPI(route=model) as api:
        proc = _start(home, api)
        proc.wait(300)
        requests = api.requests
    out, err = (home / "out").read_text(), (home / "err").read_text()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    by_marker: dict[str, int] = {}
    for r in requests:
        key = _marker(r) or "main"
        by_marker[key] = by_marker.get(key, 0) + 1
    assert _subagent_in_flight(requests) <= CAP
    assert _subagent_in_flight(requests) >= 2  # they did run at once
    # The bad agent: invalid, ended; continued once: invalid, ended; then failed.
    assert by_marker[f"survey:{BAD}"] == 4
    assert all(by_marker[f"survey:{i}"] == 2 for i in range(12) if i != BAD)
    record = json.loads((_run_dir(home) / "run.json").read_text())
    assert record["status"] == "completed", record
    assert record["result"] == EXPECTED
    for package in PACKAGES:
        assert (home / "ws" / package / "out.txt").read_text() == f"{package}\n"
    # One notification, with the workflow's result; the main agent's third request has it.
    main = [r for r in requests if _marker(r) is None]
    assert len(main) == 3
    assert json.dumps(main[1].messages).count("<task-id>") == 0
    assert json.dumps(main[2].messages).count("<task-id>") == 1
    note = json.dumps(main[2].messages)
    assert "completed" in note and "wrote shipping" in note  # the result, as JSON, in the note
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    started = [x for x in lines if x.get("subtype") == "task_started"]
    assert any(x.get("task_type") == "local_workflow" for x in started)
    progress = [x["workflow"] for x in lines if x.get("subtype") == "task_progress" and "workflow" in x]  # noqa: E501
    assert [p["text"] for p in progress if p["event"] == "phase"] == ["Survey", "Write"]
    assert sum(1 for p in progress if p.get("status") == "failed") == 1


def test_kill_9_in_the_second_phase_then_resume(home: Path) -> None:
    model = _Model(home / "ws", hold_writers=True)
    with FakeMessagesAPI(route=model) as api:
        proc = _start(home, api)
        try:
            assert model.writers_waiting.wait(240), "the writers never started"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(
                (home / "ws" / p / "partial.txt").exists() for p in PACKAGES
            ):
                time.sleep(0.05)
            time.sleep(0.3)  # every writer's second request is on its way (held)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(60)
            model.release.set()
        before = len(api.requests)
        run = _run_dir(home)
        run_id = run.name
        journal = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
        assert len(journal) == 12  # every survey agent finished, no writer did
        model.hold_writers = False
        done = subprocess.run(
            [*WARREN, "workflow", "resume", run_id, "--cwd", str(home / "ws"),
             "--permission-mode", "acceptEdits", "--allowedTools", "dispatch_agent(scribe)"],
            env=_env(home, api), capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        after = api.requests[before:]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not [r for r in after if (_marker(r) or "").startswith("survey:")]
    assert {(_marker(r) or "main") for r in after} == {f"write:{p}" for p in PACKAGES}
    assert json.loads(done.stdout) == EXPECTED
    for package in PACKAGES:
        assert (home / "ws" / package / "out.txt").read_text() == f"{package}\n"
        # What the cut-off writer wrote was rolled back before it ran again.
        assert not (home / "ws" / package / "partial.txt").exists()
        assert (home / "ws" / package / "mod.py").read_text() == "x = 1\n"
