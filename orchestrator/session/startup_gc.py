"""The garbage collector paused while an in-process run starts up.

A cold `warren -p` made 408 collections before its first model request, 202 ms of it on a
quiet machine: three full collections (17, 44 and 74 ms) walking every object the SDK's,
pydantic's and Warren's imports had just made, and 36 ms of middle-generation ones. Nearly all
of those objects live as long as the process (modules, classes, schemas, the SDK's types), so
the walks found almost nothing to free.

`pause()` turns the collector off at the start of an in-process run
(`orchestrator.cli.run_and_exit`: not for a subcommand, and not in the warm server's
sessions, which start from a server that imported everything long before). `resume()` turns
it back on when the run's parts start (`Session.start_parts`: the first response of a `-p`
run, the REPL's first prompt), and at the latest `MAX_PAUSE_S` after the pause (a timer
thread), so a run that never gets a response does not go on without collections. It first
freezes what exists then (`gc.freeze`: the start-up's objects move out of every later
collection, so none walks them again). The garbage the start-up made in cycles stays; its
allocations are mostly the import's, which make none to speak of.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["MAX_PAUSE_S", "pause", "resume"]

MAX_PAUSE_S = 30.0
"""The longest the collector stays off after `pause()`."""

_lock = threading.Lock()
_timer: threading.Timer | None = None


def pause(max_pause_s: float = MAX_PAUSE_S) -> None:
    """Turn the collector off until `resume()`, or for `max_pause_s` at most. Nothing when it
    is already off (paused, or by the embedding program)."""
    global _timer
    with _lock:
        if not gc.isenabled() or _timer is not None:
            return
        gc.disable()
        _timer = threading.Timer(max_pause_s, resume)
        _timer.daemon = True
        _timer.name = "warren-gc-resume"
        _timer.start()


def resume() -> None:
    """Freeze what exists and turn the collector back on, if `pause()` turned it off
    (idempotent; any thread)."""
    global _timer
    with _lock:
        timer, _timer = _timer, None
        if timer is None:
            return
        timer.cancel()
        gc.freeze()
        gc.enable()
