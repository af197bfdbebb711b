"""The workflow engine's own parts, each against real files and real trio scheduling: the run's
journal (appends that survive a torn line), reuse of an earlier run's answers by position and
hash, writers held to disjoint scopes, and a scoped writer's scope kept and rolled back byte for
byte. The whole path (a real script in its sandbox, real subagents in pool workers, the real
CLI) is tests/orchestrator/workflows/test_workflow_e2e.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.events import WorkflowChanged
from orchestrator.workflows.engine import AgentPlan, ScopeGate, WorkflowEngine
from orchestrator.workflows.journal import (
    AgentAnswer,
    JournalEntry,
    RunRecord,
    WorkflowStore,
    WriterStart,
    call_hash,
    key_order,
    new_run_id,
)
from orchestrator.workflows.rollback import keep_scope, roll_back
from orchestrator.workflows.script import AgentCall, AgentFailedError


def _call(key: str, prompt: str, write_paths: list[str] | None = None) -> AgentCall:
    return AgentCall(
        key=key,
        prompt=prompt,
        type=None,
        schema=None,
        write_paths=write_paths,
        label=None,
        phase=None,
        model=None,
    )


def _record(tmp_path: Path, store: WorkflowStore) -> RunRecord:
    record = RunRecord(new_run_id(), "w", "d", ["A"], str(tmp_path), "s", None)
    store.create(record, "META = {}\n")
    return record


class _Agents:
    """An `AgentRunner` that answers by prompt (`fail:` fails), writers by their scope, and
    counts what ran."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.ran: list[str] = []
        self.at_once = 0
        self.most = 0

    def plan(self, call: AgentCall, call_id: str) -> AgentPlan:
        if call.write_paths is None:
            return AgentPlan(call, call_id, "ro")
        return AgentPlan(call, call_id, tuple(self.workspace / p for p in call.write_paths))

    async def run(self, plan: AgentPlan) -> AgentAnswer:
        call = plan.call
        self.ran.append(call.key)
        self.at_once += 1
        self.most = max(self.most, self.at_once)
        try:
            await trio.sleep(0.01)
        finally:
            self.at_once -= 1
        if call.prompt.startswith("fail:"):
            return AgentAnswer(False, reason=call.prompt[5:], agent_id=f"a-{call.key}")
        return AgentAnswer(True, f"done {call.prompt}", agent_id=f"a-{call.key}", tokens=10)


def test_keys_order_by_number_not_text() -> None:
    keys = ["10", "3.10", "3.9", "3", "4", "3.9.1"]
    assert sorted(keys, key=key_order) == ["3", "3.9", "3.9.1", "3.10", "4", "10"]


def test_a_call_hash_changes_with_what_makes_its_answer() -> None:
    base = call_hash("p", None, None, None, None)
    assert base == call_hash("p", None, None, None, None)
    assert len({base, *(call_hash(*v) for v in [
        ("q", None, None, None, None),
        ("p", "general", None, None, None),
        ("p", None, {"type": "object"}, None, None),
        ("p", None, None, ["src"], None),
        ("p", None, None, None, "haiku"),
    ])}) == 6  # fmt: skip


def test_the_journal_survives_a_torn_last_line(tmp_path: Path) -> None:
    store = WorkflowStore(tmp_path / "workflows")
    record = _record(tmp_path, store)
    store.append(record.run_id, JournalEntry(True, {"a": 1}, agent_id="x", key="0", hash="h0"))
    store.append(record.run_id, JournalEntry(False, reason="no", key="1", hash="h1"))
    with open(store.run_dir(record.run_id) / "journal.jsonl", "ab") as torn:
        torn.write(b'{"key": "2", "hash": "h2", "ok": tr')  # a crash in the middle of a write
    entries = store.entries(record.run_id)
    assert set(entries) == {"0", "1"}
    assert entries["0"].value == {"a": 1} and entries["1"].reason == "no"
    assert store.load(record.run_id).name == "w"
    assert [r.run_id for r in store.runs()] == [record.run_id]
    with pytest.raises(ValueError, match="not a workflow run id"):
        store.run_dir("../../etc")


def test_unfinished_writers_are_those_never_ended(tmp_path: Path) -> None:
    store = WorkflowStore(tmp_path / "workflows")
    record = _record(tmp_path, store)
    store.writer_started(record.run_id, WriterStart("1", ["a"], {}))
    store.writer_started(record.run_id, WriterStart("2", ["b"], {}))
    store.writer_ended(record.run_id, "1")
    assert [w.key for w in store.unfinished_writers(record.run_id)] == ["2"]


def _engine(
    tmp_path: Path, agents: _Agents, earlier: dict[str, JournalEntry] | None = None, **kw: Any
) -> tuple[WorkflowEngine, list[WorkflowChanged]]:
    store = WorkflowStore(tmp_path / "workflows")
    events: list[WorkflowChanged] = []
    args: dict[str, Any] = dict(
        record=_record(tmp_path, store), store=store, runner=agents, emit=events.append, **kw
    )
    engine = WorkflowEngine(**args) if earlier is None else WorkflowEngine.resuming(earlier, **args)
    return engine, events


async def test_calls_are_journaled_and_failures_raise(tmp_path: Path) -> None:
    agents = _Agents(tmp_path)
    engine, events = _engine(tmp_path, agents)
    engine.phase("A")
    assert await engine.agent(_call("0", "one")) == "done one"
    with pytest.raises(AgentFailedError, match="broken"):
        await engine.agent(_call("1", "fail:broken"))
    entries = engine.store.entries(engine.record.run_id)
    assert entries["0"].ok and entries["0"].value == "done one"
    assert not entries["1"].ok and entries["1"].reason == "broken"
    assert [e.status for e in events if e.what == "agent"] == [
        "running", "done", "running", "failed"
    ]  # fmt: skip
    assert events[0].what == "phase" and events[1].phase == "A"


