"""Permission asks at a real terminal (a pty): yes, no with a reason, and "always", which
stores a rule in the repository's local policy so the next identical call is not asked."""

from __future__ import annotations

import os
import pty
import threading
from pathlib import Path

import pytest

from orchestrator.calls.permissions import Allow, Ask, Deny
from orchestrator.calls.policy import load_session_policy
from orchestrator.calls.terminal_asker import TerminalAsker
from orchestrator.tools.bash import BashTool


class Terminal:
    """A pty whose other end answers each prompt with the next scripted line."""

    def __init__(self, answers: list[str]) -> None:
        self.master, self._slave = pty.openpty()
        self.path = Path(os.ttyname(self._slave))
        self.seen = ""
        self._answers = answers
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        answers = list(self._answers)
        while answers:
            try:
                chunk = os.read(self.master, 4096).decode()
            except OSError:
                return
            self.seen += chunk
            if chunk.rstrip().endswith(">"):
                os.write(self.master, (answers.pop(0) + "\n").encode())

    def close(self) -> None:
        self._thread.join(timeout=5)
        os.close(self._slave)
        os.close(self.master)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "repo"
    ws.mkdir()
    return ws


async def ask(workspace: Path, answers: list[str], command: str) -> tuple[Allow | Deny, str]:
    policy = load_session_policy(workspace, floor_proven=True)
    terminal = Terminal(answers)
    try:
        asker = TerminalAsker(policy, tty=terminal.path)
        tool = BashTool()
        result = await asker(tool, tool.parse_input({"command": command}), Ask("it runs a command"))
    finally:
        terminal.close()
    return result, terminal.seen


async def test_yes_allows_once(workspace: Path) -> None:
    result, seen = await ask(workspace, ["y"], "make build")
    assert isinstance(result, Allow)
    assert "allow Bash(make build)" in seen and "it runs a command" in seen


async def test_no_denies_with_the_users_reason(workspace: Path) -> None:
    result, _ = await ask(workspace, ["n", "use the staging target"], "make deploy")
    assert isinstance(result, Deny)
    assert "use the staging target" in result.message


async def test_unknown_answer_asks_again(workspace: Path) -> None:
    result, seen = await ask(workspace, ["maybe", "y"], "make build")
    assert isinstance(result, Allow)
    assert seen.count("[y] yes") == 2


async def test_always_stores_a_prefix_rule(workspace: Path) -> None:
    result, _ = await ask(workspace, ["a"], "npm run test -- --watch=false")
    assert isinstance(result, Allow)
    local = workspace / ".warren" / "policy.local.toml"
    assert "Bash(npm run test:*)" in local.read_text()
    # A new session of the same repository allows the command without asking.
    again = load_session_policy(workspace, floor_proven=True)
    decision = again.engine.decide(
        "Bash", {"command": "npm run test -- --ci"}, tool_read_only=False
    )
    assert decision.decision == "allow"


REPAINTS = [
    "ls\r\x1b[2K\x1b[1Aallow Bash(ls)? ",  # CR, erase line, cursor up: a fake clean prompt
    "ls \x1b]0;title\x07 \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\",  # OSC title, hyperlink
    "rm -rf ~ \x08\x08\x08\x08\x08\x08\x08\x08ls     ",  # backspaces over the real command
    "echo \u202egnp.exe\u202c \u2066x\u2069 \u200b",  # bidi overrides, isolates, invisible
    "echo \x9b2J \x7f \x00",  # C1 CSI, DEL, NUL
]


@pytest.mark.parametrize("command", REPAINTS)
async def test_the_command_cannot_repaint_the_prompt(workspace: Path, command: str) -> None:
    policy = load_session_policy(workspace, floor_proven=True)
    terminal = Terminal(["n", ""])
    try:
        asker = TerminalAsker(policy, tty=terminal.path)
        tool = BashTool()
        why = "because\x1b[31m it \rsaid so"
        result = await asker(tool, tool.parse_input({"command": command}), Ask(why))
    finally:
        terminal.close()
    assert isinstance(result, Deny)
    seen = terminal.seen.replace("\r\n", "\n")  # the pty's own line endings
    for char in ("\x1b", "\r", "\x07", "\x08", "\x9b", "\x7f", "\x00"):
        assert char not in seen
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in seen)
    assert "\u200b" not in seen
    assert "\\x" in seen or "\\u" in seen  # shown, visibly, instead
    assert "because\\x1b[31m it \\x0dsaid so" in seen
