"""Background work end to end, as issue 34's acceptance tells it, through the real `warren`
CLI: real pool workers and tool hosts under the floor, the real SDK against the fake API.

The main agent starts three background subagents and two background shells (`sleep 2; echo
READY > ready.txt` and an endless loop). The fake API holds the subagents' replies until the
main agent's next request has arrived, so the overlap is proven by order, not by timing. A
Monitor watches for the first shell's file and reports READY; TaskStop ends the loop (its
processes are gone from the host); the main agent receives the three agents' notifications;
SendMessage to the first agent sends a request that holds its earlier conversation; a fork's
first request starts with the main agent's last request's bytes. After the run no process of
the session remains.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
AREAS = ("billing", "catalog", "shipping")
LOOP = "while true; do echo tick; sleep 0.2713; done"
WATCH = "while [ ! -e ready.txt ]; do sleep 0.2; done; cat ready.txt"


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path("/var/tmp") / f"warren-acc-{uuid.uuid4().hex[:10]}"
    (path / "ws").mkdir(parents=True)
    (path / "ws" / "a.txt").write_text("a\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _use(id: str, tool: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": tool, "input": input}


def _kind(request: RecordedRequest) -> str:
    text = json.dumps(request.messages)
    if "Forked: this conversation" in text:
        return "fork"
    if "dispatched by another agent" in json.dumps(request.system):
        return "agent"
    return "main"


def _loop_pids() -> list[int]:
    return sorted(
        pid
        for p in psutil.process_iter(["cmdline", "ppid"])
        if p.info["cmdline"] == ["sleep", "0.2713"]
        for pid in (p.pid, p.info["ppid"])
    )


def _seen(until_found: bool) -> list[int]:
    found: set[int] = set()
    deadline = time.monotonic() + (15.0 if until_found else 1.0)
    while time.monotonic() < deadline:
        found.update(_loop_pids())
        if found and until_found:
            break
        time.sleep(0.05)
    return sorted(found)


def test_agents_shells_a_monitor_a_follow_up_and_a_fork_in_one_run(home: Path) -> None:
    went_on = threading.Event()
    seen: dict[str, Any] = {}

    def route(request: RecordedRequest) -> FakeResponse:
        kind = _kind(request)
        last = json.dumps(request.messages[-1])
        if kind == "fork":
            return Reply.text("fork report: the plan holds")
        if kind == "agent":
            if "follow-up" in last:
                return Reply.text("billing follow-up: invoices are in billing/invoice.py")
            area = next(a for a in AREAS if f"[{a}]" in json.dumps(request.messages[0]))
            assert went_on.wait(60), "the main agent's next request never came"
            return Reply.text(f"report on {area}")
        whole = json.dumps(request.messages)
        if len(request.messages) == 1:
            calls = [
                _use(f"toolu_{a}", "dispatch_agent", description=f"survey {a}",
                     prompt=f"Survey {a}. [{a}]", run_in_background=True, name=a)
                for a in AREAS
            ]  # fmt: skip
            calls.append(_use("toolu_ready", "Bash", command="sleep 2; echo READY > ready.txt",
                              run_in_background=True, description="get ready"))  # fmt: skip
            calls.append(_use("toolu_loop", "Bash", command=LOOP, run_in_background=True,
                              description="endless loop"))  # fmt: skip
            return Reply(content=calls)
        if len(request.messages) == 3:
            went_on.set()  # the subagents' replies go out only now
            found = re.search(r"toolu_loop.*?ID: (bash-[0-9a-f]+)", last)
            assert found, last
            seen["loop_pids"] = _seen(until_found=True)
            return Reply(
                content=[
                    _use("toolu_watch", "Monitor", description="wait for READY", command=WATCH,
                         timeout_ms=60_000),
                    _use("toolu_stop", "TaskStop", task_id=found[1]),
                ]
            )  # fmt: skip
        if len(request.messages) == 5:
            seen["loop_pids_after"] = _seen(until_found=False)
            seen["stopped"] = last
        reports = all(f"report on {a}" in whole for a in AREAS)
        ready = "<events>READY</events>" in whole
        if len(request.messages) == 5 and not (reports and ready):
            return Reply.text("Waiting for the surveys and READY.")
        if reports and ready and "toolu_send" not in whole:
            seen["notified"] = whole
            return Reply(content=[_use("toolu_send", "SendMessage", to="billing",
                                       message="follow-up: where are the invoices?",
                                       run_in_background=False)])  # fmt: skip
        if "toolu_send" in last:
            seen["follow_up_result"] = last
            seen["fork_parent"] = request
            return Reply(content=[_use("toolu_fork", "dispatch_agent", subagent_type="fork",
                                       description="check the plan",
                                       prompt="Check the plan against billing.")])  # fmt: skip
        if "toolu_fork" in last:
            seen["fork_result"] = last
            return Reply.text("All done.")
        return Reply.text("Still waiting.")

    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "ANTHROPIC_API_KEY": "sk-test-acc",
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }
    with FakeMessagesAPI(route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "survey and prepare", "--cwd", str(home / "ws"),
             "--output-format", "json", "--permission-mode", "bypassPermissions"],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "All done.", done.stdout

    main = [r for r in requests if _kind(r) == "main"]
    firsts = [r for r in requests if _kind(r) == "agent" and len(r.messages) == 1]
    # The three dispatches returned at once: the main agent's second request came before any
    # survey's reply was sent.
    assert len(firsts) == len(AREAS)
    assert all(r.ended_at is not None and main[1].started_at < r.ended_at for r in firsts)
    # TaskStop ended the loop and every process of it.
    assert seen["loop_pids"], "the loop was not running"
    assert seen["loop_pids_after"] == [], seen
    assert "was stopped" in seen["stopped"]
    # The three notifications and the monitor's READY reached the model.
    notified = seen["notified"]
    assert notified.count("<task-notification>") >= len(AREAS) + 1
    assert (home / "ws" / "ready.txt").read_text() == "READY\n"
    # The follow-up went to billing with its earlier conversation; its reply is the result.
    [follow_up] = [
        r for r in requests if _kind(r) == "agent" and "follow-up" in json.dumps(r.messages[-1])
    ]
    earlier = json.dumps(follow_up.messages[:-1])
    assert "[billing]" in earlier and "report on billing" in earlier
    assert "invoices are in billing/invoice.py" in seen["follow_up_result"]
    # The fork's first request starts with the main agent's last request's bytes.
    parent: RecordedRequest = seen["fork_parent"]
    [fork] = [r for r in requests if _kind(r) == "fork"]
    assert fork.raw.startswith(parent.raw[:-2])
    assert "fork report: the plan holds" in seen["fork_result"]
    # Nothing of the session is left.
    left = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and str(home) in " ".join(p.info["cmdline"])
    ]
    assert left == [] and _loop_pids() == []
