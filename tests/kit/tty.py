"""A real pseudo-terminal for end-to-end tests of the interactive session: tmux.

`Terminal.start(argv, env=..., cwd=...)` runs a command in a detached tmux session of its
own (a private socket, so nothing touches the user's tmux); `type` sends text, `press` keys
(`Enter`, `Escape`, `C-c`); `wait_for` polls the captured pane until a text appears (a
generous deadline: the machine is loaded; never a fixed sleep); `screen` is the pane's text,
as the README shows it; `wait_exit` the command's exit status, which the shell around it
prints. `close` kills the session and everything in it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Terminal"]

_EXITED = "[command exited]"


@dataclass
class Terminal:
    socket: Path
    name: str

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        socket_dir: Path,
        width: int = 110,
        height: int = 40,
    ) -> Terminal:
        socket = socket_dir / f"tmux-{uuid.uuid4().hex[:8]}"
        name = "warren"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if _exportable(k))
        # The shell stays after the command and prints its exit status on the pane: tmux's
        # own `pane_dead` can lag behind an exit by a minute on a loaded machine.
        command = (
            f"cd {shlex.quote(str(cwd))} && env -i {exports} {shlex.join(argv)}; "
            f'echo "{_EXITED} $?"; exec sleep 3600'
        )
        subprocess.run(
            ["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-s", name,
             "-x", str(width), "-y", str(height), command],
            check=True,
        )  # fmt: skip
        return cls(socket, name)

    def _tmux(self, *args: str, check: bool = True) -> str:
        return subprocess.run(
            ["tmux", "-S", str(self.socket), *args],
            check=check,
            capture_output=True,
            text=True,
        ).stdout

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", self.name, "-l", text)

    def press(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def screen(self, history: bool = True) -> str:
        """The pane's text (with its scrollback when `history`), trailing blanks trimmed."""
        extra = ["-S", "-2000"] if history else []
        text = self._tmux("capture-pane", "-p", "-t", self.name, *extra, check=False)
        return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")

    def wait_for(self, pattern: str, timeout: float = 20.0, *, after: int = 0) -> str:
        """Poll the pane until `pattern` (a regex) appears after the first `after` characters;
        the screen then. Fails with the screen when it never does."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if re.search(pattern, screen[after:]):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} never appeared; the screen:\n{screen}")

    def pid(self) -> int | None:
        """The command's pid (the child of the pane's shell), while it runs."""
        out = self._tmux("display-message", "-p", "-t", self.name, "#{pane_pid}", check=False)
        if not out.strip().isdigit():
            return None
        children = Path(f"/proc/{out.strip()}/task/{out.strip()}/children")
        try:
            pids = children.read_text().split()
        except OSError:
            return None
        return int(pids[0]) if pids and pids[0].isdigit() else None

    def wait_exit(self, timeout: float = 60.0) -> int:
        """The command's exit status, once the shell around it has printed it."""
        screen = self.wait_for(re.escape(_EXITED) + r" \d+", timeout)
        return int(screen.rsplit(_EXITED, 1)[1].split()[0])

    def close(self) -> None:
        self._tmux("kill-server", check=False)


def _exportable(key: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key))
