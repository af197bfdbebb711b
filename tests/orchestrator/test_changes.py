"""The scans behind per-turn change sets (orchestrator/changes/tree_state.py) and the undo's
refusals, in process on real files: the inotify-kept tree equals a fresh whole scan after every
kind of change, and a turn's changes worked out from the names touched equal a whole comparison;
links and FIFOs are recorded without being followed or opened; an undo whose old content is
damaged in the store refuses and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.recorder import (
    ChangeRecorder,
    append_record,
    change_log_path,
    diff,
    read_turns,
)
from orchestrator.changes.store_gc import collect, hold
from orchestrator.changes.tree_state import Entry, Key, TreeState, scan
from orchestrator.changes.undo import undo_last_turn
from orchestrator.changes.writers import Writer
from orchestrator.session.recording import may_write
from orchestrator.tools.registry import builtin_tools
from sandbox.binary import find_system_tool


def _content(entries: dict[Key, Entry]) -> dict[Key, tuple[str, str | None, str | None, int]]:
    return {key: (e.kind, e.sha, e.target, e.mode if e.kind == "file" else 0)
            for key, e in entries.items()}  # fmt: skip


def _mutate(ws: Path, rng: random.Random) -> None:
    """One random change of the kinds tools and shells make."""
    files = [
        p for p in ws.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.parts
    ]
    dirs = [
        ws,
        *(p for p in ws.rglob("*") if p.is_dir() and not p.is_symlink() and ".git" not in p.parts),
    ]
    action = rng.choice(["new", "append", "replace", "rename", "delete", "mkdirs", "movedir",
                         "rmtree", "chmod", "link", "git"])  # fmt: skip
    target = rng.choice(dirs)
    if action == "new" or not files:
        (target / f"f{rng.randrange(10**6)}.txt").write_text("x" * rng.randrange(50))
    elif action == "append":
        with rng.choice(files).open("a") as f:
            f.write("more\n")
    elif action == "replace":  # temp + rename, as editors and sed -i do
        victim = rng.choice(files)
        (victim.parent / ".tmp").write_text("replaced")
        os.replace(victim.parent / ".tmp", victim)
    elif action == "rename":
        os.rename(rng.choice(files), target / f"r{rng.randrange(10**6)}")
    elif action == "delete":
        rng.choice(files).unlink()
    elif action == "mkdirs":
        deep = target / f"d{rng.randrange(10**6)}" / "sub"
        deep.mkdir(parents=True)
        (deep / "inside.txt").write_text("inside")
    elif action == "movedir" and target != ws:
        os.rename(target, ws / f"moved{rng.randrange(10**6)}")
    elif action == "rmtree" and target != ws:
        for sub in sorted(target.rglob("*"), key=lambda p: -len(p.parts)):
            sub.rmdir() if sub.is_dir() and not sub.is_symlink() else sub.unlink()
        target.rmdir()
    elif action == "chmod":
        rng.choice(files).chmod(0o700)
    elif action == "link":
        (target / f"l{rng.randrange(10**6)}").symlink_to(rng.choice(files))
    elif action == "git":
        (ws / ".git").mkdir(exist_ok=True)
        (ws / ".git" / "index").write_text(str(rng.random()))


def test_the_watched_tree_equals_a_whole_scan_after_every_kind_of_change(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    for i in range(20):
        (ws / ("a" if i % 2 else "a/b") / f"{i}.txt").write_text(str(i))
    store = ContentStore(tmp_path / "objects")
    tree = TreeState([ws], store)
    marked = TreeState([ws], store)  # the recorder's way: a mark, then what changed since
    rng = random.Random(17)
    try:
        start = tree.refresh()
        marked.mark()
        touched: set[Key] = set()
        for batch in range(40):
            for _ in range(rng.randrange(1, 4)):
                _mutate(ws, rng)
            if batch == 22:
                marked._degraded = True  # as at the watch limit: the next refresh is whole
            kept = tree.refresh()
            assert _content(kept.entries) == _content(scan([ws], store).entries)
            # A turn's changes worked out from the names the refreshes touched are the ones a
            # comparison of the whole tables finds (a turn: five batches here).
            assert kept.touched is not None
            touched |= kept.touched
            whole = [c.to_json() for c in diff(start.entries, kept.entries)]
            assert [c.to_json() for c in diff(start.entries, kept.entries, touched)] == whole
            # So are those worked out from the entries noted since a mark (no copy of the
            # tree), also across a whole scan in the middle of a turn.
            before, after, names, _ = marked.since_mark()
            assert [c.to_json() for c in diff(before, after, names)] == whole
            if batch % 5 == 4:
                start, touched = kept, set()
                marked.mark()
        assert tree.full_scans == 1  # every later refresh came from the events
        assert marked.full_scans == 2
    finally:
        tree.close()
        marked.close()


def test_links_and_fifos_are_recorded_never_followed_or_opened(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside secret")
    (ws / "link").symlink_to(outside / "secret")
    (ws / "dirlink").symlink_to(outside)
    os.mkfifo(ws / "fifo")  # opened for reading without O_NONBLOCK, the scan would hang
    store = ContentStore(tmp_path / "objects")
    entries = scan([ws], store).entries
    assert entries[(str(ws), "link")] == Entry("link", 0o777, target=str(outside / "secret"))
    assert entries[(str(ws), "fifo")].kind == "other"
    assert not any(key[1].startswith("dirlink/") for key in entries)
    assert not store.root.exists()  # nothing was read, so nothing kept


def test_an_undo_whose_old_content_is_damaged_refuses_and_changes_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("before")
    (ws / "lost.txt").write_text("before too")
    store = ContentStore(tmp_path / "objects")
    log = change_log_path(tmp_path / "s.jsonl")
    recorder = ChangeRecorder([ws], store, log)
    before = recorder.tree.refresh()
    (ws / "kept.txt").write_text("after")
    (ws / "lost.txt").write_text("after too")
    (ws / "new.txt").write_text("new")
    after = recorder.tree.refresh()
    recorder._turn_complete = True
    recorder._changes = diff(before.entries, after.entries)
    recorder.end_turn()
    recorder.close()
    assert [c.key[1] for c in diff(before.entries, after.entries)] == [
        "kept.txt", "lost.txt", "new.txt"
    ]  # fmt: skip
    lost = before.entries[(str(ws), "lost.txt")].sha
    assert lost is not None
    where = store.locate(lost)  # the first scan packs what it keeps
    assert where is not None
    with where[0].open("r+b") as pack:
        pack.seek(where[1])
        pack.write(b"torn")

    outcome = undo_last_turn(log, store)
    assert not outcome.undone
    assert outcome.message == (
        "turn 1 not undone, nothing changed: cannot put back lost.txt (its old content was not "
        "kept)"
    )
    assert sorted(p.name for p in ws.iterdir()) == ["kept.txt", "lost.txt", "new.txt"]
    assert (ws / "kept.txt").read_text() == "after"


def test_warren_state_inside_the_workspace_is_never_scanned(tmp_path: Path) -> None:
    """A workspace that holds Warren's state (a home directory): the store keeping what the
    scan read must not be read by the next scan, or it would grow without end."""
    state = tmp_path / ".local" / "state" / "warren"
    tree = TreeState([tmp_path], ContentStore(state / "objects"), state / "scans", skip=[state])
    (tmp_path / "notes.txt").write_text("notes")
    try:
        first = tree.refresh()
        (tmp_path / "notes.txt").write_text("more notes")  # kept as a loose blob in the state
        second = tree.refresh()
    finally:
        tree.close()
    kept = {p.name for p in (state / "objects").iterdir()}
    assert "packs" in kept and len(kept) == 2  # the first scan's pack, the loose new content
    for scanned in (first, second):
        assert not any(rel.startswith(".local/state/warren") for _, rel in scanned.entries)
    assert [c.key[1] for c in diff(first.entries, second.entries)] == ["notes.txt"]


def test_the_first_scan_runs_in_a_child_and_misses_nothing_changed_while_it_ran(
    tmp_path: Path,
) -> None:
    """Reading the tree happens in another process (the pack it writes names its pid), and
    the watches it set report to this one: changes made while it ran, and after, are seen."""
    ws = tmp_path / "ws"
    for d in range(10):
        (ws / f"d{d}").mkdir(parents=True)
        for i in range(30):
            (ws / f"d{d}" / f"{i}.txt").write_text(f"{d} {i}")
    store = ContentStore(tmp_path / "objects")
    tree = TreeState([ws], store)
    rng = random.Random(9)
    try:
        tree.start()
        # At `nice` 10 from its start (its interpreter's start-up is most of its CPU before
        # the first model request), by the system's `nice`, never one from $PATH.
        assert tree._process is not None
        assert tree._process.args[:3] == [str(find_system_tool("nice")), "-n", "10"]  # type: ignore[index]
        for _ in range(10):  # while the child starts and reads
            _mutate(ws, rng)
        first = tree.refresh()
        assert _content(first.entries) == _content(scan([ws], store).entries)
        for _ in range(10):  # after: only the child's watches can report these
            _mutate(ws, rng)
        assert _content(tree.refresh().entries) == _content(scan([ws], store).entries)
        assert tree.full_scans == 1
    finally:
        tree.close()
    packs = list((tmp_path / "objects" / "packs").glob("*.pack"))
    assert packs and all(p.name.split("-")[1] != str(os.getpid()) for p in packs)


def test_sessions_that_cannot_write_do_not_scan(tmp_path: Path) -> None:
    tools = builtin_tools()
    readers = tools.only(lambda tool: tool.facts.family in ("read", "meta"))
    assert may_write("default", tools, False, [tmp_path])
    assert not may_write("plan", tools, False, [tmp_path])
    assert not may_write("default", readers, False, [tmp_path])
    assert may_write("default", readers, True, [tmp_path])  # MCP tools may write
    assert not may_write("default", tools, False, [tmp_path / "gone"])  # no root to write


def test_the_store_keeps_what_an_undo_can_need_and_prunes_the_rest(tmp_path: Path) -> None:
    state = tmp_path / "state"
    objects, sessions, scans = state / "objects", state / "sessions", state / "scans"
    store = ContentStore(objects)
    for name in ("older", "newer"):  # each workspace's latest stamps: one 3000-byte file
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(name[0] * 3000)
        tree = TreeState([tmp_path / name], store, scans)
        tree.refresh()
        tree.close()
    stamps = {json.loads(p.read_bytes())["root"]: p for p in scans.glob("*.json")}
    t = time.time()
    os.utime(stamps[str(tmp_path / "older")], (t - 100, t - 100))
    recent, stale, unused = (store.put(text)[0] for text in (b"recent", b"stale", b"unused"))
    for session, sha, age in (("recent", recent, 0), ("stale", stale, 40 * 86400)):
        log = sessions / f"{session}.changes.jsonl"
        before = {"kind": "file", "mode": 0o644, "sha": sha}
        change = {"root": str(tmp_path), "path": "x", "before": before, "after": None}
        append_record(log, {"type": "turn", "turn": 1, "changes": [change]})
        os.utime(log, (t - age, t - age))
    older, newer = (hashlib.sha256(c * 3000).hexdigest() for c in (b"o", b"n"))
    for blob in objects.glob("??/*"):  # older than the grace a collection leaves
        os.utime(blob, (t - 7200, t - 7200))
    young = store.put(b"young: a session may be writing it now")[0]

    with hold(objects):  # a session is running: nothing goes
        assert not collect(state, objects, sessions).ran
    assert all(ContentStore(objects).has(sha) for sha in (older, newer, recent, stale, unused))

    assert collect(state, objects, sessions).ran
    after = ContentStore(objects)
    assert [after.has(sha) for sha in (older, newer, recent, stale, unused, young)] == [
        True, True, True, False, False, True
    ]  # fmt: skip

    capped = collect(state, objects, sessions, max_bytes=3000 + len(b"recent"))
    after = ContentStore(objects)
    assert [after.has(sha) for sha in (older, newer, recent)] == [False, True, True]
    assert not stamps[str(tmp_path / "older")].exists()  # its next session reads it again
    assert capped.kept == 3000 + len(b"recent")


def _recorder(tmp_path: Path) -> tuple[ChangeRecorder, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    log = change_log_path(tmp_path / "s.jsonl")
    return ChangeRecorder([ws], ContentStore(tmp_path / "objects"), log), ws


def test_a_calls_after_scan_waits_until_the_run_is_idle(tmp_path: Path, monkeypatch: Any) -> None:
    """The scan after a writing call holds the GIL in its thread: it must not run while the
    loop still has work (sending the tool result and the next request), only once every
    task waits; the turn's record is then complete."""
    import orchestrator.changes.recorder as changes

    monkeypatch.setattr(changes, "IDLE_WAIT_S", 60.0)
    recorder, ws = _recorder(tmp_path)

    async def main() -> None:
        async with recorder.running():
            await recorder.before_call("toolu_1")
            scanned = recorder.scan_seconds
            (ws / "a.txt").write_text("changed")
            await recorder.after_call()
            recorder.end_turn()
            busy_until = trio.current_time() + 0.3  # a scan in a thread takes a millisecond
            while trio.current_time() < busy_until:  # busy: a task is always runnable
                await trio.lowlevel.checkpoint()
                assert recorder.scan_seconds == scanned
            await trio.sleep(0.01)  # idle now: the queued scan and record run
            await recorder.settled()
            assert recorder.scan_seconds > scanned

    trio.run(main)
    recorder.close()
    turns = read_turns(recorder.log)
    assert [[c.key[1] for c in turn.changes] for turn in turns] == [["a.txt"]]


