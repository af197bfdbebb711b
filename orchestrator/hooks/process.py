"""Running one hook's command as a process: its stdin fed, its output capped, its time bounded.

Two places run a hook this way (`run_hook_command`), both as a plain child of the calling
process:

* a tool host (`workers.toolhost`, answering `RunHook`): the hook inherits the host's sandbox,
  which is the floor hooks must run under. There the hook is *contained*: its parent is a
  small perl (or bash) process that is a child subreaper (`sandbox.process.subreaper`), so
  whatever the hook starts, even what leaves its process group (`setsid`, a double fork),
  stays in that parent's subtree. When the hook ends the parent kills what it left running;
  at a timeout, a flood or a cancellation we kill the whole subtree ourselves
  (`sandbox.process.tree.kill_tree`). Nothing a hook started outlives it in a
  host that lives as long as the session (tests/orchestrator/test_hooks_warm.py).
* the coordinator, for a hook that runs unsandboxed (a user's or the managed policy's
  `sandbox = false`, or `--sandbox=off`): a plain process group, killed as a group, as a
  hook run by hand from a terminal would be.

Inside a read-only tool host, where the host is the subreaper of its one-shots
(`sandbox.process.orphans`), the hook's parent is registered as one of them so no sweep takes it for
an orphan.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

__all__ = ["HookCommand", "HookProcess", "run_hook_command"]

_BASH_REAPER = '/bin/sh -c "$1"'
"""What the contained hook's parent runs where there is no perl (`sandbox.process.subreaper.
perl_reaper`): bash, made a subreaper between fork and exec, runs the hook (`$1`), then kills
what it left (`kills_leftovers`)."""


@dataclass(frozen=True, slots=True)
class HookProcess:
    """How a hook's process ended."""

    exit_code: int | None
    """None when it never finished (timed out, flooded, cancelled)."""
    stdout: bytes
    stderr: bytes
    problem: str | None = None
    """Why the run counts as an error whatever it printed (a timeout, a flood, a signal)."""


@dataclass(frozen=True)
class HookCommand:
    """One hook's command and what it runs with, wherever it runs (here, or in a tool host)."""

    command: str
    """Run as `/bin/sh -c command`."""
    stdin: bytes
    """The hook's input (its event as JSON)."""
    env: Mapping[str, str]
    """Its environment: the whole of it for `run_hook_command`; what is added to the
    sandbox's environment for a tool host's `run_hook`."""
    cwd: Path
    timeout_s: float
    """Seconds before it is killed, with everything it started."""
    output_bytes: int
    """Output (stdout plus stderr) past which it is killed."""


async def run_hook_command(hook: HookCommand, *, contain: bool) -> HookProcess:
    """Run `/bin/sh -c hook.command` with its `stdin`, `env` (the whole environment) and
    `cwd`; kill it at `timeout_s` or once stdout plus stderr pass `output_bytes`.

    `contain`: run it below a subreaper parent and kill its whole subtree (see the module
    docstring); False: a plain process group.

    **Cancellation:** the hook (its subtree, or its group) is killed and reaped, shielded and
    bounded, before `Cancelled` propagates.
    **Errors:** `OSError` when the process cannot start.
    """
    from sandbox.process.orphans import adoption

    adopted = adoption() if contain else None
    with adopted.starting() if adopted is not None else contextlib.nullcontext():
        proc = await trio.lowlevel.open_process(
            _argv(hook.command, contain),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=hook.cwd,
            env=dict(hook.env),
            start_new_session=True,
            preexec_fn=_preexec(contain),
        )
        if adopted is not None:
            adopted.started(proc.pid)
    chunks = {"out": bytearray(), "err": bytearray()}
    problem: str | None = None
    finished = False

    async def pump(name: str, stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
        nonlocal problem
        while data := await stream.receive_some(65536):
            chunks[name] += data
            if len(chunks["out"]) + len(chunks["err"]) > hook.output_bytes:
                problem = f"printed more than {hook.output_bytes} bytes and was stopped"
                scope.cancel()
                return

    async def feed(stream: trio.abc.SendStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(hook.stdin)
            await stream.aclose()

    try:
        with trio.move_on_after(hook.timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                assert proc.stdin and proc.stdout and proc.stderr
                nursery.start_soon(feed, proc.stdin)
                nursery.start_soon(pump, "out", proc.stdout, deadline)
                nursery.start_soon(pump, "err", proc.stderr, deadline)
                await proc.wait()
        finished = not deadline.cancelled_caught
        if deadline.cancelled_caught and problem is None:
            problem = f"timed out after {hook.timeout_s:g} s and was stopped"
    finally:
        with trio.CancelScope(shield=True):
            await _stop(proc, contain=contain, whole_tree=not finished)
            if adopted is not None:
                adopted.ended(proc.pid)
                await adopted.sweep(proc.pid)
    code = proc.returncode if finished else None
    if problem is None and code is not None and code < 0:
        problem = f"was killed by signal {-code}"
    return HookProcess(code, bytes(chunks["out"]), bytes(chunks["err"]), problem)


def _argv(command: str, contain: bool) -> list[str]:
    if not contain:
        return ["/bin/sh", "-c", command]
    # The process room is imported on a hook's first run, not with the hooks (the
    # coordinator's start).
    from sandbox.process.subreaper import kills_leftovers, perl_reaper

    if perl := perl_reaper():
        return [*perl, command]
    bash = kills_leftovers(_BASH_REAPER)
    return ["bash", "--noprofile", "--norc", "-c", bash, "warren-hook", command]


def _preexec(contain: bool) -> Callable[[], None] | None:
    """Without perl, the subreaper prctl runs between fork and exec (slower: Python forks)."""
    if not contain:
        return None
    from sandbox.process.subreaper import become_subreaper, perl_reaper

    return None if perl_reaper() else become_subreaper


async def _stop(proc: trio.Process, *, contain: bool, whole_tree: bool) -> None:
    """Kill what is left of the hook (its subtree first, when contained and cut short; then
    its group, whatever is left of it) and reap it, bounded by `REAP_TIMEOUT_S`."""
    from sandbox.process.child import REAP_TIMEOUT_S, stop_child
    from sandbox.process.tree import kill_tree

    if contain and whole_tree:
        await kill_tree(proc.pid, 0.0)
    await stop_child(proc, grace_s=None, kill_wait_s=REAP_TIMEOUT_S, group=True)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()
