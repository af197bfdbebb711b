"""The context probe of a warm server's session (orchestrator/conversation/context.py) runs in a
spare sandbox the server started ahead of it, from the recipe the session before reported, and
still reports the workspace as it is when the session starts: the spare waits for the
probe's code and reads nothing before. Real server, real floor, the real SDK against the
fake Messages API; which sandbox ran the probe is told by pid and the server's count of
spares handed out, never by timing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.orchestrator.server.conftest import WARREN, Server


def test_the_probe_adopts_a_spare_and_reports_the_workspace_of_its_own_start(
    server: Server, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    memory = workspace / "WARREN.md"
    with FakeMessagesAPI([]) as api:
        server.env = {
            **server.env,
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "ANTHROPIC_API_KEY": "sk-warm-context",
            "ANTHROPIC_BASE_URL": api.base_url,
        }
        server.start(entry=None)

        def run(note: str) -> str:
            memory.write_text(f"{note}\n")
            api.add(Reply.text("done"))
            done = subprocess.run(
                [*WARREN, "-p", "hi"], env=server.env, cwd=workspace,
                capture_output=True, text=True, timeout=180,
            )  # fmt: skip
            assert (done.returncode, done.stdout.strip()) == (0, "done"), done.stderr
            return json.dumps(api.requests[-1].body["system"])

        first = run("the first note")
        assert "the first note" in first  # a cold probe, whose recipe the server now has
        spare = _probe_spare(server)
        assert "sk-warm-context" not in json.dumps(psutil.Process(spare).environ())
        handed_out = server.status()["spares_handed_out"]
        assert isinstance(handed_out, int)

        second = run("the second note")  # written after the spare started
        assert "the second note" in second and "the first note" not in second
        status = server.status()
        spare_pids = status["spare_pids"]
        assert isinstance(spare_pids, list) and spare not in spare_pids
        handed = status["spares_handed_out"]
        assert isinstance(handed, int) and handed > handed_out  # the probe's spare, at least
        assert not psutil.pid_exists(spare) or psutil.Process(spare).status() == "zombie"
        assert _probe_spare(server) != spare  # replaced, never handed out twice


def _probe_spare(server: Server) -> int:
    """The pid of the server's idle spare that runs the context probe, once it has one."""
    deadline = time.monotonic() + 120
    while True:
        pids = server.status().get("spare_pids")
        assert isinstance(pids, list)
        for pid in pids:
            try:
                if any("context_probe.py" in part for part in psutil.Process(pid).cmdline()):
                    return int(pid)
            except psutil.Error:
                continue
        assert time.monotonic() < deadline, f"no spare of the context probe among {pids}"
        time.sleep(0.05)
