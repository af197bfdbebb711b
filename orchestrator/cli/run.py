"""A headless run from the command line: a `Session`, one prompt, signals, the exit code.

Signals all take the path of Ctrl-C: SIGINT, SIGTERM (`kill`, `timeout`) and SIGHUP (a closed
terminal) interrupt the run, which ends `interrupted` with its result line and a resumable
transcript, and every tool host, worker and sandbox is stopped on the way out; the exit code
is 128 + the signal (130, 143, 129). A second signal cancels what is left at once, still
through the shielded, bounded teardown, so nothing is left behind and nothing raises.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field

import trio

from orchestrator.errors import ConfigError
from orchestrator.outcome import EXIT_IO_ERROR, EXIT_USAGE, TerminalReason, exit_code
from orchestrator.session import Session, SessionConfig, SessionParts, open_session
from orchestrator.text import escape_controls

__all__ = ["STOP_SIGNALS", "run_prompt"]

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


async def run_prompt(config: SessionConfig, prompt: str, parts: SessionParts) -> int:
    """Open a session, run `prompt`, and return the process exit code.

    **Errors:** none: a configuration problem is one line and exit 2, a state directory that
    cannot be written mid-run is `io_error` (exit 8), a signal is 128 + its number.
    """
    stopping = _Stopping()
    async with trio.open_nursery() as nursery:
        await nursery.start(stopping.watch)
        try:
            with stopping.scope:
                return await _run(config, prompt, parts, stopping)
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
            if stopping.scope.cancelled_caught:
                say("warren: interrupted")
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


async def _run(config: SessionConfig, prompt: str, parts: SessionParts, stopping: _Stopping) -> int:
    async with open_session(config, parts) as session:
        if stopping.signal is not None:  # it came while the session was opening
            return 128 + stopping.signal
        stopping.session = session
        result = await session.run(prompt)
        stopping.session = None
        stopping.reason = result.reason
        if result.reason == "output_truncated" and config.output_format == "text":
            say(
                "warren: run ended: output_truncated: the model's reply stayed cut at its "
                "output token limit; stdout holds what it wrote"
            )
        elif result.reason != "completed" and config.output_format == "text":
            said = escape_controls(result.result, keep_lines=True)  # the model's or a server's
            say(f"warren: run ended: {result.reason}: {said}")
    if result.reason == "interrupted" and stopping.signal is not None:
        return 128 + stopping.signal
    return exit_code(result.reason)
