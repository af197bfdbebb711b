"""The live displays never stand between a reply and the next request (issue 13's benchmark
goal, `orchestrator.idle`): pinned by order, not by timing.

A session runs against the fake Messages API with a display as its sink (the REPL's
`TurnView`, `-p`'s `TerminalProgress`) drawing on a terminal whose write of the tool's line
blocks until the API holds the next request, as a display stuck in a slow draw would. The
loop's own work before that request is made a quarter of a second of runnable steps (longer
than the displays' refresh period; their longest wait for an idle run made longer than the
test): a draw paced by time alone, or one made inside a sink, would fall in it and hold the
request back, so the write would give up waiting and the test fails.
"""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
from rich.console import Console

from orchestrator import idle
from orchestrator.agents.types import SubagentStarted
from orchestrator.aio import closing_iter
from orchestrator.cli.live_progress import TerminalProgress
from orchestrator.cli.repl.display import TurnView
from orchestrator.events import RetryScheduled, ToolFinished, ToolStarted
from orchestrator.model.base import ModelClient, ModelEvent, ModelRequest
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from tests.kit.fake_api import FakeMessagesAPI, Reply, model_for

_HELD_UP_TO_S = 10.0
"""How long the stuck write waits for the next request before it gives up (a failure)."""


class HeldTerminal(io.StringIO):
    """A terminal whose first write of the tool's line waits for the API's second request."""

    def __init__(self, api: FakeMessagesAPI) -> None:
        super().__init__()
        self.api = api
        self.next_request_came: bool | None = None
        """Whether the next request reached the API while the line's write waited (None: the
        line was never drawn)."""

    def write(self, text: str) -> int:
        if self.next_request_came is None and "No such tool" in text:
            deadline = time.monotonic() + _HELD_UP_TO_S
            while len(self.api.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)  # the trio thread held, as by a slow draw
            self.next_request_came = len(self.api.requests) >= 2
        return super().write(text)


@dataclass
class SlowToAsk:
    """The model, with the loop's work before each later request made long: a quarter of a
    second of runnable steps, never blocked (as building a large request would be)."""

    inner: ModelClient
    calls: int = 0

    @property
    def model(self) -> str:
        return self.inner.model

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.calls += 1
        if self.calls > 1:
            until = time.monotonic() + 0.25
            while time.monotonic() < until:
                await trio.lowlevel.checkpoint()
        async with closing_iter(self.inner.stream(request)) as events:
            async for event in events:
                yield event

    async def aclose(self) -> None:
        await self.inner.aclose()


Shown = tuple[TurnView | TerminalProgress, Callable[[], Awaitable[None]], Callable[[], None]]
Display = Callable[[Console], Shown]


def _turn_view(
    console: Console,
) -> Shown:
    view = TurnView(console, idle_wait_s=_HELD_UP_TO_S)
    view.start()

    def done() -> None:
        view.finish()
        view.stop()

    return view, view.animate, done


def _terminal_progress(
    console: Console,
) -> Shown:
    progress = TerminalProgress(console, idle_wait_s=_HELD_UP_TO_S)
    progress.begin()
    return progress, progress.animate, progress.close


@pytest.mark.parametrize("display", [_turn_view, _terminal_progress], ids=["repl", "-p tty"])
async def test_the_next_request_is_sent_before_the_display_draws_the_turn(
    tmp_path: Path, display: Display
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    replies = [
        Reply(content=[{"type": "text", "text": "Looking."},
                       {"type": "tool_use", "name": "NoSuchTool", "input": {}}]),
        Reply.text("Done."),
    ]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        terminal = HeldTerminal(api)
        console = Console(file=terminal, force_terminal=True, width=100, height=30)
        sink, animate, done = display(console)
        parts = SessionParts(
            dirs=WarrenDirs(state=tmp_path / "state", config=tmp_path / "config"),
            stdout=io.StringIO(),
            model=SlowToAsk(model_for(api)),
            extra_sinks=(sink,),
        )
        config = SessionConfig(cwd=workspace, sandbox="off")
        async with open_session(config, parts) as session, trio.open_nursery() as nursery:
            nursery.start_soon(animate)
            result = await session.run("go")
            nursery.cancel_scope.cancel()
        done()
    assert result.result == "Done."
    assert terminal.next_request_came is not None, "the tool's line was never drawn"
    assert terminal.next_request_came, (
        "the tool's line was drawn before the next request was sent: display work is on the "
        "loop's path"
    )
    assert "Done" in terminal.getvalue() or isinstance(sink, TerminalProgress)


@pytest.mark.parametrize("display", [_turn_view, _terminal_progress], ids=["repl", "-p tty"])
def test_a_sink_never_draws_while_a_draw_is_coming(display: Display) -> None:
    """The class behind the test above, without its race: whatever a sink is handed (a tool's
    start and end, a retry, a subagent's start) waits for the display's own draw, also before
    the first one (the session may report before `animate` first finds the run idle); only a
    closed display draws at once, as nothing else would."""
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=100, height=30)
    sink, _animate, done = display(console)
    written = len(terminal.getvalue())
    sink(ToolStarted(tool_use_id="t1", tool="Bash", display="Bash(make)"))
    sink(ToolFinished(tool_use_id="t1", tool="Bash", summary="ok", is_error=False, duration_s=1))
    sink(RetryScheduled(attempt=2, delay_s=1.0, error="overloaded", status=529))
    sink.subagent(SubagentStarted(agent_id="a1", agent_type="general", description="survey",
                                  transcript=None))  # fmt: skip
    assert len(terminal.getvalue()) == written, "a sink drew on the loop's path"
    done()
    assert "Bash(make)" in terminal.getvalue()  # the closing draw showed them
    written = len(terminal.getvalue())
    sink(ToolFinished(tool_use_id="t2", tool="Read", summary="late", is_error=True, duration_s=0))
    if isinstance(sink, TerminalProgress):  # the REPL's view prints the turn's end itself
        assert "late" in terminal.getvalue()[written:]


async def test_nothing_is_drawn_into_a_dialog() -> None:
    """While a dialog has the terminal (`TurnView.pause`), what the other agents report is
    neither drawn by its sink nor by the view's own draw loop; it comes after the dialog."""
    terminal = io.StringIO()
    console = Console(file=terminal, force_terminal=True, width=100, height=30)
    view = TurnView(console, idle_wait_s=0.01)
    view.start()
    view.pause()
    written = len(terminal.getvalue())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(view.animate)
        view.subagent(SubagentStarted(agent_id="a1", agent_type="general",
                                      description="survey", transcript=None))  # fmt: skip
        view(ToolFinished(tool_use_id="t1", tool="Read", summary="read 3 lines", is_error=False,
                          duration_s=0.1))  # fmt: skip
        await trio.sleep(0.3)  # three of the view's draws
        assert len(terminal.getvalue()) == written, "drawn into the dialog"
        view.start()
        await trio.sleep(0.3)
        nursery.cancel_scope.cancel()
    view.finish()
    view.stop()
    assert "read 3 lines" in terminal.getvalue()[written:]


def test_the_idle_wait_is_trios_own() -> None:
    """`orchestrator.idle` imports it from trio's core (trio.testing imports pytest)."""
    assert idle.wait_all_tasks_blocked is trio.testing.wait_all_tasks_blocked  # type: ignore[attr-defined]
