"""The collector paused while an in-process run starts (orchestrator/session/startup_gc.py): off
from `pause()`, back on with the start-up's objects frozen at `resume()` (the run's parts start) or
after the longest pause, never twice; a real `warren -p` run in its own process ends its
start-up with it back on and its imports frozen."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.session import startup_gc
from tests.kit.fake_api import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as this test found it, whatever the test did."""
    enabled = gc.isenabled()
    yield
    startup_gc.resume()
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_pause_then_resume_freezes_and_turns_it_back_on(collector: None) -> None:
    gc.unfreeze()
    startup_gc.pause()
    assert not gc.isenabled()
    startup_gc.pause()  # a second pause changes nothing
    made = [object() for _ in range(10)]
    startup_gc.resume()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    assert made
    gc.unfreeze()
    startup_gc.resume()  # once only: nothing is frozen again
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off(collector: None) -> None:
    gc.disable()
    startup_gc.pause()
    startup_gc.resume()
    assert not gc.isenabled()


def test_the_pause_ends_by_itself(collector: None) -> None:
    startup_gc.pause(max_pause_s=0.05)
    deadline = time.monotonic() + 10
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.isenabled()


_PROBE = """
import gc, json, os, sys
from orchestrator.session import startup_gc
states = []
original = startup_gc.resume
def resume():
    states.append(("resume", gc.isenabled()))
    original()
    states.append(("resumed", gc.isenabled(), gc.get_freeze_count() > 0))
startup_gc.resume = resume
import orchestrator.cli.in_process as main
exit_now = main.exit_now
def report(code):
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({"states": states, "enabled": gc.isenabled()}, out)
    exit_now(code)
main.exit_now = report
sys.argv = ["warren", *sys.argv[1:]]
from orchestrator.cli import run_and_exit
run_and_exit()
"""


def test_a_cold_run_starts_with_it_off_and_runs_with_it_on(tmp_path: Path) -> None:
    """`warren -p` in-process: the collector is off until its first response starts the
    run's parts, then on, with the start-up's objects frozen."""
    out = tmp_path / "states.json"
    with FakeMessagesAPI([Reply.text("hi")]) as api:
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": api.base_url,
            "ANTHROPIC_API_KEY": "sk-test",
            "WARREN_NO_SERVER": "1",
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "PROBE_OUT": str(out),
        }
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, "-p", "hi", "--sandbox", "off"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["states"][:2] == [["resume", False], ["resumed", True, True]]
    assert report["enabled"]
