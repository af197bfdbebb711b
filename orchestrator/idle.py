"""When a display may draw: while the run waits, never while it has work to do.

The live displays (the REPL's `TurnView`, `-p`'s `TerminalProgress`) run in the trio thread,
the one that also streams the main agent's replies, runs its tool turns and forwards every
subagent's model requests. Their sinks only hand events over (a deque append); the state
updates, the rendering (Markdown included) and the terminal writes wait for `until_idle`:
the moment no task of the run is runnable, that is, every one of them waits on the network
(a request sent, its reply not yet come), a tool host, a worker or a timer. So a reply's end,
its tool results and the next request follow each other with no drawing in between, and a
subagent's next request is forwarded before its events are drawn (the issue's benchmark goal:
the UI never delays the loop; tests/orchestrator/test_display_pace.py pins the order).

A draw that has started still holds the thread for its length (about a millisecond): a reply
that arrives meanwhile is read after it. A run that is never idle (every task busy for longer
than `max_wait_s`) is drawn anyway, so its progress does not freeze.
"""

from __future__ import annotations

import trio

# trio.testing's own function, from where it is defined: importing trio.testing imports pytest
# when it is installed (0.4 s); tests/orchestrator/test_display_pace.py checks they are one.
from trio._core._generated_run import wait_all_tasks_blocked

__all__ = ["until_idle"]


async def until_idle(max_wait_s: float) -> None:
    """Return once every other task of the run is blocked, or after `max_wait_s`.

    `trio.testing.wait_all_tasks_blocked` is the runner's own test for "nothing runnable,
    no I/O ready", made for tests but exact here (a public trio API; it is cheap: the runner
    checks it only when it would otherwise sleep).

    **Cancellation:** a plain checkpoint: cancelled, it raises `Cancelled`.
    """
    with trio.move_on_after(max_wait_s):
        await wait_all_tasks_blocked()