async def test_a_resume_answers_finished_calls_and_reruns_the_rest(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Finished calls come from the journal, a failure of the agent's own as that failure;
    one stopped short (a limit, a denial), or never finished, runs again without ending
    reuse; an edited call ends reuse for every later position."""
    h = {p: call_hash(p, None, None, None, None) for p in ("a", "b", "c", "d", "e", "f")}
    earlier = {
        "0": JournalEntry(True, "old a", key="0", hash=h["a"]),
        "1.0": JournalEntry(False, key="1.0", hash=h["b"], reason="over budget", final=False),
        "1.3": JournalEntry(False, key="1.3", hash=h["f"], reason="never fit its schema"),
        "1.1": JournalEntry(True, "old c", key="1.1", hash=h["c"]),  # "1.2" never finished
        "2": JournalEntry(True, "old 2", key="2", hash="edited-since"),
        "3": JournalEntry(True, "old e", key="3", hash=h["e"]),
    }
    agents = _Agents(tmp_path)
    engine, events = _engine(tmp_path, agents, earlier)
    assert await engine.agent(_call("0", "a")) == "old a"
    async with trio.open_nursery() as nursery:
        for key, prompt in (("1.0", "b"), ("1.1", "c"), ("1.2", "d")):
            nursery.start_soon(engine.agent, _call(key, prompt))
    with pytest.raises(AgentFailedError, match="never fit its schema"):
        await engine.agent(_call("1.3", "f"))
    assert await engine.agent(_call("2", "x")) == "done x"  # edited: runs
    assert await engine.agent(_call("3", "e")) == "done e"  # after the edit: runs again
    assert sorted(agents.ran, key=key_order) == ["1.0", "1.2", "2", "3"]
    assert engine.started == 4
    cached = [e.key for e in events if e.status == "cached"]
    assert cached == ["0", "1.1", "1.3"]
    # The new run's own journal holds every answer it gave, reused ones included.
    assert set(engine.store.entries(engine.record.run_id)) == {
        "0", "1.0", "1.1", "1.2", "1.3", "2", "3"
    }  # fmt: skip


async def test_agents_at_once_and_per_run_are_capped(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    agents = _Agents(tmp_path)
    engine, _ = _engine(tmp_path, agents, cap=3, max_agents=8)
    results: list[Any] = []

    async def one(i: int) -> None:
        try:
            results.append(await engine.agent(_call(str(i), f"p{i}")))
        except AgentFailedError as exc:
            results.append(exc)

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, i)
    assert agents.most == 3
    refused = [r for r in results if isinstance(r, AgentFailedError)]
    assert len(refused) == 2 and "workflow_agents = 8" in str(refused[0])


async def test_writers_run_at_once_only_with_disjoint_scopes(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = ScopeGate()
    log: list[str] = []
    root = Path("/w")

    async def writer(name: str, scope: tuple[Path, ...] | None) -> None:
        async with gate.holding(scope):
            log.append(f"+{name}")
            await trio.sleep(0.05)
            log.append(f"-{name}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, "a", (root / "a",))
        await trio.sleep(0.01)
        nursery.start_soon(writer, "b", (root / "b",))  # disjoint: at once
        nursery.start_soon(writer, "a2", (root / "a" / "x",))  # inside a: waits
    assert log.index("+b") < log.index("-a")
    assert log.index("+a2") > log.index("-a")
    log.clear()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, "all", None)
        await trio.sleep(0.01)
        nursery.start_soon(writer, "c", (root / "c",))  # the whole workspace's writer: alone
    assert log == ["+all", "-all", "+c", "-c"]


def _tree(root: Path) -> dict[str, tuple[str, int, bytes | str]]:
    found: dict[str, tuple[str, int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), b"")
            else:
                found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return found


def test_a_writers_scope_is_rolled_back_byte_for_byte(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    scope = ws / "pkg"
    (scope / "sub").mkdir(parents=True)
    (scope / "a.py").write_bytes(b"a = 1\n")
    (scope / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(scope / "run.sh", 0o755)
    (scope / "sub" / "gone.txt").write_bytes(b"\x00binary\xff")
    os.symlink("a.py", scope / "link")
    (ws / "outside.txt").write_text("not in the scope")
    before = _tree(ws)
    kept = keep_scope("3", (scope,), ws, tmp_path / "objects")
    # The writer: edits, a mode change, a delete, new files and directories, a new link.
    (scope / "a.py").write_bytes(b"a = 2\n")
    os.chmod(scope / "run.sh", 0o644)
    (scope / "sub" / "gone.txt").unlink()
    (scope / "new" / "deep").mkdir(parents=True)
    (scope / "new" / "deep" / "x.py").write_text("x")
    os.symlink("/etc/passwd", scope / "sub" / "evil")
    (scope / "link").unlink()
    (scope / "link").write_text("was a link")
    (ws / "outside.txt").write_text("changed by someone else")
    changed = roll_back(ws, kept, tmp_path / "objects")
    after = _tree(ws)
    assert after.pop("outside.txt") == ("file", 0o644, b"changed by someone else")
    before.pop("outside.txt")
    assert after == before
    assert {"pkg/a.py", "pkg/run.sh", "pkg/sub/gone.txt", "pkg/new", "pkg/link"} <= set(changed)
    assert roll_back(ws, kept, tmp_path / "objects") == []  # twice: nothing left to do
