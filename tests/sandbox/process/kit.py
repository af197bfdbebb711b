"""Real processes for the process room's tests: a Python child that reports when it is ready
and what it received, so no test has to guess with a sleep."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import trio

from sandbox.process.tree import alive, until_gone

IGNORES_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
"""A child that ignores SIGTERM (and end of input): only SIGKILL ends it."""

LEAVES_ON_TERM = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)\n"
"""A child that dies of SIGTERM (the default action) but not of end of input."""

LEAVES_AT_EOF = "import sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
"""A child that exits 0 once its input ends."""


def python(code: str) -> list[str]:
    return [sys.executable, "-I", "-c", code]


async def start(argv: Sequence[str]) -> tuple[trio.Process, str]:
    """`argv` in a session of its own with piped stdio, once it has printed its first line
    (returned with it)."""
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return process, await first_line(process)


async def first_line(process: trio.Process) -> str:
    """The first line `process` prints (it must print one within 30 s)."""
    assert process.stdout is not None
    data = b""
    with trio.fail_after(30):
        while b"\n" not in data:
            chunk = await process.stdout.receive_some(1)  # no more: the rest is the caller's
            assert chunk, f"the child exited first: {data!r}"
            data += chunk
    return data.decode().strip()


def with_grandchild(code: str) -> list[str]:
    """bash running `code` (Python) as a background job in its own process group, printing
    the job's pid first, then waiting for it."""
    return ["bash", "-c", f'{sys.executable} -I -c "$1" & echo $!; wait', "bash", code]


async def gone(pids: Sequence[int]) -> bool:
    """Whether every one of `pids` is gone (or a zombie) within a few seconds: a process
    SIGKILLed by someone else is not gone the instant the signal is sent."""
    return await until_gone(lambda: alive(pids), 10.0)
