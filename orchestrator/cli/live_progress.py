"""Progress of a headless run at a terminal: `warren -p` with stderr a TTY (issue 13, item 8).

A live region at the bottom of stderr shows a spinner with the elapsed time and tokens while
the model is working, the tool calls running now, and one row per running subagent (id,
description, current tool, turns, tokens, elapsed); above it, each finished tool call stays as
one line with its status and duration, each finished subagent as a one-line summary, and
retries, denials, blocked hooks and compactions as notes. Rendered by `rich` on stderr, so
colours follow `NO_COLOR` and the terminal's capabilities; the CLI uses it only when stderr is
a terminal and `--quiet` is not given (CI and pipes get nothing of it).

Every string from the model, a tool, a policy file or a server is escaped (`escape_controls`)
and handed to rich as `Text`, never as markup, so none can move the cursor or restyle a line.
The region is redrawn by `animate`, a trio task of the CLI's nursery (no thread), ten times a
second, each time once the run is idle (`orchestrator.idle`: every task waits on the network,
a tool or a worker); the sinks only hand events over (a deque append), which the next draw
applies, printing the finished lines above the region in the same write: no display work runs
inside an event or between a tool result and the next model request (tests/bench/bench_repl.py
measures it, tests/orchestrator/test_display_pace.py pins the order). It is taken down while
a permission question waits at the terminal (the question is written to `/dev/tty`, which the
redraw would overwrite), at once when the ask is reported, and put back once it is answered.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentFinished,
    SubagentStarted,
    SubagentUpdate,
)
from orchestrator.events import (
    AssistantTurn,
    CompactBoundary,
    Event,
    HookRan,
    PermissionDecided,
    RetryScheduled,
    TextStreamed,
    ToolFinished,
    ToolResultsMessage,
    ToolStarted,
)
from orchestrator.idle import until_idle
from orchestrator.messages import Usage
from orchestrator.text import duration, escape_controls

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live
    from rich.spinner import Spinner
    from rich.text import Text

__all__ = ["TerminalProgress", "stderr_console"]

_REFRESH_S = 0.1
"""How often the live region is redrawn (the spinner and elapsed times move)."""


def stderr_console() -> Console:
    """A rich console on stderr: colours as `NO_COLOR`, `TERM` and the terminal allow."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=False)


@dataclass
class _Agent:
    agent_type: str
    description: str
    started: float
    tool: str = ""
    turns: int = 0
    tokens: int = 0


