"""Running one hook's command as a process: its stdin fed, its output capped, its time bounded.

Two places run a hook this way (`run_hook_command`), both as a plain child of the calling
process:

* a tool host (`workers.toolhost`, answering `RunHook`): the hook inherits the host's sandbox,
  which is the floor hooks must run under. There the hook is *contained*: its parent is a
  small perl (or bash) process that is a child subreaper, so whatever the hook starts, even
  what leaves its process group (`setsid`, a double fork), stays in that parent's subtree.
  When the hook ends the parent kills what it left running; at a timeout, a flood or a
  cancellation we kill the whole subtree ourselves. Nothing a hook started outlives it in a
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
import functools
import os
import platform
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

__all__ = ["HookProcess", "run_hook_command"]

_REAP_S = 5.0
"""Seconds we wait for a killed hook to be reaped."""

_PERL_REAPER = r"""
syscall(%(prctl)d, 36, 1, 0, 0, 0) == 0 or die "prctl: $!\n";
my $pid = fork() // die "fork: $!\n";
if (!$pid) { exec { '/bin/sh' } '/bin/sh', '-c', $ARGV[0]; die "exec /bin/sh: $!\n"; }
waitpid($pid, 0);
my $status = $?;
while (1) {
    my @kids;
    if (open(my $h, '<', "/proc/$$/task/$$/children")) { local $/; @kids = split ' ', <$h> // ''; }
    last unless @kids;
    kill 'KILL', @kids;
    waitpid($_, 0) for @kids;
}
exit($status & 127 ? 128 + ($status & 127) : $status >> 8);
"""
"""The contained hook's parent (see the module docstring), a child subreaper: perl, which
makes the prctl call itself and starts in ~2 ms, where the one-shots' shim plus a bash costs
twice that. `$ARGV[0]` is the hook's command; the hook reads perl's stdin, which perl never
reads. When the hook ends, everything it left running (handed to us) is killed and reaped."""

_BASH_REAPER = r"""
/bin/sh -c "$1"
status=$?
while read -r -a kids < "/proc/$$/task/$$/children" || ((${#kids[@]})); do
    ((${#kids[@]})) || break
    kill -KILL "${kids[@]}" 2>/dev/null
done
exit "$status"
"""
"""The same in bash, made a subreaper between fork and exec, where there is no perl."""


@dataclass(frozen=True, slots=True)
class HookProcess:
    """How a hook's process ended."""

    exit_code: int | None
    """None when it never finished (timed out, flooded, cancelled)."""
    stdout: bytes
    stderr: bytes
    problem: str | None = None
    """Why the run counts as an error whatever it printed (a timeout, a flood, a signal)."""


async def run_hook_command(
    command: str,
    *,
    stdin: bytes,
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float,
    output_bytes: int,
    contain: bool,
) -> HookProcess:
    """Run `/bin/sh -c command` with `stdin`, `env` (the whole environment) and `cwd`; kill it
    at `timeout_s` or once stdout plus stderr pass `output_bytes`.

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
            _argv(command, contain),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
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
            if len(chunks["out"]) + len(chunks["err"]) > output_bytes:
                problem = f"printed more than {output_bytes} bytes and was stopped"
                scope.cancel()
                return

    async def feed(stream: trio.abc.SendStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(stdin)
            await stream.aclose()

    try:
        with trio.move_on_after(timeout_s) as deadline:
            async with trio.open_nursery() as nursery:
                assert proc.stdin and proc.stdout and proc.stderr
                nursery.start_soon(feed, proc.stdin)
                nursery.start_soon(pump, "out", proc.stdout, deadline)
                nursery.start_soon(pump, "err", proc.stderr, deadline)
                await proc.wait()
        finished = not deadline.cancelled_caught
        if deadline.cancelled_caught and problem is None:
            problem = f"timed out after {timeout_s:g} s and was stopped"
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


@functools.cache
def _perl_reaper() -> tuple[str, ...]:
    """perl and `_PERL_REAPER` for this machine; empty without perl or on an architecture
    whose prctl number we do not know. Looked up once per process."""
    from orchestrator.tools.shell import _PRCTL_SYSCALL

    number = _PRCTL_SYSCALL.get(platform.machine())
    perl = shutil.which("perl")
    if number is None or perl is None:
        return ()
    return (perl, "-e", _PERL_REAPER % {"prctl": number}, "--")


def _argv(command: str, contain: bool) -> list[str]:
    if not contain:
        return ["/bin/sh", "-c", command]
    if perl := _perl_reaper():
        return [*perl, command]
    return ["bash", "--noprofile", "--norc", "-c", _BASH_REAPER, "warren-hook", command]


def _preexec(contain: bool) -> Callable[[], None] | None:
    """Without perl, the subreaper prctl runs between fork and exec (slower: Python forks)."""
    if not contain or _perl_reaper():
        return None
    from orchestrator.tools.shell import _become_subreaper

    return _become_subreaper


async def _stop(proc: trio.Process, *, contain: bool, whole_tree: bool) -> None:
    """Kill what is left of the hook (its subtree first, when contained and cut short; then
    its group) and reap it, bounded by `_REAP_S`."""
    if contain and whole_tree:
        from orchestrator.tools.shell import _kill_subtree

        await _kill_subtree(proc.pid, 0.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with trio.move_on_after(_REAP_S):
        await proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()
