"""A headless run from the command line: a `Session`, one prompt, signals, the exit code.

Signals all take the path of Ctrl-C: SIGINT, SIGTERM (`kill`, `timeout`) and SIGHUP (a closed
terminal) interrupt the run, which ends `interrupted` with its result line and a resumable
transcript, and every tool host, worker and sandbox is stopped on the way out; the exit code
is 128 + the signal (130, 143, 129). A second signal cancels what is left at once, still
through the shielded, bounded teardown, so nothing is left behind and nothing raises.

A closed stdout (`warren -p ... | head -1`) ends the run as SIGPIPE ends a pipeline's writer,
quietly: the run is interrupted (its transcript resumable), nothing more is written, the exit
code is 141 (128 + SIGPIPE, what `set -o pipefail` reports for `yes | head -1`).

At a terminal (stderr a TTY, no `--quiet`) the run shows its progress (`live_progress`) and
ends with the session id and the command that resumes it; without one, only an interrupted
run says its session id.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, cast

import trio

from orchestrator.agents.types import SubagentUpdate
from orchestrator.calls.denials import render_denials
from orchestrator.cli.live_progress import TerminalProgress
from orchestrator.errors import ConfigError
from orchestrator.outcome import EXIT_IO_ERROR, EXIT_USAGE, TerminalReason, exit_code
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.session.session import Session
from orchestrator.text import escape_controls

__all__ = ["EXIT_OUTPUT_CLOSED", "STOP_SIGNALS", "ClosableStdout", "run_prompt"]

EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE
"""stdout was closed by its reader (`| head`): 141, as a tool killed by SIGPIPE exits."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop a run the way Ctrl-C does."""


def say(line: str) -> None:
    """One line on stderr; a terminal that is gone (SIGHUP) cannot make this fail."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


@dataclass
class _Stopping:
    """What the signals asked for so far; `scope` is cancelled to stop at once."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    session: Session | None = None
    signal: int | None = None
    reason: TerminalReason | None = None
    """How the run ended, once it has (its result is printed by then)."""
    session_id: str | None = None
    output_closed: bool = False
    """stdout's reader went away (`ClosableStdout`)."""

    def close_output(self) -> None:
        """stdout is gone: stop the run as SIGPIPE would, without a word."""
        self.output_closed = True
        if self.session is not None:
            self.session.interrupt()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                if self.signal is None:
                    self.signal = signum
                    if self.session is not None:
                        self.session.interrupt()
                        continue
                self.scope.cancel()  # start-up, or a second signal: stop now


