"""A process held by a pidfd (`sandbox.process.held`): signalled and seen to end through it,
on trio and without an event loop."""

from __future__ import annotations

import signal
import subprocess

import trio

from sandbox.process.held import HeldProcess


async def test_a_held_process_is_signalled_and_seen_to_end() -> None:
    process = await trio.lowlevel.open_process(["sleep", "1000"])
    held = HeldProcess.open(process.pid)
    try:
        assert not held.ended()
        held.signal(signal.SIGKILL)
        with trio.fail_after(10):
            await held.wait()
        assert held.ended()
    finally:
        held.close()
        await process.wait()
    assert process.returncode == -signal.SIGKILL
    assert held.fd == -1
    held.signal(signal.SIGKILL)  # closed: nothing to signal, no error
    assert held.ended()


def test_wait_ended_without_an_event_loop() -> None:
    process = subprocess.Popen(["sleep", "1000"])
    held = HeldProcess.open(process.pid)
    try:
        assert not held.wait_ended(0.0)
        process.kill()
        assert held.wait_ended(10.0)
    finally:
        held.close()
        process.wait()
