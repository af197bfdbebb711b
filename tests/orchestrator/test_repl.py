"""The interactive session's pure parts and its Esc watcher on a real pseudo-terminal; the
whole REPL runs end to end in tests/orchestrator/test_repl_e2e.py."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import trio
import trio.testing
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document

from orchestrator.cli.repl.app import with_mentions
from orchestrator.cli.repl.commands import COMMANDS, suggest
from orchestrator.cli.repl.dialog import change_diff
from orchestrator.cli.repl.input import ReplCompleter
from orchestrator.cli.repl.keys import KeyWatcher


def test_an_unknown_command_gets_the_nearest_name() -> None:
    assert suggest("cots") == "cost"
    assert suggest("hlep") == "help"
    assert suggest("compcat") == "compact"
    assert suggest("zzzzzz") is None


def test_edit_diffs_come_from_the_calls_input() -> None:
    edit = change_diff(
        "Edit", {"file_path": "/w/a.py", "old_string": "x = 1\n", "new_string": "x = 2\n"}
    )
    assert edit is not None and edit[:2] == ["--- /w/a.py", "+++ /w/a.py"]
    assert "-x = 1" in edit and "+x = 2" in edit
    multi = change_diff(
        "MultiEdit",
        {"file_path": "/w/a.py", "edits": [{"old_string": "a", "new_string": "b"},
                                           {"old_string": "c", "new_string": "d"}]},
    )  # fmt: skip
    assert multi is not None and multi.count("--- /w/a.py") == 1
    assert [
        line for line in multi if line[:1] in "+-" and len(line) == 2
    ] == ["-a", "+b", "-c", "+d"]
    write = change_diff("Write", {"file_path": "/w/new.py", "content": "one\ntwo\n"})
    assert write is not None and "+one" in write and "+two" in write
    assert change_diff("Bash", {"command": "ls"}) is None


def test_completion_of_commands_and_paths(tmp_path: Path) -> None:
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "money.py").write_text("")
    (tmp_path / "setup.py").write_text("")
    (tmp_path / ".env").write_text("")
    completer = ReplCompleter({n: c.summary for n, c in COMMANDS.items()}, tmp_path)

    def complete(text: str) -> list[str]:
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("/co") == ["/compact", "/cost", "/context"]
    assert complete("look at @s") == ["@setup.py", "@shop/"]
    assert complete("look at @shop/m") == ["@shop/money.py"]
    assert complete("look at @") == ["@setup.py", "@shop/"]  # dot files only when typed
    assert complete("look at @.e") == ["@.env"]
    assert complete("no mention") == []


def test_completion_of_mcp_prompts_and_resources_in_one_at_grammar(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    completer = ReplCompleter(
        {n: c.summary for n, c in COMMANDS.items()},
        tmp_path,
        mcp_prompts=lambda: {"mcp__notes__review": "<path>  (MCP) Review a file."},
        mcp_resources=lambda: {"notes:notes://today": "today's note", "docs:file:///a.md": "a"},
    )

    def complete(text: str) -> list[str]:
        return [c.text for c in completer.get_completions(Document(text), CompleteEvent())]

    assert complete("/mcp") == ["/mcp", "/mcp__notes__review"]
    assert complete("read @notes") == ["@notes:notes://today", "@notes.txt"]
    assert complete("read @notes:") == ["@notes:notes://today"]
    assert complete("read @d") == ["@docs:file:///a.md"]


def test_columns_align_rows_and_cut_them_to_the_width() -> None:
    from rich.console import Console

    from orchestrator.cli.columns import Columns

    rows = Columns(("agent", "tool"), [(("a1", "cyan"), "Grep('x')"), ("agent-2", "thinking")])
    console = Console(width=14, record=True, color_system=None, file=io.StringIO())
    console.print(rows)
    assert console.export_text().splitlines() == [
        "agent   tool",
        "a1      Grep('",
        "agent-2 thinki",
    ]


def test_mentions_are_named_for_the_model(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    said = with_mentions("explain @a.py and @missing.py, mail me@example.com", tmp_path)
    assert said.endswith(f"(Files the user mentioned: {tmp_path / 'a.py'})")
    assert with_mentions("nothing here", tmp_path) == "nothing here"


async def test_esc_interrupts_and_an_arrow_key_does_not() -> None:
    """On a real pseudo-terminal: a lone Esc interrupts; the Esc that starts an arrow key's
    sequence does not; other keys are kept as typeahead, each one told to `on_typed`."""
    master, slave = os.openpty()
    interrupted = trio.Event()
    echoed: list[str] = []
    watcher = KeyWatcher(slave, interrupted.set, on_typed=echoed.append)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.watch)
            with watcher:
                os.write(master, b"\x1b[Ahi\x7f\x7fok")
                with trio.move_on_after(0.5):
                    await interrupted.wait()
                assert not interrupted.is_set()
                os.write(master, b"\x1b")
                with trio.fail_after(5):
                    await interrupted.wait()
            nursery.cancel_scope.cancel()
        assert watcher.take_typed() == "ok"
        assert echoed[-1] == "ok"
    finally:
        os.close(master)
        os.close(slave)


async def test_the_key_watcher_is_no_thread_and_reads_nothing_once_paused() -> None:
    """Keys are read in the trio thread (a thread polling the terminal took the GIL from the
    loop twenty times a second: the REPL's subagent turns were slower than headless ones), and
    a pause stops the reading at once: a dialog reads the next key."""
    master, slave = os.openpty()
    typed = trio.Event()
    watcher = KeyWatcher(slave, lambda: None, on_typed=lambda _: typed.set())
    threads = threading.active_count()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watcher.watch)
            watcher.resume()
            await trio.testing.wait_all_tasks_blocked()
            assert threading.active_count() == threads, "the watcher started a thread"
            os.write(master, b"a")
            with trio.fail_after(5):
                await typed.wait()
            watcher.pause(keep_mode=True)
            os.write(master, b"b")
            await trio.testing.wait_all_tasks_blocked()
            assert os.read(slave, 1) == b"b"  # left for the dialog
            watcher.resume()
            typed = trio.Event()
            os.write(master, b"c")
            with trio.fail_after(5):
                await typed.wait()
            watcher.pause()
            nursery.cancel_scope.cancel()
        assert watcher.take_typed() == "ac"
    finally:
        os.close(master)
        os.close(slave)
