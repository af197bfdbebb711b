"""The server's spare tool hosts are bounded (orchestrator/cli/warm/spares.py): no more than
`max_spares` are kept at once (the oldest goes), and an idle one is stopped after `idle_s`.
Real spares under the floor, started from recipes reported over a real link, as a session
reports them; the bounds are checked by count and state, never by timing."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import psutil
import pytest
import trio

from orchestrator.cli.warm.spares import SpareKeeper, SpareLink
from sandbox.host import detect_host
from sandbox.run import _prepare
from sandbox.spare import SpareRecipe
from sandbox.spec import SandboxSpec, WorkspaceRoot


def _recipes(tmp_path: Path, count: int) -> list[SpareRecipe]:
    """One recipe for each of `count` workspaces: a sandbox that waits (sleep) until stopped."""
    host = trio.run(lambda: detect_host(stub_dir=tmp_path / "stubs"))
    sleep = shutil.which("sleep")
    assert sleep is not None
    out = []
    for n in range(count):
        workspace = tmp_path / f"ws{n}"
        workspace.mkdir()
        spec = SandboxSpec(workspaces=(WorkspaceRoot(path=workspace, mode="ro"),))
        facts, guard = _prepare(spec, executables=[host.bwrap.path], stub_dir=host.stub_dir)
        assert guard is None  # nothing writable
        out.append(SpareRecipe.gather(spec, facts, [sleep, "600"], workspace, host))
    return out


def _report(keeper: SpareKeeper, pid: int, recipes: list[SpareRecipe]) -> None:
    """A session `pid` that reports `recipes` over its link and ends."""
    ours, theirs = keeper.new_link()
    keeper.attach(pid, ours)
    link = SpareLink(theirs)
    for recipe in recipes:
        link.report(recipe)
        keeper.serve(pid)
    theirs.close()
    keeper.session_ended(pid)


@pytest.mark.skipif(sys.platform != "linux", reason="the floor is Linux's")
def test_no_more_than_max_spares_are_kept_the_oldest_goes(tmp_path: Path) -> None:
    recipes = _recipes(tmp_path, 3)
    keeper = SpareKeeper(max_spares=2)
    try:
        for pid, recipe in enumerate(recipes, start=1):
            _report(keeper, pid, [recipe])
        status = keeper.status()
        assert status["spares"] == 2
        kept = {spare.recipe.key() for spare in keeper._idle.values()}
        assert kept == {recipe.key() for recipe in recipes[1:]}  # the oldest was stopped
        for pid in status["spare_pids"]:
            assert psutil.Process(pid).is_running()
    finally:
        keeper.stop()
    assert keeper.status()["spares"] == 0


@pytest.mark.skipif(sys.platform != "linux", reason="the floor is Linux's")
def test_an_idle_spare_is_stopped_after_idle_s(tmp_path: Path) -> None:
    (recipe,) = _recipes(tmp_path, 1)
    kept = SpareKeeper(idle_s=3600.0)
    reaped = SpareKeeper(idle_s=0.0)
    try:
        _report(kept, 1, [recipe])
        _report(reaped, 1, [recipe])
        (pid,) = reaped.status()["spare_pids"]
        kept.reap()
        reaped.reap()  # idle for >= 0 s: stopped
        assert kept.status()["spares"] == 1
        assert reaped.status()["spares"] == 0
        reaped.stop()  # waits for the stopped one to be reaped
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        kept.stop()
        reaped.stop()


def _tool_host_recipes(tmp_path: Path) -> tuple[SpareRecipe, SpareRecipe]:
    """A read-write tool host's recipe and its read-only form, as a session gathers them."""
    from workers.child import HostLaunch
    from workers.toolhost_runner import SandboxedSpawner

    workspace = tmp_path / "tws"
    workspace.mkdir()
    spawner = SandboxedSpawner()
    host = trio.run(spawner.host)
    recipes = []
    for role in ("read_write", "read_only"):
        launch = HostLaunch.of_module(
            "workers.toolhost", python=Path(sys.executable), role=role, workspace=workspace,
            cwd=workspace, extra_roots=(), tools="workers.toolhost:host_tools",
        )  # fmt: skip
        spec = trio.run(spawner.full_spec, launch)
        executables = [host.bwrap.path] + ([host.prlimit] if host.prlimit else [])
        facts, guard = _prepare(spec, executables=executables, stub_dir=host.stub_dir)
        if guard is not None:
            guard.close()
        recipes.append(SpareRecipe.gather(spec, facts, launch.argv, workspace, host))
    rw, ro = recipes
    assert rw.as_read_only() is not None and rw.as_read_only().key() == ro.key()  # type: ignore[union-attr]
    return rw, ro


def _settle(keeper: SpareKeeper, until: float = 60.0) -> None:
    """The server's loop over the keeper's templates until none is warming."""
    import select
    import time

    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        fds = keeper.template_fds()
        pending = [t for t in keeper._templates.values() if not t.ready and not t.dead]
        if not pending:
            return
        readable, _, _ = select.select(fds, [], [], 0.1)
        for fd in readable:
            keeper.template_readable(fd)
    raise AssertionError("a template never settled")


@pytest.mark.skipif(sys.platform != "linux", reason="the floor is Linux's")
def test_tool_host_spares_are_forked_from_a_template_and_fresh_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.cli.warm.host_template import HostTemplate

    rw, ro = _tool_host_recipes(tmp_path)
    keeper = SpareKeeper()
    try:
        _report(keeper, 1, [ro, rw])  # in any order: the read-write one starts the template
        fresh = set(keeper.status()["spare_pids"])  # standing in while it warms
        assert len(fresh) == 2
        _settle(keeper)
        status = keeper.status()
        forked = set(status["spare_pids"])
        assert len(forked) == 2 and not forked & fresh and status["templates"] == 1
        (template,) = status["template_pids"]
        family = {p.pid for p in psutil.Process(template).children(recursive=True)}
        assert forked <= family
    finally:
        keeper.stop()
    assert keeper.status() == {**keeper.status(), "spares": 0, "templates": 0}
    assert not psutil.pid_exists(template) or psutil.Process(template).status() == "zombie"

    monkeypatch.setattr(HostTemplate, "module", "workers.no_such_module")
    broken = SpareKeeper()
    try:
        _report(broken, 1, [rw, ro])
        _settle(broken)
        status = broken.status()
        assert status["templates"] == 0  # it died before it was ready
        pids = status["spare_pids"]
        assert len(pids) == 2  # the fresh ones stay
        for pid in pids:
            assert "workers.zygote" not in " ".join(psutil.Process(pid).cmdline())
    finally:
        broken.stop()
