"""Reading the user: the prompt (prompt_toolkit, in a thread: its asyncio loop cannot run
under trio), single-key answers for dialogs (in the trio thread), and completion of slash
commands (the session's MCP prompts among them) and of the one `@` grammar: `@path` for
files, `@server:uri` for the resources the session's MCP servers list.

The prompt is multi-line: Enter sends, Esc then Enter (or a line ending in `\\`) starts a new
line. History is kept per repository in Warren's state directory. Ctrl-C clears
a non-empty line; at an empty prompt it returns `CTRL_C` (twice in a row exits), Ctrl-D
returns `CTRL_D` (exit).
"""

from __future__ import annotations

import hashlib
import os
import termios
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio
from prompt_toolkit import PromptSession
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

__all__ = [
    "CTRL_C",
    "CTRL_D",
    "ReplCompleter",
    "history_file",
    "make_prompt",
    "prompt_line",
    "read_key",
]

CTRL_C: Final = "\x03"
CTRL_D: Final = "\x04"
Typed = str  # the text, or CTRL_C / CTRL_D

_MAX_PATH_COMPLETIONS = 200


def history_file(state: Path, workspace: Path) -> Path:
    """The prompt history of one repository: `<state>/history/<hash of its path>`."""
    digest = hashlib.sha256(str(workspace).encode()).hexdigest()[:16]
    return state / "history" / digest


McpListing = Callable[[], Mapping[str, str]]
"""Names and one-line descriptions, read when completing: the session's MCP prompts (as
command names) or resources (as `server:uri`). Read in the prompt's thread: they only look
at the servers' listings."""


def _none() -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class ReplCompleter(Completer):
    """Slash commands at the start of the line; `@path` and `@server:uri` anywhere (names
    listed, never read)."""

    commands: Mapping[str, str]
    """The slash commands, by name, with their summaries."""
    workspace: Path
    """Where a relative `@path` starts."""
    mcp_prompts: McpListing = field(default=_none, kw_only=True)
    """The MCP servers' prompts, offered as slash commands (asked at each completion)."""
    mcp_resources: McpListing = field(default=_none, kw_only=True)
    """The MCP servers' resources, offered after `@`."""

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterable[Completion]:
        before = document.text_before_cursor
        if before.startswith("/") and " " not in before:
            for name, summary in [*self.commands.items(), *self.mcp_prompts().items()]:
                if name.startswith(before[1:]):
                    yield Completion("/" + name, start_position=-len(before), display_meta=summary)
            return
        word = before.split()[-1] if before and not before[-1].isspace() else ""
        if word.startswith("@"):
            yield from self._resources(word[1:])
            yield from self._paths(word[1:])

    def _resources(self, typed: str) -> Iterable[Completion]:
        found = [(n, d) for n, d in self.mcp_resources().items() if n.startswith(typed)]
        for name, description in sorted(found)[:_MAX_PATH_COMPLETIONS]:
            yield Completion("@" + name, start_position=-len(typed) - 1, display_meta=description)

    def _paths(self, typed: str) -> Iterable[Completion]:
        head, _, stem = typed.rpartition("/")
        base = Path(head) if head.startswith("/") else self.workspace / head
        try:
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except OSError:
            return
        shown = 0
        for entry in entries:
            if not entry.name.startswith(stem) or (entry.name.startswith(".") and not stem):
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            text = (f"{head}/" if head else "") + entry.name + ("/" if is_dir else "")
            yield Completion("@" + text, start_position=-len(typed) - 1, display=entry.name)
            shown += 1
            if shown >= _MAX_PATH_COMPLETIONS:
                return


def _bindings() -> KeyBindings:
    keys = KeyBindings()

    @keys.add("enter")
    @keys.add("c-j")  # what Enter becomes in keys typed ahead while the terminal was cooked
    def _send(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if buffer.text.endswith("\\") and buffer.cursor_position == len(buffer.text):
            buffer.delete_before_cursor(1)
            buffer.insert_text("\n")
            return
        buffer.validate_and_handle()

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    # Ctrl-C clears what is typed, Ctrl-D deletes forward; on an empty line each ends the
    # prompt with its own result.
    for key, edit, result in (("c-c", Buffer.reset, CTRL_C), ("c-d", Buffer.delete, CTRL_D)):
        keys.add(key)(_edit_or_exit(edit, result))
    return keys


def _edit_or_exit(edit: Callable[[Buffer], object], result: str) -> Callable[[KeyPressEvent], None]:
    """A key that applies `edit` to a buffer holding text, and ends the prompt with `result`
    when it holds none."""

    def handle(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        if buffer.text:
            edit(buffer)
        else:
            event.app.exit(result=result)

    return handle


def make_prompt(history: Path, completer: Completer) -> PromptSession[str]:
    """The REPL's prompt: multi-line, with history and completion."""
    try:
        history.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        pass  # no history then; FileHistory tolerates a missing file on read
    return PromptSession(
        history=FileHistory(str(history)),
        completer=completer,
        complete_while_typing=True,
        multiline=True,
        key_bindings=_bindings(),
        prompt_continuation=lambda width, line, soft: ". ".rjust(width),
        enable_suspend=True,
    )


async def prompt_line(session: PromptSession[str], message: Any, **options: Any) -> Typed:
    """Read one input with `session` in a thread.

    **Cancellation:** the prompt is closed (its thread told to exit, waited for at most 2 s)
    and `Cancelled` propagates.
    """

    def read() -> Typed:
        try:
            return session.prompt(message, **options)
        except KeyboardInterrupt:
            return CTRL_C
        except EOFError:
            return CTRL_D

    return await _in_thread(read, lambda: _close_prompt(session))


def _close_prompt(session: PromptSession[str]) -> None:
    app = session.app
    loop = app.loop
    if app.is_running and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(lambda: app.exit(result=CTRL_D) if app.is_running else None)


async def read_key(fd: int, allowed: Callable[[str], bool]) -> str:
    """One key the user presses on terminal `fd` that `allowed` accepts (Esc is `"esc"`,
    Enter `"enter"`), read in cbreak mode without echo.

    Read in the trio thread, waiting in trio's own epoll: a dialog may be open while other
    subagents run, and a thread polling the terminal would take the GIL from their loop on
    every wake (orchestrator/cli/repl/keys.py).

    **Cancellation:** the read stops at once, the terminal's mode restored, and `Cancelled`
    propagates.
    """
    saved = termios.tcgetattr(fd)
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    try:
        while True:
            await trio.lowlevel.wait_readable(fd)
            data = os.read(fd, 16)
            if not data:
                return "eof"
            key = _key_name(data)
            if key in ("ctrl-c", "eof") or allowed(key):
                return key
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _key_name(data: bytes) -> str:
    match data:
        case b"\x1b":
            return "esc"
        case b"\r" | b"\n":
            return "enter"
        case b"\x03":
            return "ctrl-c"
        case b"\x04":
            return "eof"
        case _:
            return data.decode("utf-8", "replace").lower() if len(data) == 1 else "?"


async def _in_thread(work: Callable[[], str], stop: Callable[[], None]) -> str:
    """`work()` in a thread. On cancellation `stop()` is called until it returns (at most
    2 s, shielded, so the terminal is restored before anything else draws); a thread that
    does not return by then is abandoned (trio's threads do not hold up the exit)."""
    done = threading.Event()

    def run() -> str:
        try:
            return work()
        finally:
            done.set()

    try:
        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    except trio.Cancelled:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            while not done.is_set():
                stop()
                await trio.sleep(0.05)
        raise
