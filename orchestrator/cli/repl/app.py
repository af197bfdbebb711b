"""The interactive session: `warren` at a terminal.

One `Session` per conversation; the REPL reads a prompt, runs it, shows it running, and
reads the next. `/clear`, `/resume` and `/model` open another session (the old one closes its
parts first). While a turn runs, Esc or Ctrl-C interrupts it (the same interruption results
and resumable transcript as Ctrl-C in a headless run); at an empty prompt Ctrl-C twice or
Ctrl-D exits. SIGTERM and SIGHUP interrupt the turn and end the REPL. On the way out the
session id is printed with the command that resumes it.

Threads: prompt_toolkit's prompt and the dialogs' key reads run in worker threads (their
asyncio loop cannot run under trio); everything else, the Esc watcher and all drawing
included, happens in the trio thread (no thread wakes on a timer while a turn runs: each wake
would take the GIL from the loop): the display's sinks only hand events over and
`TurnView.animate` draws once the run is idle (`orchestrator.idle`), so a draw never stands
between a tool result and the next model request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import signal
import sys
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import structlog
import trio
from rich.console import Console
from rich.text import Text

from orchestrator.agents.types import SubagentUpdate
from orchestrator.calls.permissions import Asker
from orchestrator.calls.policy import SessionPolicy
from orchestrator.cli.repl.actions import Action, Exit, Reopen, ToolOutput
from orchestrator.cli.repl.commands import (
    COMMANDS,
    mcp_prompt_commands,
    mcp_prompt_usage,
    run_command,
)
from orchestrator.cli.repl.dialog import DialogAsker
from orchestrator.cli.repl.display import TurnView
from orchestrator.cli.repl.input import (
    CTRL_C,
    CTRL_D,
    ReplCompleter,
    history_file,
    make_prompt,
    prompt_line,
    read_key,
)
from orchestrator.cli.repl.keys import KeyWatcher
from orchestrator.conversation.loop import RunResult
from orchestrator.errors import ConfigError
from orchestrator.events import Event, ToolFinished, ToolResultsMessage, ToolStarted
from orchestrator.messages import ToolResultBlock
from orchestrator.outcome import EXIT_USAGE
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.session.session import Session
from orchestrator.text import escape_controls

__all__ = ["Repl", "run_repl", "with_mentions"]

_MENTION = re.compile(r"(?<!\S)@(\S+)")
T = TypeVar("T")


class _Discard(io.StringIO):
    """The headless printer's stdout: the REPL draws the run itself."""

    def write(self, text: str) -> int:
        return len(text)


