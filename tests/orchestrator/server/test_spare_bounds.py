"""The server's spare tool hosts are bounded (orchestrator/cli/spares.py): no more than
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

from orchestrator.cli.spares import SpareKeeper, SpareLink
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
