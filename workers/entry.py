"""What both worker entry points (`workers.toolhost`, `workers.agent_worker`) do the same way:
take the protocol off stdio, load the tool set named on the command line, and serve until the
coordinator hangs up or sends SIGTERM. Imports nothing heavy (the agent worker counts its RSS).

Both also make themselves non-dumpable first (`make_undumpable`): the tools they run share
their uid inside the sandbox, and a dumpable worker's `/proc/<pid>/mem` and `/proc/<pid>/fd/N`
would let a tool read its memory or write a forged message into its protocol pipe.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from orchestrator.tools.registry import ToolRegistry
from sandbox.nsfork import make_undumpable
from sandbox.process.handover import PIPE_FDS_ENV
from sandbox.process.orphans import adopt_orphans
from workers import host_protocol as wire

__all__ = [
    "ToolsFactory",
    "exit_now",
    "load_tools_factory",
    "make_undumpable",
    "serve_until_sigterm",
    "take_protocol",
    "take_stdio",
]

ToolsFactory = Callable[[wire.HostRole], ToolRegistry]


def load_tools_factory(spec: str) -> ToolsFactory:
    """`MODULE:FUNCTION` from `--tools`; a malformed spec exits with a message."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--tools must look like MODULE:FUNCTION, got {spec!r}")
    factory: ToolsFactory = getattr(importlib.import_module(module), name)
    return factory


def take_protocol(role: str) -> tuple[int, int]:
    """What a worker or tool host does once it is undumpable and has read its arguments: the
    read-only one, which runs only one-shot commands, becomes their subreaper
    (`sandbox.process.orphans`); then the protocol's descriptors are taken (`take_stdio`)."""
    if role == "read_only":
        adopt_orphans()
    return take_stdio()


def take_stdio() -> tuple[int, int]:
    """Move the protocol's stdin/stdout to private descriptors (not inherited by children, so
    a tool's process can neither corrupt the stream nor read coordinator input); fd 0 becomes
    /dev/null and fd 1 a copy of stderr.

    Under the sandbox the protocol arrives on the descriptors `PIPE_FDS_ENV` names, never
    on fd 0/1 (`sandbox.run.open_sandboxed_process(private_pipes=True)`): bwrap's init keeps
    its stdio open, where anything in the sandbox could reach them through `/proc/1/fd`."""
    named = os.environ.pop(PIPE_FDS_ENV, None)
    if named:
        proto_in, proto_out = (int(fd) for fd in named.split(","))
        os.set_inheritable(proto_in, False)
        os.set_inheritable(proto_out, False)
    else:
        proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return proto_in, proto_out


async def serve_until_sigterm(
    serve: Callable[[wire.LineReader], Awaitable[None]],
    proto_in: int,
    *,
    on_sigterm: Callable[[], None],
) -> None:
    """Run `serve` on the protocol's input until it returns (end of input, `Shutdown`) or
    SIGTERM arrives (then `on_sigterm` logs it and serving is cancelled)."""
    async with trio.open_nursery() as nursery:

        async def stop_on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    on_sigterm()
                    nursery.cancel_scope.cancel()

        nursery.start_soon(stop_on_sigterm)
        await serve(wire.LineReader(trio.lowlevel.FdStream(proto_in)))
        nursery.cancel_scope.cancel()


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's teardown of the imported objects (a third of a second
    on a busy machine, which the session's exit, or the pool's stop of a worker, waits for):
    `serve_until_sigterm` has closed everything the process started, and log lines are
    flushed as written (tests/workers/test_worker_exit.py)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
