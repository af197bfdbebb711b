"""What a slash command hands back to the REPL, and what a command may use of it.

`orchestrator/cli/repl/commands.py` runs a command against a `CommandHost` (the `Repl` of
app.py is one) and returns an `Action` or None; app.py acts on it. Kept apart from both so
that neither imports the other's module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.conversation.loop import RunResult
    from orchestrator.session.config import SessionConfig, SessionParts

__all__ = ["Action", "CommandHost", "Exit", "Reopen", "ToolOutput"]

T = TypeVar("T")


@dataclass(frozen=True)
class Exit:
    """Leave the REPL."""


@dataclass(frozen=True)
class Reopen:
    """Close this session and open one with `config` (`/clear`, `/resume`, `/model`)."""

    config: SessionConfig
    note: str = ""
    between: Callable[[], str] | None = None
    """Work done while no session is open, its report printed: writes into a protected path
    such as `.warren/` (`/init`), which a running writable sandbox's guard would undo."""


Action = Exit | Reopen


@dataclass
class ToolOutput:
    """A finished tool call of the main agent as `/expand N` shows it: whole."""

    display: str
    is_error: bool
    text: str


class CommandHost(Protocol):
    """The REPL as a slash command sees it."""

    console: Console
    parts: SessionParts
    outputs: list[ToolOutput]
    """The main agent's tool results of this REPL, numbered from 1 (`/expand N`)."""

    async def turn(self, work: Callable[[], Awaitable[T]], status: str = "Thinking") -> T:
        """Run `work` as a turn: shown running, interruptible with Esc or Ctrl-C."""
        ...

    def show_result(self, result: RunResult) -> None:
        """Show a finished run as a turn's end is shown."""
        ...