class ClosableStdout(io.TextIOBase):
    """stdout for the output printer: a reader that went away (EPIPE) is not an error.

    The first failed write points the descriptor at /dev/null (so no later flush, the
    interpreter's at exit included, fails) and calls `on_closed`; later writes are dropped.
    `before_write` runs before the first write (the live progress leaves a shared terminal).
    """

    def __init__(
        self,
        out: IO[str],
        on_closed: Callable[[], None],
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._out = out
        self._on_closed = on_closed
        self._before_write = before_write
        self.gone = False

    def write(self, text: str) -> int:
        if self._before_write is not None:
            before, self._before_write = self._before_write, None
            before()
        if not self.gone:
            try:
                self._out.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._out.flush()
            except BrokenPipeError:
                self._gone()

    def isatty(self) -> bool:
        return not self.gone and self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()

    def writable(self) -> bool:
        return True

    def _gone(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._out.fileno())
            os.close(devnull)
            self._out.flush()  # what the buffer still holds goes to /dev/null now
        except (OSError, ValueError):
            pass
        self._on_closed()


async def run_prompt(
    config: SessionConfig,
    prompt: str,
    parts: SessionParts,
    *,
    progress: TerminalProgress | None = None,
    show_session: bool = False,
) -> int:
    """Open a session, run `prompt`, and return the process exit code.

    `progress`: the live display on stderr (at a terminal); `show_session`: end with the
    session id and how to resume it (at a terminal; an interrupted run says it anyway).

    **Errors:** none: a configuration problem is one line and exit 2, a state directory that
    cannot be written mid-run is `io_error` (exit 8), a signal is 128 + its number, a closed
    stdout 141.
    """
    stopping = _Stopping()
    out = parts.stdout or sys.stdout
    shared = progress is not None and _is_terminal(out)  # stderr's terminal, most likely
    stdout = ClosableStdout(
        out,
        stopping.close_output,
        progress.close if progress is not None and shared else None,
    )
    parts = dataclasses.replace(parts, stdout=cast(IO[str], stdout))
    if progress is not None:
        parts = dataclasses.replace(
            parts,
            extra_sinks=(*parts.extra_sinks, progress),
            on_subagent=_both(parts.on_subagent, progress.subagent),
        )
    async with trio.open_nursery() as nursery:
        await nursery.start(stopping.watch)
        if progress is not None:
            nursery.start_soon(progress.animate)
        try:
            with stopping.scope:
                code = await _run(config, prompt, parts, stopping, progress, show_session)
                return EXIT_OUTPUT_CLOSED if stopping.output_closed else code
        except ConfigError as exc:
            say(f"warren: {escape_controls(str(exc))}")
            return EXIT_USAGE
        except (OSError, ExceptionGroup) as exc:
            # Stdout gone (a closed terminal, a closed pipe), or a part that writes state of
            # its own (the sandbox's stub registry) failing on its way out: one line.
            failure = _os_error_in(exc)
            if failure is None:
                raise
            if stopping.signal is not None:
                return 128 + stopping.signal
            if stopping.output_closed:
                return EXIT_OUTPUT_CLOSED
            what = f"{failure.strerror or failure}" + (
                f" ({failure.filename})" if failure.filename else ""
            )
            if stopping.session is None and stopping.reason is None:  # nothing ran
                say(
                    f"warren: cannot write Warren's state: {what}. Free some space, or point "
                    "XDG_STATE_HOME at a writable directory."
                )
                return EXIT_USAGE
            if stopping.reason != "io_error":  # else its line is out already
                say(f"warren: a write failed: {what}")
            return EXIT_IO_ERROR
        finally:
            nursery.cancel_scope.cancel()
            if progress is not None:
                progress.close()
            if stopping.scope.cancelled_caught:
                say("warren: interrupted")
                if stopping.session_id is not None:
                    say(_resume_line(stopping.session_id, "interrupted"))
    assert stopping.signal is not None, "only a signal cancels the run's scope"
    return 128 + stopping.signal


def _os_error_in(exc: BaseException) -> OSError | None:
    """The `OSError` an error is, or the one a group of errors (from the parts' nurseries)
    holds when it holds nothing but `OSError`s and cancellations."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found: OSError | None = None
        for inner in exc.exceptions:
            if isinstance(inner, trio.Cancelled):
                continue
            failure = _os_error_in(inner)
            if failure is None:
                return None
            found = found or failure
        return found
    return None


def _is_terminal(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _both(
    first: Callable[[SubagentUpdate], None] | None, second: Callable[[SubagentUpdate], None]
) -> Callable[[SubagentUpdate], None]:
    if first is None:
        return second

    def both(update: SubagentUpdate) -> None:
        first(update)
        second(update)

    return both


def _resume_line(session_id: str, how: str) -> str:
    return (
        f"warren: session {session_id} {how}; resume it with: "
        f"warren --resume {shlex.quote(session_id)} -p '...'"
    )


async def _run(
    config: SessionConfig,
    prompt: str,
    parts: SessionParts,
    stopping: _Stopping,
    progress: TerminalProgress | None,
    show_session: bool,
) -> int:
    async with open_session(config, parts) as session:
        if stopping.signal is not None:  # it came while the session was opening
            return 128 + stopping.signal
        if stopping.output_closed:  # the init line found no reader
            return EXIT_OUTPUT_CLOSED
        stopping.session = session
        stopping.session_id = session.session_id
        if progress is not None:
            progress.begin()
        result = await session.run(prompt)
        stopping.session = None
        stopping.reason = result.reason
        if progress is not None:
            progress.close()
        if stopping.output_closed:
            return EXIT_OUTPUT_CLOSED
        text = config.output_format == "text"
        if text and result.permission_denials:
            for line in render_denials(result.permission_denials):
                say(line)
            if result.reason == "completed":
                say("  (the run completed, exit 0; --fail-on-denial makes such a run exit 7)")
        if result.reason == "permission_denied" and text:
            say("warren: run ended: permission_denied: calls were denied (--fail-on-denial)")
        elif result.reason == "output_truncated" and text:
            say(
                "warren: run ended: output_truncated: the model's reply stayed cut at its "
                "output token limit; stdout holds what it wrote"
            )
        elif result.reason != "completed" and text:
            said = escape_controls(result.result, keep_lines=True)  # the model's or a server's
            say(f"warren: run ended: {result.reason}: {said}")
        if result.reason == "interrupted":
            say(_resume_line(session.session_id, "interrupted"))
        elif show_session:
            say(_resume_line(session.session_id, "ended"))
        stopping.session_id = None  # said
    if result.reason == "interrupted" and stopping.signal is not None:
        return 128 + stopping.signal
    return exit_code(result.reason)