@dataclass
class Repl:
    config: SessionConfig
    parts: SessionParts
    console: Console
    dirs: WarrenDirs
    session: Session | None = None
    view: TurnView | None = None
    watcher: KeyWatcher | None = None
    session_ids: list[str] = field(default_factory=list)
    _ctrl_c_armed: bool = False
    _stop_signal: int | None = None
    _scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    _turn_running: bool = False
    _typeahead: str = ""
    """Keys typed while a turn ran: the next prompt starts with them (a line ended with
    Enter is sent as it is)."""
    outputs: list[ToolOutput] = field(default_factory=list)
    """The main agent's tool results of this REPL, numbered from 1 (`/expand N`)."""
    _shown: dict[str, str] = field(default_factory=dict)
    _numbers: dict[str, int] = field(default_factory=dict)

    @property
    def fd(self) -> int:
        return sys.stdin.fileno()

    # -- the outer loop --

    async def main(self, first_prompt: str | None) -> int:
        completer = ReplCompleter(
            {name: c.summary for name, c in COMMANDS.items()},
            self.config.cwd,
            mcp_prompts=self._mcp_prompts,
            mcp_resources=self._mcp_resources,
        )
        self.prompt = make_prompt(
            history_file(self.dirs.state, self.config.cwd.resolve()), completer
        )
        code = 0
        saved = _terminal_mode(self.fd)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._watch_signals)
                try:
                    with self._scope:
                        code = await self._sessions(first_prompt)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            if saved is not None:  # as it was: turns leave it without echo for the prompt
                with contextlib.suppress(termios.error):
                    termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        if self._stop_signal is not None:
            code = 128 + self._stop_signal
        if self.session_ids:
            last = self.session_ids[-1]
            self.console.print(
                Text.assemble(
                    ("Session ", "dim"), (last, "bold"), ("  resume it with: ", "dim"),
                    (f"warren --resume {last}", "bold"),
                )
            )  # fmt: skip
        return code

    async def _sessions(self, first_prompt: str | None) -> int:
        config, pending, opened = self.config, first_prompt, False
        while True:
            try:
                async with open_session(config, self._parts()) as session:
                    opened = True
                    self.session = session
                    self.config = config
                    if session.session_id not in self.session_ids:
                        self.session_ids.append(session.session_id)
                    self._banner(session)
                    session.start_mcp()  # the user is typing: nothing to keep them off
                    session.start_parts()
                    action = await self._loop(session, pending)
            except ConfigError as exc:
                self.console.print(Text(f"warren: {escape_controls(str(exc))}", "red"))
                if not opened:
                    return EXIT_USAGE
                config = self.config  # the one that worked
                continue
            finally:
                self.session = None
            pending = None
            match action:
                case Exit():
                    return 0
                case Reopen(config=new, note=note, between=between):
                    if note:
                        self.console.print(Text(note, "dim"))
                    if between is not None:
                        report = await trio.to_thread.run_sync(between)
                        self.console.print(Text(escape_controls(report, keep_lines=True)))
                    config = new

    def _mcp_prompts(self) -> dict[str, str]:
        found = mcp_prompt_commands(self.session)
        return {
            name: escape_controls(mcp_prompt_usage(name, prompt).removeprefix(f"/{name}").strip())
            for name, (_, prompt) in found.items()
        }

    def _mcp_resources(self) -> dict[str, str]:
        servers = None if self.session is None else self.session.mcp
        if servers is None:
            return {}
        return {
            f"{server}:{resource.uri}": escape_controls(resource.description or resource.name)
            for server, resource in servers.resources()
        }

    def _parts(self) -> SessionParts:
        return dataclasses.replace(
            self.parts,
            stdout=_Discard(),
            extra_sinks=(*self.parts.extra_sinks, self._on_event),
            on_subagent=self._on_subagent,
            asker=self._asker,
        )

    def _banner(self, session: Session) -> None:
        policy = session.policy
        floor = "sandbox proven" if policy.engine.floor_proven else "NO SANDBOX"
        line = Text("✻ Warren", "bold magenta")
        line.append(
            f"  {session.model.model} · {escape_controls(str(session.config.cwd))} · "
            f"mode {policy.mode} · {floor}",
            style="dim",
        )
        self.console.print(line)
        if policy.effective.trust in ("untrusted", "changed"):
            self.console.print(
                Text(
                    "This repository is not trusted: its allow rules, hooks and agents are off "
                    "(its deny and ask rules apply). Review with /policy, then `warren trust`.",
                    "yellow",
                )
            )
        if session.history:
            self.console.print(
                Text(f"Resumed {len(session.history)} messages of {session.session_id}.", "dim")
            )
        self.console.print(Text("/help for commands · esc interrupts · ctrl-d exits", "dim"))

    async def _loop(self, session: Session, pending: str | None) -> Action:
        while True:
            if pending is not None:
                text, pending = pending, None
                self.console.print(Text.assemble(("> ", "bold"), escape_controls(text)))
            elif "\r" in self._typeahead or "\n" in self._typeahead:
                line, _, rest = self._typeahead.replace("\r", "\n").partition("\n")
                self._typeahead = rest
                text = line
                self.console.print(Text.assemble(("> ", "bold"), escape_controls(text)))
            else:
                default, self._typeahead = self._typeahead, ""
                typed = await prompt_line(
                    self.prompt,
                    [("bold", "> ")],
                    default=default,
                    bottom_toolbar=self._tasks_line,
                    refresh_interval=1.0,
                )
                if typed == CTRL_D:
                    return Exit()
                if typed == CTRL_C:
                    if self._ctrl_c_armed:
                        return Exit()
                    self._ctrl_c_armed = True
                    self.console.print(Text("(press Ctrl-C again to exit)", "dim"))
                    continue
                text = typed
            self._ctrl_c_armed = False
            if not text.strip():
                continue
            if text.startswith("/"):
                action = await run_command(self, session, text)
                if action is not None:
                    return action
            elif text.startswith("!"):
                await self.shell(session, text[1:].strip())
            else:
                run = partial(session.run, with_mentions(text, session.config.cwd.resolve()))
                self.show_result(await self.turn(run))
            if self._stop_signal is not None:
                return Exit()

    def _tasks_line(self) -> str | None:
        """The running background tasks in one line, for the prompt's toolbar (read from
        the prompt's thread: a listing that changed meanwhile is skipped once) and the
        turn's panel."""
        from orchestrator.tasks.view import running_line

        tasks = self.session.tasks if self.session is not None else None
        if tasks is None:
            return None
        try:
            return running_line(tasks.tasks())
        except RuntimeError:  # the registry changed while the other thread listed it
            return None

    # -- turns --

    async def turn(self, work: Callable[[], Awaitable[T]], status: str = "Thinking") -> T:
        """Run `work` with the live display and Esc watching."""
        view = TurnView(self.console, status=status, tasks_line=self._tasks_line)
        self.view = view
        self.watcher = KeyWatcher(self.fd, self.interrupt, on_typed=view.echo)
        self._turn_running = True
        try:
            view.start()
            self.watcher.resume()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(view.animate)
                nursery.start_soon(self.watcher.watch)
                result = await work()
                nursery.cancel_scope.cancel()
        finally:
            self._turn_running = False
            # Echo stays off until the prompt takes the terminal: a key typed in between is
            # read by the prompt, not echoed by the terminal where the display draws.
            self.watcher.pause(keep_mode=True)
            self._typeahead += self.watcher.take_typed()
            view.finish()
            view.stop()
            self.view = None
            self.watcher = None
        return result

    def interrupt(self) -> None:
        """Esc or Ctrl-C during a turn."""
        if self.session is not None:
            self.session.interrupt()
        if self.view is not None:
            self.view.interrupting = True

    def show_result(self, result: RunResult) -> None:
        match result.reason:
            case "completed":
                return
            case "interrupted":
                self.console.print(
                    Text("⏹ Interrupted. The conversation is kept: say what to do next.", "yellow")
                )
            case reason:
                said = escape_controls(result.result, keep_lines=True)
                self.console.print(Text(f"run ended: {reason}: {said}", "red"))

    async def shell(self, session: Session, command: str) -> None:
        """`!command`: run in the read-write tool host; its output joins the conversation."""
        if not command:
            self.console.print(Text("usage: !COMMAND (runs it in the workspace's shell)", "dim"))
            return
        result = await self.turn(lambda: session.shell(command), status="Running")
        content = result.content
        output = content if isinstance(content, str) else "\n".join(
            getattr(block, "text", "") for block in content
        )  # fmt: skip
        self.console.print(Text(escape_controls(output, keep_lines=True).rstrip() or "(no output)"))

    # -- parts the session calls --

    def _on_event(self, event: Event) -> None:
        match event:
            case ToolStarted(tool_use_id=use_id, display=display):
                self._shown[use_id] = display
            case ToolFinished(tool_use_id=use_id):
                display = self._shown.pop(use_id, event.tool)
                self.outputs.append(ToolOutput(display, event.is_error, event.summary))
                self._numbers[use_id] = len(self.outputs)
                if self.view is not None:
                    self.view.numbers[use_id] = len(self.outputs)
            case ToolResultsMessage(message=message) if isinstance(message.content, list):
                for block in message.content:
                    if isinstance(block, ToolResultBlock) and block.tool_use_id in self._numbers:
                        output = self.outputs[self._numbers.pop(block.tool_use_id) - 1]
                        output.text = block.text()
            case _:
                pass
        if self.view is not None:
            self.view(event)

    def _on_subagent(self, update: SubagentUpdate) -> None:
        if self.view is not None:
            self.view.subagent(update)

    def _asker(self, policy: SessionPolicy, notify: Callable[[str], Awaitable[object]]) -> Asker:
        async def reason(message: str) -> str:
            from prompt_toolkit import PromptSession

            typed = await prompt_line(PromptSession(), message)
            return "" if typed in (CTRL_C, CTRL_D) else typed

        return DialogAsker(
            policy,
            self.console,
            pause=self._paused,
            interrupt=self.interrupt,
            read_key=lambda allowed: read_key(self.fd, allowed),
            read_line=reason,
            notify=notify,
        )

    @asynccontextmanager
    async def _paused(self) -> AsyncIterator[None]:
        """The terminal for a dialog: the live area cleared, the Esc watcher stopped."""
        view, watcher = self.view, self.watcher
        if view is not None:
            view.pause()
        if watcher is not None:
            watcher.pause(keep_mode=True)
        try:
            yield
        finally:
            if watcher is not None and self.watcher is watcher:
                watcher.resume()
            if view is not None and self.view is view:
                view.start()

    async def _watch_signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGINT and self._stop_signal is None:
                    if self._turn_running:
                        self.interrupt()
                        continue
                    # Ctrl-C between two prompts (the terminal briefly in cooked mode): as
                    # at the prompt, the second in a row exits.
                    if not self._ctrl_c_armed:
                        self._ctrl_c_armed = True
                        self.console.print(Text("(press Ctrl-C again to exit)", "dim"))
                        continue
                    self._scope.cancel()
                    continue
                if self._stop_signal is None and self._turn_running:
                    self._stop_signal = signum
                    self.interrupt()
                    continue
                self._stop_signal = self._stop_signal or signum
                self._scope.cancel()


