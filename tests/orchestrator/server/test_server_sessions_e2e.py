"""Real Warren sessions through the server: the real SDK against the fake Messages API, the
server's real preload and fork. A run ends as in-process; a server killed mid-session (with
its session process, as stopping a systemd unit does) ends the client with one line and a
transcript that resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.tty import Terminal
from tests.orchestrator.server.conftest import WARREN, Server
from tests.orchestrator.server.test_fast_exit import alive, held_family


def test_sessions_through_the_server_and_a_killed_server(server: Server, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    held = Reply.text("never finishes", hold_before_stop=True)
    first = Reply.text("first answer", hold_before_stop=True)
    with FakeMessagesAPI([first, held, Reply.text("resumed")]) as api:
        env = {
            **server.env,
            "ANTHROPIC_API_KEY": "sk-test",
            "ANTHROPIC_BASE_URL": api.base_url,
            "XDG_STATE_HOME": str(tmp_path / "state"),
        }
        server.env = env
        pid = server.start(entry=None)
        assert "ANTHROPIC_API_KEY" not in psutil.Process(pid).environ()  # only requests bring it
        _wait_for_the_floor(server)
        done = subprocess.Popen(
            [*WARREN, "-p", "hello"], env=env, cwd=workspace,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        family = held_family(pid, api, 1)  # the session process and its tool hosts
        api.release()
        out, err = done.communicate(timeout=180)
        assert (done.returncode, out.strip()) == (0, "first answer"), err
        assert alive(family) == []  # the session process exits fast, leaving nothing
        (audit,) = (tmp_path / "state").glob("warren/sessions/**/*.audit.jsonl")
        floors = [
            r for r in map(json.loads, audit.read_text().splitlines()) if r.get("kind") == "floor"
        ]
        assert floors and floors[0]["proven"] is True, floors
        assert "warm server" in floors[0]["notes"][-1]  # reused, not probed again

        script = tmp_path / "script.json"
        script.write_text('[{"content": [{"type": "text", "text": "hello from the REPL"}]}]')
        terminal = Terminal.start(
            [*WARREN, "--model", f"scripted:{script}"], env=env, cwd=workspace,
            socket_dir=tmp_path,
        )  # fmt: skip
        try:  # the REPL in a forked session process, on the client's terminal
            terminal.wait_for(r"/help for commands", timeout=120)
            assert len(server.sessions()) == 1  # not in-process
            terminal.type("say hi")
            terminal.press("Enter")
            terminal.wait_for("hello from the REPL", timeout=60)
            terminal.type("/exit")
            terminal.press("Enter")
            assert terminal.wait_exit() == 0
        finally:
            terminal.close()

        target = workspace / "new.txt"
        script.write_text(json.dumps([
            {"content": [{"type": "tool_use", "name": "Write",
                          "input": {"file_path": str(target), "content": "hi\n"}}]},
            {"content": [{"type": "text", "text": "wrote it"}]},
        ]))  # fmt: skip
        terminal = Terminal.start(
            [*WARREN, "-p", "write", "--model", f"scripted:{script}"], env=env, cwd=workspace,
            socket_dir=tmp_path,
        )  # fmt: skip
        try:  # a headless run at a terminal asks there (the terminal by its path)
            terminal.wait_for(r"Warren asks: allow Write", timeout=120)
            terminal.type("y")
            terminal.press("Enter")
            assert terminal.wait_exit() == 0
        finally:
            terminal.close()
        assert target.read_text() == "hi\n"
        assert server.process is not None and server.process.poll() is None

        client = subprocess.Popen(
            [*WARREN, "-p", "cut me off"], env=env, cwd=workspace,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while len(api.requests) < 2:
            assert time.monotonic() < deadline, "the second session never reached the model"
            time.sleep(0.05)
        family = [*psutil.Process(pid).children(recursive=True), psutil.Process(pid)]
        for process in family:
            # A member may have ended by itself since it was listed (the context probe's
            # sandbox, adopted from a spare, finishes at the session's start).
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        _, err = client.communicate(timeout=60)
        api.release()
        assert client.returncode == 129
        assert "Traceback" not in err
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith("warren: the Warren server's session process ended without an exit code")
        )

        resumed = subprocess.run(
            [*WARREN, "--continue", "-p", "go on"], env=env, cwd=workspace,
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert (resumed.returncode, resumed.stdout.strip()) == (0, "resumed"), resumed.stderr
        sent = json.dumps(api.requests[-1].messages)
        assert "cut me off" in sent and "go on" in sent


def _wait_for_the_floor(server: Server) -> None:
    """Until the server has proven the floor (its probe child runs as it starts)."""
    deadline = time.monotonic() + 120
    while server.status()["floor_proven_at"] is None:
        assert time.monotonic() < deadline, "the server never proved the floor"
        time.sleep(0.05)
