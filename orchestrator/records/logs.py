"""Logging: structlog, JSON lines to a per-session file, readable lines on stderr with -v.

The readable lines are structlog's `ConsoleRenderer`, coloured only when stderr is a terminal
and `NO_COLOR` is unset; every string value is escaped first (a log record may quote the
model or a tool), and a stderr that is gone (a closed pipe) ends them instead of failing the
code that logged.

Configured once per process by the CLI (the composition root); library code only calls
`structlog.get_logger()`. Nothing is ever printed to stdout, which belongs to the output format.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

from orchestrator.text import escape_controls

__all__ = ["LogSink", "configure_logging"]


class LogSink:
    """The last processor: one JSON line to the file, one readable line to stderr if verbose.

    `close()` detaches the file first, so a log call after the run (a library still logging
    in the same process, as in the test suite) is dropped instead of hitting a closed file.
    """

    def __init__(
        self,
        file: IO[str] | None,
        verbose: bool,
        on_error: Callable[[str, OSError], None] | None = None,
    ) -> None:
        self._file = file
        self._verbose = verbose
        self._on_error = on_error
        self._console = _console_renderer() if verbose else None

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        file = self._file
        if file is not None:
            try:
                file.write(json.dumps(event, default=str) + "\n")
                file.flush()
            except OSError as exc:
                # A full or read-only state directory: stop logging to the file and let the
                # session end the run `io_error`, instead of failing whatever code logged.
                self._file = None
                if self._on_error is None:
                    raise
                self._on_error("log file", exc)
        if self._verbose and self._console is not None:
            shown = {
                key: escape_controls(value) if isinstance(value, str) else value
                for key, value in event.items()
            }
            try:
                sys.stderr.write(str(self._console(logger, method, shown)) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                self._verbose = False  # stderr is gone: no more readable lines
        raise structlog.DropEvent

    def close(self) -> None:
        file, self._file = self._file, None
        self._verbose = False
        if file is not None:
            file.close()
        self._on_error = None


def _console_renderer() -> structlog.dev.ConsoleRenderer:
    try:
        colors = sys.stderr.isatty() and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError):
        colors = False
    return structlog.dev.ConsoleRenderer(
        colors=colors, exception_formatter=structlog.dev.plain_traceback
    )


def configure_logging(
    *,
    log_file: Path | None,
    verbose: bool,
    on_error: Callable[[str, OSError], None] | None = None,
) -> LogSink:
    """Send logs to `log_file` (JSON lines) and, if `verbose`, to stderr.

    Returns the sink; the caller closes it when the run ends. A failed write to the file
    detaches it and calls `on_error` (without one, the `OSError` propagates).
    """
    file: IO[str] | None = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        file = log_file.open("a", encoding="utf-8")
    sink = LogSink(file, verbose, on_error)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            sink,
        ],
        cache_logger_on_first_use=False,
    )
    structlog.get_logger().info("logging configured", pid=os.getpid(), started=time.time())
    return sink