def with_mentions(text: str, root: Path) -> str:
    """The prompt with its `@path` mentions (relative to `root`, the workspace) named as
    absolute paths for the model, which reads them with its tools: the coordinator does not
    read the workspace itself."""
    found: list[str] = []
    for mention in _MENTION.findall(text):
        path = Path(mention) if mention.startswith("/") else root / mention
        if path.exists() and str(path) not in found:
            found.append(str(path))
    if not found:
        return text
    return text + "\n\n(Files the user mentioned: " + ", ".join(found) + ")"


async def run_repl(config: SessionConfig, first_prompt: str | None, parts: SessionParts) -> int:
    """The interactive session until the user leaves; the process exit code.

    **Errors:** none: a failure no part turned into a value is one line and exit 1 (its
    traceback goes to the session's log file, never to the terminal).
    """
    console = Console(highlight=False)
    repl = Repl(config, parts, console, parts.dirs or WarrenDirs.from_env())
    try:
        return await repl.main(first_prompt)
    except Exception as exc:
        structlog.get_logger().exception("the interactive session failed")
        failure = _first_failure(exc)
        console.print(
            Text(f"warren: the session failed: {type(failure).__name__}: {failure}", "red")
        )
        if repl.session_ids:
            console.print(Text(f"resume it with: warren --resume {repl.session_ids[-1]}"))
        return 1


def _terminal_mode(fd: int) -> list[Any] | None:
    try:
        return termios.tcgetattr(fd)
    except (termios.error, OSError):
        return None  # not a terminal


def _first_failure(exc: BaseException) -> BaseException:
    """The first error a group of errors (from the parts' nurseries) holds."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