def test_a_waited_step_never_waits_for_idleness(tmp_path: Path, monkeypatch: Any) -> None:
    """The next turn's first scan (`before_call`, `settled`) is on a call's path: queued
    behind steps that wait for an idle run, it makes them run at once, even while another
    task (a subagent's stream) keeps the run busy."""
    import orchestrator.changes.recorder as changes

    monkeypatch.setattr(changes, "IDLE_WAIT_S", 60.0)
    recorder, ws = _recorder(tmp_path)
    busy_until_s = 20.0

    async def main() -> None:
        stop = trio.Event()

        async def busy() -> None:
            deadline = trio.current_time() + busy_until_s
            while not stop.is_set() and trio.current_time() < deadline:
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery, recorder.running():
            await recorder.before_call("toolu_1")
            (ws / "a.txt").write_text("changed")
            await recorder.after_call()
            recorder.end_turn()
            nursery.start_soon(busy)
            started = trio.current_time()
            await recorder.before_call("toolu_2")
            assert trio.current_time() - started < busy_until_s  # not held back by `busy`
            stop.set()

    trio.run(main)
    recorder.close()
    assert [[c.key[1] for c in t.changes] for t in read_turns(recorder.log)] == [["a.txt"]]


def test_steps_keep_their_order_whether_run_in_the_callers_task_or_queued(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A waited step with nothing queued or under way runs in the caller's task (no trip
    through the background one); a step asked for meanwhile waits for it, and a waited step
    asked for while another is queued or held still runs after that one."""
    import orchestrator.changes.recorder as changes

    monkeypatch.setattr(changes, "IDLE_WAIT_S", 0.05)
    recorder, _ = _recorder(tmp_path)
    order: list[str] = []
    ran_in: list[Any] = []

    def step(name: str, pause_s: float = 0.0) -> Any:
        async def run() -> None:
            ran_in.append(trio.lowlevel.current_task())
            order.append(f"{name}+")
            await trio.sleep(pause_s)
            order.append(f"{name}-")

        return run

    async def main() -> None:
        async with trio.open_nursery() as nursery, recorder.running():
            # Nothing queued: the waited step runs here, in this task.
            await recorder._run(step("first"), wait=True)
            assert order == ["first+", "first-"]
            assert ran_in == [trio.lowlevel.current_task()]

            # A waited step that runs in its caller's task holds the others back.
            nursery.start_soon(partial(recorder._run, step("inline", 0.2), wait=True))
            await trio.sleep(0.05)
            await recorder._run(step("queued"), wait=False)
            await recorder.settled()
            assert order[2:] == ["inline+", "inline-", "queued+", "queued-"]

            # A step queued (waiting for idleness) keeps its place before a waited one.
            order.clear()
            await recorder._run(step("background", 0.1), wait=False)
            await recorder._run(step("waited"), wait=True)
            assert order == ["background+", "background-", "waited+", "waited-"]

    trio.run(main)
    recorder.close()


def test_a_turns_writers_each_own_what_they_wrote(tmp_path: Path) -> None:
    """Two scoped writers at once (each scan sees the other's writes too) and then a Bash
    call: each scoped writer owns what lies in its scope, the call what its own scan saw
    first; the record keeps them and the undo of the turn names each writer's files."""
    recorder, ws = _recorder(tmp_path)
    (ws / "pkg_a").mkdir()
    (ws / "pkg_b").mkdir()
    a = Writer("toolu_a", "dispatch_agent", "edit a", (str(ws / "pkg_a"),))
    b = Writer("toolu_b", "dispatch_agent", "edit b", (str(ws / "pkg_b"),))

    async def main() -> None:
        async with recorder.running():
            await recorder.before_call(a.id, a)
            await recorder.before_call(b.id, b)
            (ws / "pkg_b" / "b.txt").write_text("b")
            (ws / "pkg_a" / "a.txt").write_text("a")
            await recorder.after_call(a.id)  # sees b's file too: it is b's
            await recorder.after_call(b.id)
            await recorder.before_call("toolu_bash", Writer("toolu_bash", "Bash", "make"))
            (ws / "a.txt").write_text("changed")
            await recorder.after_call("toolu_bash")
            recorder.end_turn()

    trio.run(main)
    recorder.close()
    [turn] = read_turns(recorder.log)
    owned = {w.id: w.paths for w in turn.writers}
    assert owned == {"toolu_a": ("pkg_a/a.txt",), "toolu_b": ("pkg_b/b.txt",),
                     "toolu_bash": ("a.txt",)}  # fmt: skip
    outcome = undo_last_turn(recorder.log, recorder.store)
    assert outcome.undone, outcome.message
    assert (
        '(by dispatch_agent "edit a": pkg_a/a.txt; dispatch_agent "edit b": pkg_b/b.txt; '
        'Bash "make": a.txt)' in outcome.message
    ), outcome.message
    assert (ws / "a.txt").read_text() == "a" and not (ws / "pkg_a" / "a.txt").exists()


def test_a_background_writer_is_a_change_set_of_its_own_across_turns(tmp_path: Path) -> None:
    """A writing background command runs across three turns (issue 34, item 5): it writes
    between turns, during a turn without writing calls and while an Edit runs; a path it
    wrote first stays its own. Each turn's record keeps only its calls' paths, the writer's
    record (appended when it ends) all of its own, first before to last after, and undoing
    it puts back exactly its files."""
    recorder, ws = _recorder(tmp_path)
    (ws / "log.txt").write_text("old log\n")
    bg = Writer("bash-1", "Bash (background)", "build")

    async def main() -> None:
        async with recorder.running():
            await recorder.open_background(bg)
            (ws / "out1.txt").write_text("1")  # before any turn
            # Turn 1: an Edit of a.txt (its one file); the command writes log.txt while it
            # runs.
            edit = Writer("toolu_edit", "Edit", "a.txt", files=(str(ws / "a.txt"),))
            await recorder.before_call(edit.id, edit)
            (ws / "a.txt").write_text("edited")
            (ws / "log.txt").write_text("log 1\n")
            await recorder.after_call("toolu_edit")
            recorder.end_turn()
            await recorder.settled()
            # Turn 2: no writing call; the command writes on.
            (ws / "out2.txt").write_text("2")
            (ws / "log.txt").write_text("log 2\n")
            recorder.end_turn()
            await recorder.settled()
            # Turn 3: a Bash call writes b.txt and the command's log.txt too (the model was
            # told not to): the log stays the command's.
            await recorder.before_call("toolu_bash", Writer("toolu_bash", "Bash", "make b"))
            (ws / "b.txt").write_text("b")
            (ws / "log.txt").write_text("log 3\n")
            await recorder.after_call("toolu_bash")
            await recorder.close_background(bg.id)
            recorder.end_turn()

    trio.run(main)
    recorder.close()
    turns = read_turns(recorder.log)
    by_writer = {w.id: w.paths for t in turns for w in t.writers}
    assert by_writer == {
        "toolu_edit": ("a.txt",),
        "bash-1": ("log.txt", "out1.txt", "out2.txt"),
        "toolu_bash": ("b.txt",),
    }, by_writer
    [mine] = [t for t in turns if t.tool_use_ids == ["bash-1"]]
    log_change = next(c for c in mine.changes if c.key[1] == "log.txt")
    assert log_change.before is not None and log_change.after is not None
    store = recorder.store
    assert store.get(log_change.before.sha or "") == b"old log\n"
    assert store.get(log_change.after.sha or "") == b"log 3\n"
    # It ended before turn 3 did: undo turn 3 (b.txt), then the writer, its files only.
    assert [t.tool_use_ids for t in turns] == [["toolu_edit"], ["bash-1"], ["toolu_bash"]]
    outcome = undo_last_turn(recorder.log, store)
    assert outcome.undone and not (ws / "b.txt").exists(), outcome.message
    outcome = undo_last_turn(recorder.log, store)
    assert outcome.undone and 'Bash (background) "build"' in outcome.message, outcome.message
    assert (ws / "a.txt").read_text() == "edited"
    assert (ws / "log.txt").read_text() == "old log\n"
    assert not (ws / "out1.txt").exists() and not (ws / "out2.txt").exists()


def test_a_background_writer_ending_while_a_call_runs_leaves_the_call_its_files(
    tmp_path: Path,
) -> None:
    """A background writer whose end is recorded while a call still runs (its end reached the
    coordinator before the call's result, so its closing scan comes before the call's
    after-scan) takes only what the call cannot have written: an Edit keeps its file, the
    writer gets what it wrote beside it; an unscoped Bash keeps what it wrote. Before, the
    closing scan put every path no call's scan had seen to the writer, so undoing the writer
    undid the call (tests/orchestrator/test_undo_every_writer_e2e.py::
    test_a_background_shell_ending_while_a_call_runs_leaves_the_call_its_file)."""
    recorder, ws = _recorder(tmp_path)
    first = Writer("bash-1", "Bash (background)", "build")
    second = Writer("bash-2", "Bash (background)", "watch")

    async def main() -> None:
        async with recorder.running():
            await recorder.open_background(first)
            (ws / "out.txt").write_text("out")
            recorder.end_turn()
            await recorder.settled()
            # Turn 2: an Edit of a.txt; the command writes log.txt beside it and ends first.
            edit = Writer("toolu_edit", "Edit", "a.txt", files=(str(ws / "a.txt"),))
            await recorder.before_call(edit.id, edit)
            (ws / "a.txt").write_text("edited")
            (ws / "log.txt").write_text("log")
            await recorder.close_background(first.id)
            await recorder.after_call(edit.id)
            recorder.end_turn()
            await recorder.settled()
            # Turn 3: another command, which ends while a Bash that wrote c.txt runs.
            await recorder.open_background(second)
            await recorder.before_call("toolu_bash", Writer("toolu_bash", "Bash", "make c"))
            (ws / "c.txt").write_text("c")
            await recorder.close_background(second.id)
            await recorder.after_call("toolu_bash")
            recorder.end_turn()

    trio.run(main)
    recorder.close()
    turns = read_turns(recorder.log)
    assert [(t.tool_use_ids, [w.paths for w in t.writers]) for t in turns] == [
        (["bash-1"], [("log.txt", "out.txt")]),
        (["toolu_edit"], [("a.txt",)]),
        (["toolu_bash"], [("c.txt",)]),
    ], turns
    outcome = undo_last_turn(recorder.log, recorder.store)
    assert outcome.undone and not (ws / "c.txt").exists(), outcome.message
    outcome = undo_last_turn(recorder.log, recorder.store)
    assert outcome.undone and (ws / "a.txt").read_text() == "a", outcome.message
    assert (ws / "log.txt").read_text() == "log"
    outcome = undo_last_turn(recorder.log, recorder.store)
    assert outcome.undone and 'Bash (background) "build"' in outcome.message, outcome.message
    assert not (ws / "log.txt").exists() and not (ws / "out.txt").exists()
