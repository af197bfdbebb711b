"""Esc and Ctrl-C while a turn runs: a thread reads the terminal's keys and interrupts the run.

prompt_toolkit owns the terminal only while the user types at a prompt; during a turn nobody
reads stdin, so this watcher does: the terminal in cbreak mode without echo or ISIG (Ctrl-C is
a key here, not a signal), `select` with a short timeout so `stop` returns within 50 ms, and a
lone Esc told apart from the escape sequences arrow and function keys send (they come as one
burst). Other keys are kept as typeahead (`take_typed`), which the next prompt starts with;
`on_typed` is told the typeahead after each key (the live area echoes it). Dialogs `pause` it
to read their answer themselves.
"""

from __future__ import annotations

import os
import select
import termios
import threading
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["KeyWatcher"]

_POLL_S = 0.05
"""How long a read waits before checking whether to stop."""
_SEQUENCE_GAP_S = 0.03
"""A byte within this long after Esc makes it an escape sequence, not the Esc key."""
_ESC, _CTRL_C = b"\x1b", b"\x03"


class KeyWatcher:
    """Calls `on_interrupt` (in the trio thread) when Esc or Ctrl-C is pressed.

    Use as `with watcher:` around a turn; `pause()`/`resume()` around a dialog. Without a
    terminal on `fd` it does nothing.
    """

    def __init__(
        self,
        fd: int,
        on_interrupt: Callable[[], None],
        token: trio.lowlevel.TrioToken,
        on_typed: Callable[[str], None] | None = None,
    ) -> None:
        self._fd = fd
        self._on_interrupt = on_interrupt
        self._on_typed = on_typed
        self._token = token
        self._saved: list[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._typed = bytearray()
        self._lock = threading.Lock()

    def take_typed(self) -> str:
        """What was typed while the turn ran (Backspace applied), emptied."""
        with self._lock:
            typed, self._typed = bytes(self._typed), bytearray()
        return typed.decode("utf-8", "ignore")

    def typed(self) -> str:
        """What was typed so far (a character still arriving left out)."""
        with self._lock:
            return bytes(self._typed).decode("utf-8", "ignore")

    def __enter__(self) -> KeyWatcher:
        self.resume()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pause()

    def resume(self) -> None:
        """Start reading keys (the terminal in cbreak mode, no echo, no signals)."""
        if self._thread is not None or not os.isatty(self._fd):
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
        self._stop.clear()
        self._thread = threading.Thread(target=self._read, name="warren-keys", daemon=True)
        self._thread.start()

    def pause(self, *, keep_mode: bool = False) -> None:
        """Stop reading (within `_POLL_S`) and give the terminal its mode back, or with
        `keep_mode` leave it without echo (a dialog reads keys next: none may echo first)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=1.0)
        if self._saved is not None and not keep_mode:
            try:
                termios.tcsetattr(self._fd, termios.TCSANOW, self._saved)
            except termios.error:
                pass
            self._saved = None

    def _ready(self, timeout: float) -> bool:
        try:
            readable, _, _ = select.select([self._fd], [], [], timeout)
        except (OSError, ValueError):
            return False
        return bool(readable)

    def _read(self) -> None:
        while not self._stop.is_set():
            if not self._ready(_POLL_S):
                continue
            try:
                key = os.read(self._fd, 1)
            except OSError:
                return
            if not key:
                return  # the terminal is gone
            if key == _ESC:
                if self._ready(_SEQUENCE_GAP_S):
                    self._drain()
                    continue
            elif key != _CTRL_C:
                self._keep(key)
                if self._on_typed is not None:
                    try:  # the echo is drawn in the trio thread; this one reads on at once
                        self._token.run_sync_soon(self._echo)
                    except trio.RunFinishedError:
                        return
                continue
            try:
                trio.from_thread.run_sync(self._on_interrupt, trio_token=self._token)
            except trio.RunFinishedError:
                return

    def _echo(self) -> None:
        if self._on_typed is not None:
            self._on_typed(self.typed())

    def _keep(self, key: bytes) -> None:
        with self._lock:
            if key in (b"\x7f", b"\x08"):
                del self._typed[-1:]
            elif key >= b" " or key in (b"\r", b"\n", b"\t"):
                self._typed += key

    def _drain(self) -> None:
        """Swallow the rest of an escape sequence: `ESC [ ... final` (arrows, function keys),
        `ESC O x`, or `ESC x` (Alt+key); what follows it is typed keys again."""
        first = self._byte()
        if first == b"[":
            while (byte := self._byte()) and not 0x40 <= byte[0] <= 0x7E:
                pass
        elif first == b"O":
            self._byte()

    def _byte(self) -> bytes:
        if not self._ready(_SEQUENCE_GAP_S):
            return b""
        try:
            return os.read(self._fd, 1)
        except OSError:
            return b""
