"""Esc and Ctrl-C while a turn runs: a trio task reads the terminal's keys and interrupts the run.

prompt_toolkit owns the terminal only while the user types at a prompt; during a turn nobody
reads stdin, so this watcher does: the terminal in cbreak mode without echo or ISIG (Ctrl-C is
a key here, not a signal), and a lone Esc told apart from the escape sequences arrow and
function keys send (they come as one burst). Other keys are kept as typeahead (`take_typed`),
which the next prompt starts with; `on_typed` is told the typeahead after each key (the live
area echoes it). Dialogs `pause` it to read their answer themselves.

It is a task of the turn's nursery (`watch`), waiting for the terminal in trio's own epoll, not
a thread: a thread polling the terminal woke twenty times a second, each wake taking the GIL
from the trio thread that relays the subagents' streams (1-2.4 ms of every second spent
waiting for it, measured on a loaded 2-core machine). The only timer left is the short wait
after an Esc. tests/orchestrator/test_repl.py pins that it starts no thread.
"""

from __future__ import annotations

import os
import termios
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["KeyWatcher"]

_SEQUENCE_GAP_S = 0.03
"""A byte within this long after Esc makes it an escape sequence, not the Esc key."""
_ESC, _CTRL_C = b"\x1b", b"\x03"


class KeyWatcher:
    """Calls `on_interrupt` when Esc or Ctrl-C is pressed.

    Run `watch` in a nursery for the turn; `resume()` / `pause()` (or `with watcher:`) say
    when it reads: a dialog pauses it to read its answer. Without a terminal on `fd` it does
    nothing.
    """

    def __init__(
        self,
        fd: int,
        on_interrupt: Callable[[], None],
        on_typed: Callable[[str], None] | None = None,
    ) -> None:
        self._fd = fd
        self._on_interrupt = on_interrupt
        self._on_typed = on_typed
        self._saved: list[Any] | None = None
        self._reading = False
        self._resumed = trio.Event()
        self._scope = trio.CancelScope()
        self._typed = bytearray()

    def take_typed(self) -> str:
        """What was typed while the turn ran (Backspace applied), emptied."""
        typed, self._typed = bytes(self._typed), bytearray()
        return typed.decode("utf-8", "ignore")

    def typed(self) -> str:
        """What was typed so far (a character still arriving left out)."""
        return bytes(self._typed).decode("utf-8", "ignore")

    def __enter__(self) -> KeyWatcher:
        self.resume()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pause()

    def resume(self) -> None:
        """Read keys (the terminal in cbreak mode, no echo, no signals) from now on."""
        if self._reading or not os.isatty(self._fd):
            return
        try:
            if self._saved is None:
                self._saved = termios.tcgetattr(self._fd)
            mode = termios.tcgetattr(self._fd)
            mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG | termios.IEXTEN)
            mode[6][termios.VMIN] = 1
            mode[6][termios.VTIME] = 0
            termios.tcsetattr(self._fd, termios.TCSANOW, mode)
        except termios.error:
            self._saved = None
            return
        self._reading = True
        self._resumed.set()

    def pause(self, *, keep_mode: bool = False) -> None:
        """Stop reading at once (no key is read after this returns) and give the terminal its
        mode back, or with `keep_mode` leave it without echo (a dialog reads keys next: none
        may echo first)."""
        if self._reading:
            self._reading = False
            self._scope.cancel()
            self._resumed = trio.Event()
        if self._saved is not None and not keep_mode:
            try:
                termios.tcsetattr(self._fd, termios.TCSANOW, self._saved)
            except termios.error:
                pass
            self._saved = None

    async def watch(self) -> None:
        """Read keys whenever resumed, until cancelled.

        **Cancellation:** the way it ends; nothing to undo (`pause` restores the terminal).
        """
        while True:
            await self._resumed.wait()
            with trio.CancelScope() as self._scope:
                if self._reading:  # not paused again before this task ran
                    await self._read()

    async def _follows(self) -> bool:
        """Whether another byte comes within `_SEQUENCE_GAP_S` (and reading is still on)."""
        with trio.move_on_after(_SEQUENCE_GAP_S) as waited:
            await trio.lowlevel.wait_readable(self._fd)
        return self._reading and not waited.cancelled_caught

    async def _read(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            # A pause while this task was already woken (not cancellable any more): no read.
            if not self._reading:
                return
            try:
                key = os.read(self._fd, 1)
            except OSError:
                return
            if not key:
                return  # the terminal is gone
            if key == _ESC:
                if await self._follows():
                    await self._drain()
                    continue
            elif key != _CTRL_C:
                self._keep(key)
                if self._on_typed is not None:
                    self._on_typed(self.typed())
                continue
            self._on_interrupt()

    def _keep(self, key: bytes) -> None:
        if key in (b"\x7f", b"\x08"):
            del self._typed[-1:]
        elif key >= b" " or key in (b"\r", b"\n", b"\t"):
            self._typed += key

    async def _drain(self) -> None:
        """Swallow the rest of an escape sequence: `ESC [ ... final` (arrows, function keys),
        `ESC O x`, or `ESC x` (Alt+key); what follows it is typed keys again."""
        first = await self._byte()
        if first == b"[":
            while (byte := await self._byte()) and not 0x40 <= byte[0] <= 0x7E:
                pass
        elif first == b"O":
            await self._byte()

    async def _byte(self) -> bytes:
        if not await self._follows():
            return b""
        try:
            return os.read(self._fd, 1)
        except OSError:
            return b""
