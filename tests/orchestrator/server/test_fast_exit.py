"""Fast exit: `warren` leaves at once after its result (`run_and_exit`: no interpreter
teardown), and nothing it started outlives it: the tool hosts and sandboxes seen while the
run was held are all gone when the process has exited."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.orchestrator.server.conftest import ROOT, WARREN


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The ones still running (a zombie nobody reaped yet counts as gone)."""
    left = []
    for process in processes:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            pass
    return left


def held_family(root: int, api: FakeMessagesAPI, requests: int) -> list[psutil.Process]:
    """The process tree under `root` once its run has reached the model `requests` times and
    waits there, and a sandboxed tool host runs (they start alongside the first request)."""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "the run never reached the model with a tool host up"
        family = psutil.Process(root).children(recursive=True)
        if len(api.requests) >= requests and any("bwrap" in _name(p) for p in family):
            return family
        time.sleep(0.05)


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.in_process  # the run's own process tree is watched
def test_in_process_run_exits_leaving_nothing(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with FakeMessagesAPI([Reply.text("done", hold_before_stop=True)]) as api:
        env = {
            **os.environ,
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": api.base_url,
            "PYTHONPATH": str(ROOT),
        }
        run = subprocess.Popen(
            [*WARREN, "-p", "hi"], env=env, cwd=workspace,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        family = held_family(run.pid, api, 1)
        api.release()
        out, err = run.communicate(timeout=120)
    assert (run.returncode, out.strip()) == (0, "done"), err
    assert alive(family) == []