@dataclass
class TerminalProgress:
    """The event sink (`__call__`, `subagent`) behind the live display; `animate` redraws."""

    console: Console
    pause_on_ask: bool = False
    """Take the region down while a question waits at the terminal (asks are answered there)."""
    clock: Callable[[], float] = time.monotonic
    idle_wait_s: float = 0.5
    """The longest a draw waits for the run to be idle (`orchestrator.idle`), in seconds: a
    run never idle that long is drawn anyway."""
    _phase: str = "starting"
    _since: float = field(default=0.0)
    _tokens: int = 0
    _running: dict[str, tuple[str, float]] = field(default_factory=dict)
    _agents: dict[str, _Agent] = field(default_factory=dict)
    _asking: set[tuple[str | None, str]] = field(default_factory=set)
    _denied: set[str] = field(default_factory=set)
    _spinner: Spinner | None = None
    _queued: list[Text] = field(default_factory=list)
    _live: Live | None = None
    _closed: bool = False
    _inbox: deque[Event | SubagentUpdate] = field(default_factory=deque)
    """Events handed over by the sinks, applied at the next draw."""

    def __post_init__(self) -> None:
        self._since = self.clock()

    # --- what the run reports ----------------------------------------------------------------

    def begin(self) -> None:
        """A prompt was sent: the model is being waited for."""
        self._set_phase("waiting for the model")

    def __call__(self, event: Event) -> None:
        """An event of the main agent: kept for the next draw. Drawn at once only for an ask
        (which takes the region down before the question is written) and once the region is
        closed (no draw is coming); before `animate` first puts the region up it waits for
        that draw like any other: a draw made here is on the loop's path."""
        self._inbox.append(event)
        if self._closed or _asks(event):
            self._redraw()

    def subagent(self, update: SubagentUpdate) -> None:
        """A subagent's start, event or end, as `__call__`."""
        self._inbox.append(update)
        if self._closed or (isinstance(update, SubagentEvent) and _asks(update.event)):
            self._redraw()

    def _apply(self) -> None:
        inbox = self._inbox
        while inbox:  # popped one by one: a pause below redraws, which applies the rest
            item = inbox.popleft()
            if isinstance(item, SubagentStarted | SubagentEvent | SubagentFinished):
                self._on_subagent(item)
            else:
                self._on_event(item)

    def _on_event(self, event: Event) -> None:
        match event:
            case TextStreamed() if self._phase != "writing":
                self._set_phase("writing")
            case AssistantTurn(turn=turn):
                self._tokens += _tokens(turn.usage)
                if turn.message.tool_uses():
                    self._set_phase("running tools")
                else:
                    self._set_phase("finishing")
            case ToolResultsMessage():
                self._set_phase("waiting for the model")
            case ToolStarted(tool_use_id=use_id, display=display):
                self._running[use_id] = (escape_controls(display), self.clock())
            case ToolFinished(tool_use_id=use_id) if use_id in self._denied:
                self._denied.discard(use_id)  # its denial is the line already
            case ToolFinished(tool_use_id=use_id, tool=tool, summary=summary, is_error=failed):
                shown, _ = self._running.pop(use_id, (escape_controls(tool), self.clock()))
                mark, style = ("x", "red") if failed else ("✓", "green")
                self._line(
                    (f"  {mark} ", style),
                    (shown, "bold"),
                    (f"  {escape_controls(summary)[:160]}", ""),
                    (f"  {duration(event.duration_s)}", "dim"),
                )
            case PermissionDecided():
                self._permission(event, None)
            case RetryScheduled(attempt=attempt, delay_s=delay, error=error):
                self._line(
                    (f"  ↻ retry {attempt} in {delay:.1f} s: ", "yellow"),
                    (escape_controls(error)[:200], ""),
                )
                self._set_phase("waiting for the model")
            case HookRan(blocked=True, error=None):
                hook = escape_controls(event.command[:120])
                self._line((f"  ■ {event.hook_event} hook blocked: ", "yellow"), (hook, ""))
            case CompactBoundary(trigger=trigger, pre_tokens=pre, post_tokens=post):
                how = "summarised" if event.summarised else "old tool results cleared"
                self._line(
                    (f"  … context compacted ({trigger}, {how}): ~{pre:,} -> ~{post:,} tokens",
                     "dim"),
                )  # fmt: skip
            case _:
                return

    def _on_subagent(self, update: SubagentUpdate) -> None:
        """A subagent's row, and a summary line when it ends."""
        match update:
            case SubagentStarted(agent_id=agent_id):
                self._agents[agent_id] = _Agent(
                    escape_controls(update.agent_type),
                    escape_controls(" ".join(update.description.split()))[:60],
                    self.clock(),
                )
            case SubagentEvent(agent_id=agent_id, event=event):
                agent = self._agents.get(agent_id)
                match event:
                    case ToolStarted(display=display) if agent is not None:
                        agent.tool = escape_controls(display)[:60]
                    case ToolFinished() if agent is not None:
                        agent.tool = ""
                    case AssistantTurn(turn=turn) if agent is not None:
                        agent.turns += 1
                        agent.tokens += _tokens(turn.usage)
                    case PermissionDecided():
                        self._permission(event, agent_id)
                    case _:
                        return
            case SubagentFinished(outcome=outcome):
                gone = self._agents.pop(outcome.agent_id, None)
                what = gone.description if gone is not None else ""
                ok = outcome.reason == "completed"
                pid = "" if outcome.worker_pid is None else f" · pid {outcome.worker_pid}"
                self._line(
                    ("  ✓ " if ok else "  x ", "green" if ok else "red"),
                    (f"{outcome.agent_id} ", "cyan"),
                    (what, "bold"),
                    (
                        f"  {outcome.reason} · {outcome.num_turns} turns · "
                        f"{_count(_tokens(outcome.usage))} tokens · "
                        f"{duration(outcome.duration_s)}{pid}",
                        "dim",
                    ),
                )
            case _:
                return

    def _permission(self, event: PermissionDecided, agent_id: str | None) -> None:
        key = (agent_id, event.tool_use_id)
        if event.decision == "ask" and event.answered_by != "asker":
            if self.pause_on_ask:
                self._asking.add(key)
                self._pause()
            return
        if event.answered_by == "asker" and key in self._asking:
            self._asking.discard(key)
        if event.decision == "deny":
            if agent_id is None:
                self._denied.add(event.tool_use_id)
            who = f"[{agent_id}] " if agent_id else ""
            first = escape_controls((event.message or "").split("\n")[0])[:160]
            self._line(
                ("  x ", "red"),
                (f"{who}{escape_controls(event.tool)} denied: ", "bold red"),
                (first, ""),
            )

    # --- drawing -----------------------------------------------------------------------------

    def _set_phase(self, phase: str) -> None:
        if phase != self._phase:
            self._phase = phase
            self._since = self.clock()

    def _line(self, *parts: tuple[str, str]) -> None:
        """A finished line: printed above the region by the draw that applies its event."""
        from rich.text import Text

        self._queued.append(Text.assemble(*parts, overflow="ellipsis", no_wrap=True))

    def render(self) -> RenderableType:
        """The live region: the spinner, running tools, subagent rows."""
        from rich.console import Group
        from rich.spinner import Spinner
        from rich.text import Text

        from orchestrator.cli.columns import Columns

        now = self.clock()
        status = Text.assemble(
            (self._phase, "bold"),
            (f" · {duration(now - self._since)}", ""),
            (f" · {_count(self._tokens)} tokens" if self._tokens else "", "dim"),
        )
        if self._spinner is None:  # one spinner, so its frames move on between redraws
            self._spinner = Spinner("dots", style="cyan")
        self._spinner.update(text=status)
        parts: list[RenderableType] = [self._spinner]
        for shown, started in list(self._running.values())[-8:]:
            parts.append(Text.assemble(("    ▸ ", "cyan"), shown, (f"  {duration(now - started)}",
                                                                   "dim")))  # fmt: skip
        if len(self._running) > 8:
            parts.append(Text(f"    … {len(self._running) - 8} more running", style="dim"))
        if self._agents:
            rows = [
                (
                    (agent_id, "cyan"),
                    agent.description,
                    (agent.tool or "thinking", "" if agent.tool else "dim"),
                    str(agent.turns),
                    _count(agent.tokens),
                    duration(now - agent.started),
                )
                for agent_id, agent in self._agents.items()
            ]
            header = ("agent", "description", "tool", "turns", "tokens", "elapsed")
            parts.append(Columns(header, rows))
        return Group(*parts)

    def _redraw(self) -> None:
        """Apply the events handed over, print the finished lines above the region and draw
        it (one write), or draw it."""
        self._apply()
        queued, self._queued = self._queued, []
        if queued:
            from rich.console import Group

            self.console.print(Group(*queued))  # the region is drawn below, same write
        elif self._live is not None:
            self._live.refresh()

    def _pause(self) -> None:
        self._redraw()
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def _resume(self) -> None:
        if self._live is not None or self._closed or self._asking:
            return
        from rich.live import Live

        self._live = Live(
            console=self.console,
            get_renderable=self.render,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=True,
        )
        self._live.start()

    async def animate(self) -> None:
        """Show the region and redraw it until cancelled; then take it down.

        **Cancellation:** the way it ends: the region is erased (what was printed above stays).
        """
        try:
            while True:
                await until_idle(self.idle_wait_s)
                self._resume()
                self._redraw()
                await trio.sleep(_REFRESH_S)
        finally:
            self.close()

    def close(self) -> None:
        """Take the region down for good (idempotent)."""
        self._closed = True
        self._pause()


def _asks(event: Event) -> bool:
    return isinstance(event, PermissionDecided) and event.decision == "ask"


def _tokens(usage: Usage) -> int:
    return (
        usage.input_tokens
        + usage.output_tokens
        + usage.cache_read_input_tokens
        + usage.cache_creation_input_tokens
    )


def _count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"
