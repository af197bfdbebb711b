"""What a running turn looks like: finished things printed once, a live area for the rest.

Printed above, in order: the assistant's text (rendered as Markdown once its block is done),
each tool call as one line with its status and duration (its result folded to a first line
and a count, `/expand N` showing it whole), denials, retries, compactions, and the one-line
summary of a batch of subagents. Below, redrawn ten times a second until the turn ends: the
text still streaming, the calls still running, one row per running subagent, a spinner with
the elapsed time and the tokens so far, and what the user types ahead. Everything shown that
a model, a tool or a repository wrote is escaped (`escape_controls`) and never read as rich
markup.

All of it runs in the trio thread, the one that streams the main agent's replies and forwards
every subagent's model requests, so display work is kept off the loop's path: the sinks only
hand events over (a deque append, `__call__` and `subagent`); `animate` applies them, renders
(Markdown included) and draws (queued lines and the live area together, one terminal write)
ten times a second, and at once for a key typed ahead (its echo), each time only once the run
is idle (`orchestrator.idle`: every task waits on the network, a tool or a worker), so never
between a reply and the next request. Rows are plain segments (`orchestrator.cli.columns`), one
spinner frame for all: a draw with ten subagent rows costs about a millisecond where rich's
Table and Spinners cost tens (tests/bench/bench_repl.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.text import Text

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentFinished,
    SubagentOutcome,
    SubagentStarted,
    SubagentUpdate,
)
from orchestrator.cli.columns import Columns
from orchestrator.events import (
    AssistantTurn,
    CompactBoundary,
    Event,
    HookRan,
    PermissionDecided,
    RetryScheduled,
    TaskChanged,
    TextStreamed,
    ToolFinished,
    ToolStarted,
)
from orchestrator.idle import until_idle
from orchestrator.text import duration, escape_controls

__all__ = ["TurnView", "human_tokens", "tool_line"]

_REFRESH_S = 0.1
"""How often the live area is redrawn (the spinner and the elapsed times move)."""
_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
"""The spinner's frames (rich's "dots"), 12.5 a second."""
_TEXT_TAIL_LINES = 12
"""Lines of a still-streaming text block shown in the live area."""


def human_tokens(count: int) -> str:
    return f"{count / 1000:.1f}k" if count >= 1000 else str(count)


def tool_line(
    display: str, summary: str, *, is_error: bool, duration_s: float, number: int | None = None
) -> Text:
    """One finished tool call: mark, the call, its duration; the summary folded under it,
    with the command that shows the whole result (`/expand N`) when it has a number."""
    line = Text()
    line.append("✗ " if is_error else "✓ ", style="red" if is_error else "green")
    line.append(escape_controls(display), style="bold")
    line.append(f"  {duration(duration_s)}", style="dim")
    first = escape_controls(summary.split("\n")[0])[:200]
    if first:
        line.append("\n  ⎿ ")
        line.append(first, style="red" if is_error else "dim")
    if number is not None:
        line.append(f"  (/expand {number})", style="dim italic")
    return line


@dataclass
class _Running:
    display: str
    started: float


@dataclass
class _AgentRow:
    agent_id: str
    description: str
    started: float
    tool: str = ""
    turns: int = 0
    tokens: int = 0
    pid: int | None = None


@dataclass
class TurnView:
    """The display of one turn (a prompt, a `/compact`, a `!command`): `with view.live():`
    around it, the sinks fed with its events."""

    console: Console
    status: str = "Thinking"
    _started: float = field(default_factory=time.monotonic)
    _text: list[str] = field(default_factory=list)
    _streamed: bool = False
    _running: dict[str, _Running] = field(default_factory=dict)
    _agents: dict[str, _AgentRow] = field(default_factory=dict)
    _agents_done: list[tuple[_AgentRow, SubagentOutcome]] = field(default_factory=list)
    _output_tokens: int = 0
    _stream_chars: int = 0
    _live: Live | None = None
    _paused: bool = False
    """A dialog has the terminal (`pause`)."""
    _queued: list[RenderableType | Callable[[], RenderableType]] = field(default_factory=list)
    _echo: trio.Event = field(default_factory=trio.Event)
    _inbox: deque[Event | SubagentUpdate] = field(default_factory=deque)
    """Events handed over by the sinks, applied at the next draw."""
    idle_wait_s: float = 0.5
    """The longest a draw waits for the run to be idle (`orchestrator.idle`), in seconds: a
    run never idle that long is drawn anyway."""
    interrupting: bool = False
    typed: str = ""
    """Keys typed ahead while the turn runs (the next prompt starts with them)."""
    numbers: dict[str, int] = field(default_factory=dict)
    """The `/expand` number of each finished call (by tool_use id), which its line shows."""
    tasks_line: Callable[[], str | None] | None = None
    """The background tasks' line of the panel (`orchestrator.tasks.view.running_line`)."""

    # -- lifecycle --

    def start(self) -> None:
        self._paused = False
        if self._live is None:
            self._live = Live(
                self,
                console=self.console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def stop(self) -> None:
        """Print what is queued and take the live area down (the turn's end): later prints
        are drawn at once."""
        self._paused = False
        self.redraw()
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def pause(self) -> None:
        """Print what is queued and take the live area down for a dialog, drawing nothing
        more (no event's line, no redraw) until `start()`: nothing is written into the dialog,
        and what the other agents report meanwhile is drawn after it."""
        self.stop()
        self._paused = True

    def finish(self) -> None:
        """The turn is over: what still streamed is printed, calls still running (an
        interrupted turn) are shown stopped, subagents still listed are summarised."""
        self._apply()
        self._flush_text()
        now = time.monotonic()
        for running in self._running.values():
            line = Text("⏹ ", "yellow")
            line.append(escape_controls(running.display), style="bold")
            line.append(f"  stopped after {duration(now - running.started)}", style="dim")
            self.print(line)
        self._running.clear()
        self._summarise_agents()
        if self._agents:
            line = Text(f"⏹ {len(self._agents)} subagents stopped", "yellow")
            self.print(line)
            self._agents.clear()
        self.typed = ""

    async def animate(self) -> None:
        """Draw until cancelled: every `_REFRESH_S`, and at once when a key is typed ahead;
        each time once the run is idle (`orchestrator.idle`)."""
        while True:
            with trio.move_on_after(_REFRESH_S):
                await self._echo.wait()
            self._echo = trio.Event()
            await until_idle(self.idle_wait_s)
            self.redraw()

    def redraw(self) -> None:
        """Print the queued lines above the live area and draw it (one write), or just draw
        it; the queued lines alone while it is down; nothing during a dialog (`pause`). The
        events handed over are applied first."""
        if self._paused:
            return
        self._apply()
        queued, self._queued = self._queued, []
        shown = [item() if callable(item) else item for item in queued]
        if shown:
            self.console.print(Group(*shown))  # the live area is drawn below, same write
        elif self._live is not None:
            self._live.refresh()

    def print(self, renderable: RenderableType | Callable[[], RenderableType]) -> None:
        """Print above the live area at its next draw (at once when it is down). A callable
        is rendered then, not now (Markdown parsing stays off the loop's path)."""
        self._queued.append(renderable)
        if self._live is None and not self._paused:
            self.redraw()

    def echo(self, typed: str) -> None:
        """What the user has typed ahead so far: shown under the spinner, drawn at once."""
        self.typed = typed
        self._echo.set()

    # -- the sinks: a hand-off, applied at the next draw --

    def __call__(self, event: Event) -> None:
        """The main agent's event: kept for the next draw (at once while the live area is
        down before or after the turn; not during a dialog)."""
        self._inbox.append(event)
        if self._live is None and not self._paused:
            self.redraw()

    def subagent(self, update: SubagentUpdate) -> None:
        """A subagent's update, as `__call__`."""
        self._inbox.append(update)
        if self._live is None and not self._paused:
            self.redraw()

    def _apply(self) -> None:
        inbox = self._inbox
        while inbox:  # popped one by one: a print below may redraw (the area down) and apply
            item = inbox.popleft()
            if isinstance(item, SubagentStarted | SubagentEvent | SubagentFinished):
                self._on_subagent(item)
            else:
                self._on_event(item)

    # -- the main agent's events --

    def _on_event(self, event: Event) -> None:
        match event:
            case TextStreamed(text=text):
                self._text.append(text)
                self._streamed = True
                self._stream_chars += len(text)
            case AssistantTurn(turn=turn):
                if not self._streamed and turn.message.text():
                    self._text.append(turn.message.text())
                self._flush_text()
                self._streamed = False
                self._output_tokens += turn.usage.output_tokens
                self._stream_chars = 0
            case ToolStarted(tool_use_id=use_id, display=display):
                self._flush_text()  # the text before a call is complete when it starts
                self._running[use_id] = _Running(display, time.monotonic())
            case ToolFinished(tool_use_id=use_id, summary=summary, is_error=error, duration_s=d):
                running = self._running.pop(use_id, None)
                shown = running.display if running is not None else event.tool
                number = self.numbers.pop(use_id, None)
                self.print(tool_line(shown, summary, is_error=error, duration_s=d, number=number))
                self._summarise_agents()
            case PermissionDecided(decision="deny", answered_by="policy" | "hook") as decided:
                first = escape_controls((decided.message or "").split("\n")[0])[:200]
                self.print(Text(f"⊘ {escape_controls(decided.tool)} denied: {first}", "yellow"))
            case RetryScheduled(attempt=attempt, delay_s=delay, error=error):
                self._text.clear()  # the stream restarts
                self._streamed = False
                self.print(
                    Text(f"↻ retry {attempt} in {delay:.1f} s: {escape_controls(error)}", "yellow")
                )
            case CompactBoundary(trigger=trigger, pre_tokens=pre, post_tokens=post):
                how = "summarised" if event.summarised else "old tool results cleared"
                self.print(
                    Text(f"⋯ context compacted ({trigger}, {how}): ~{pre:,} → ~{post:,} tokens")
                )
            case TaskChanged(phase="ended", kind="shell" | "monitor") if event.status != "stopped":
                mark, style = ("✓", "green") if event.status == "completed" else ("✗", "red")
                self.print(
                    Text(f"{mark} {event.task_id}: {escape_controls(event.summary)[:200]}", style)
                )
            case HookRan(error=error) if error is not None:
                self.print(
                    Text(
                        f"hook {escape_controls(event.hook_event)} "
                        f"{escape_controls(event.command[:100])} failed: "
                        f"{escape_controls(error.split(chr(10))[0])[:200]}",
                        "yellow",
                    )
                )
            case _:
                pass

    def _flush_text(self) -> None:
        text = "".join(self._text).strip()
        self._text.clear()
        if text:
            self.print(Text(""))
            self.print(lambda: Markdown(escape_controls(text, keep_lines=True)))

    # -- subagents --

    def _on_subagent(self, update: SubagentUpdate) -> None:
        match update:
            case SubagentStarted(agent_id=agent_id, description=description):
                self._agents[agent_id] = _AgentRow(agent_id, description, time.monotonic())
            case SubagentEvent(agent_id=agent_id, event=event):
                row = self._agents.get(agent_id)
                if row is None:
                    return
                row.pid = update.worker_pid or row.pid
                match event:
                    case ToolStarted(display=display):
                        row.tool = display
                    case ToolFinished():
                        row.tool = ""
                    case AssistantTurn(turn=turn):
                        row.turns += 1
                        row.tokens += turn.usage.output_tokens + turn.usage.input_tokens
                    case _:
                        pass
            case SubagentFinished(outcome=outcome):
                row = self._agents.pop(outcome.agent_id, None)
                if row is None:
                    return
                row.pid = outcome.worker_pid
                self._agents_done.append((row, outcome))

    def _summarise_agents(self) -> None:
        """Once no subagent runs, the finished ones fold into one line (after the tool line
        of the last dispatch_agent call, so it reads as the batch's conclusion)."""
        if self._agents_done and not self._agents:
            self.print(_agents_summary(self._agents_done))
            self._agents_done = []

    # -- the live area --

    def __rich__(self) -> RenderableType:
        now = time.monotonic()
        parts: list[RenderableType] = []
        tail = "".join(self._text)
        if tail.strip():
            lines = escape_controls(tail, keep_lines=True).splitlines()[-_TEXT_TAIL_LINES:]
            parts.append(Text("\n".join(lines)))
        frame = _FRAMES[int(now * 12.5) % len(_FRAMES)]
        if self._running:  # one spinner frame for all: a rich Spinner each costs milliseconds
            rows = [
                (
                    (frame, "cyan"),
                    escape_controls(r.display) + " ",
                    (duration(now - r.started), "dim"),
                )
                for r in list(self._running.values())
            ]
            parts.append(Columns((), rows))
        if self._agents:
            parts.append(_agents_rows(self._agents.values(), now))
        line = self.tasks_line() if self.tasks_line is not None else None
        if line:
            parts.append(Text(f"⚙ {line}", "dim", no_wrap=True, overflow="ellipsis"))
        tokens = self._output_tokens + self._stream_chars // 4
        what = "Interrupting" if self.interrupting else self.status
        status = Text(f" {what}… ", style="bold")
        status.append(f"{duration(now - self._started)}", style="dim")
        if tokens:
            status.append(f" · ↓ {human_tokens(tokens)} tokens", style="dim")
        status.append(" · esc to interrupt", style="dim")
        parts.append(Text.assemble((frame, "magenta"), status, no_wrap=True, overflow="ellipsis"))
        if self.typed:
            ahead = escape_controls(self.typed.replace("\r", "\n").replace("\n", " ⏎ "))
            parts.append(Text.assemble(("> ", "bold"), ahead[-(self.console.width - 4) :]))
        return Group(*parts)


def _agents_rows(rows: Iterable[_AgentRow], now: float) -> Columns:
    return Columns(
        ("agent", "task", "tool", "turns", "tokens", "time", "pid"),
        [
            (
                (row.agent_id.removeprefix("agent-")[:8], "cyan"),
                escape_controls(row.description)[:40],
                (escape_controls(row.tool)[:40] or "thinking…", "dim"),
                str(row.turns),
                human_tokens(row.tokens),
                duration(now - row.started),
                "" if row.pid is None else str(row.pid),
            )
            for row in rows
        ],
    )


def _agents_summary(done: list[tuple[_AgentRow, SubagentOutcome]]) -> Text:
    """A finished batch of subagents folded into one line (each with its worker's pid)."""
    reasons: dict[str, int] = {}
    for _, outcome in done:
        reasons[outcome.reason] = reasons.get(outcome.reason, 0) + 1
    turns = sum(o.num_turns for _, o in done)
    tokens = sum(o.usage.input_tokens + o.usage.output_tokens for _, o in done)
    longest = max(o.duration_s for _, o in done)
    said = ", ".join(f"{count} {reason}" for reason, count in reasons.items())
    pids = " ".join(str(o.worker_pid) for _, o in done if o.worker_pid is not None)
    line = Text("◆ ", style="cyan")
    noun = "subagent" if len(done) == 1 else "subagents"
    line.append(f"{len(done)} {noun} done ({said})", style="bold")
    line.append(
        f" · {turns} turns · {human_tokens(tokens)} tokens · {duration(longest)}"
        + (f" · workers {pids}" if pids else ""),
        style="dim",
    )
    return line
