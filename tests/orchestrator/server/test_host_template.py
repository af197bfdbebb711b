"""Tool hosts forked from a template (orchestrator/cli/warm/host_template.py), adopted through a
real `SpareKeeper` link exactly as a warm session adopts them, then attacked from inside.

A thread plays the server's loop over the keeper (links, templates, reaping); a first
"session" runs both hosts cold and reports their recipes; the keeper starts the template and
forks both spares from it; a second session adopts them. Every attack is checked on the
host afterwards (the file is absent, the process alive)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.plan import CallPlan, plan_call, tool_assessor
from orchestrator.cli.warm.spares import SpareKeeper
from orchestrator.messages import ToolUseBlock
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.bash import BashTool
from tests.kit.floor import needs_sandbox
from tests.kit.keeper_loop import KeeperLoop, is_forked
from workers.toolhost_runner import SandboxedSpawner, SandboxedToolRunner, open_tool_runner

pytestmark = needs_sandbox


@pytest.fixture
def loop() -> Iterator[KeeperLoop]:
    server = KeeperLoop(SpareKeeper())
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return ws.resolve()


@pytest.fixture
def home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A home outside /tmp (a sandbox's /tmp is private: a secret there would be hidden for
    the wrong reason) with a credential file in it."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else tmp_path_factory.mktemp("h")
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="warren-home-", dir=base))
    (home / ".pgpass").write_text("db:5432:*:me:hunter2\n")
    monkeypatch.setenv("HOME", str(home))
    yield home
    import shutil

    shutil.rmtree(home, ignore_errors=True)


def _plan(tool: Tool[Any], input: ToolInput) -> CallPlan:
    block = ToolUseBlock(id="t", name=tool.name, input=input.model_dump(mode="json"))
    return plan_call(block, tool, input, tool_assessor)


async def _bash(runner: SandboxedToolRunner, ctx: ToolContext, command: str, *, ro: bool) -> str:
    """A Bash call in the read-only host (a classifier that says every command is read-only:
    a misclassified command) or in the read-write one."""
    tool = BashTool(classifier=lambda _: True) if ro else BashTool()
    outputs = []
    plan = _plan(tool, tool.parse_input({"command": command}))
    async with closing_iter(runner.call(plan, ctx)) as events:
        async for event in events:
            if not isinstance(event, ToolProgress):
                outputs.append(event)
    (out,) = outputs
    assert isinstance(out, ToolOutput)
    return str(out.content)


def _forked_spares(loop: KeeperLoop) -> set[int]:
    """The keeper's idle spares once both are forked from a template (waits for it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = loop.run_in(loop.keeper.status)
        pids = set(status["spare_pids"])
        if len(pids) == 2 and all(is_forked(pid) for pid in pids):
            return pids
        time.sleep(0.1)
    raise AssertionError(f"no forked spares: {loop.run_in(loop.keeper.status)}")


async def test_forked_hosts_hold_the_floor_and_cannot_reach_each_other(
    loop: KeeperLoop, workspace: Path, home: Path, tmp_path: Path
) -> None:
    ctx = ToolContext(workspace=workspace, cwd=workspace)

    # A first session starts both hosts itself and reports their recipes.
    link = loop.link(1)
    async with open_tool_runner(spawner=SandboxedSpawner(spares=link), stop_grace_s=2) as cold:
        await _bash(cold, ctx, "true", ro=True)
        await _bash(cold, ctx, "true", ro=False)
        cold_pids = set(cold.host_pids().values())
    link.close()
    await trio.to_thread.run_sync(loop.run_in, lambda: loop.keeper.session_ended(1))
    spares = await trio.to_thread.run_sync(_forked_spares, loop)
    assert not spares & cold_pids
    (template,) = await trio.to_thread.run_sync(
        loop.run_in, lambda: loop.keeper.status()["template_pids"]
    )

    link = loop.link(2)
    async with open_tool_runner(spawner=SandboxedSpawner(spares=link), stop_grace_s=2) as warm:
        assert (await _bash(warm, ctx, "echo ok", ro=True)).strip() == "ok"
        await _bash(warm, ctx, "echo made > made.txt", ro=False)
        assert set(warm.host_pids().values()) == spares  # both adopted, none started
        ro_host, rw_host = warm.host_pids()["read_only"], warm.host_pids()["read_write"]

        # The read-only host: no write lands, however it is tried.
        attack = (
            f"echo x > {workspace}/pwned.txt; echo y >> {workspace}/a.txt;"
            f" rm -f {workspace}/a.txt; mkdir {workspace}/.git/hooks/x;"
            f" mount -o remount,rw {workspace};"
            f" unshare -Urm sh -c 'mount -o remount,rw {workspace}; echo z > {workspace}/p2.txt';"
            f" cat {home}/.pgpass ~/.pgpass; kill -9 {template} {rw_host};"
            f" ls /proc/{template} /proc/{rw_host}; echo done"
        )
        out = await _bash(warm, ctx, attack, ro=True)
        assert "Read-only file system" in out, out
        assert "Operation not permitted" in out  # no user namespace to remount it in
        assert out.split("[stderr]")[0].strip() == "done", out  # it ran to the end
        assert "hunter2" not in out
        for name in ("pwned.txt", "p2.txt", ".git/hooks/x"):
            assert not (workspace / name).exists(), name
        assert (workspace / "a.txt").read_text() == "alpha\n"
        # Neither the template nor the read-write host is in its pid namespace: both live,
        # and the latter still serves.
        assert psutil.Process(template).is_running()
        assert psutil.Process(rw_host).is_running()

        # The read-write host writes the workspace, but not its protected names, the
        # sandbox's outside or another host.
        outside = tmp_path / "outside.txt"
        out = await _bash(
            warm,
            ctx,
            f"echo ok > new.txt; echo hook > .git/hooks/pre-commit; echo out > {outside};"
            f" cat {home}/.pgpass; kill -9 {template} {ro_host}; echo done",
            ro=False,
        )
        assert (workspace / "new.txt").read_text() == "ok\n"
        assert not (workspace / ".git/hooks/pre-commit").exists()
        assert not outside.exists()
        assert "hunter2" not in out
        assert psutil.Process(template).is_running()
        assert psutil.Process(ro_host).is_running()
        assert (await _bash(warm, ctx, "cat made.txt", ro=True)).strip() == "made"
    link.close()
    await trio.to_thread.run_sync(loop.run_in, lambda: loop.keeper.session_ended(2))
    await trio.to_thread.run_sync(loop.close)
    for pid in (*spares, template):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", pid
