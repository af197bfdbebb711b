"""Child subreapers: a process that gets the orphans of everything below it (prctl
PR_SET_CHILD_SUBREAPER) instead of the sandbox's init, so what a command leaves running,
even what left its process group (`setsid`, a double fork, `nohup`), can be found and killed.

Three ways to make one, cheapest first for where each is used:

* this process itself (`become_subreaper`): the read-only tool host and agent worker, where
  only one-shots run (`sandbox.process.orphans`); also what runs between fork and exec where
  neither of the others is available (a `preexec_fn`, which makes Python fork instead of
  vfork: ~13 ms a call in a tool host, tests/bench/bench_vs_parent.py);
* a perl shim that makes the prctl call itself and execs bash (`subreaper_shim`): a one-shot
  Bash call's outer bash (orchestrator/tools/shell.py), which then runs `kills_leftovers`;
* a perl parent that is the subreaper, runs `/bin/sh -c COMMAND` and kills what it left
  (`perl_reaper`): a contained hook (orchestrator/hooks/process.py), ~2 ms to start where
  the shim plus a bash costs twice that.

perl-base is essential on Debian; without perl (or on an architecture whose prctl number we do
not know) the callers fall back to bash made a subreaper by `become_subreaper`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shutil

__all__ = [
    "PRCTL_SYSCALL",
    "become_subreaper",
    "kills_leftovers",
    "perl_reaper",
    "subreaper_shim",
]

_PR_SET_CHILD_SUBREAPER = 36

PRCTL_SYSCALL = {"x86_64": 157, "aarch64": 167}
"""prctl's syscall number, for the perl programs (the seccomp filter knows these two too)."""

_KILL_LEFTOVERS = r"""
while read -r -a kids < "/proc/$$/task/$$/children" || ((${#kids[@]})); do
    ((${#kids[@]})) || break
    kill -KILL "${kids[@]}" 2>/dev/null
done
"""
"""bash, in a subreaper: SIGKILL its children (what a command left, handed to it) until none
is left."""

_PERL_REAPER = r"""
syscall(%(prctl)d, %(subreaper)d, 1, 0, 0, 0) == 0 or die "prctl: $!\n";
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
"""The subreaper parent of `perl_reaper`: `$ARGV[0]` is the command; the command reads perl's
stdin, which perl never reads; its status is the command's (128+N for signal N)."""


def become_subreaper() -> None:
    """Make this process a child subreaper (an in-process prctl, no fork).

    **Errors:** `OSError` when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


def subreaper_shim() -> list[str]:
    """An argv prefix that makes the process a child subreaper and execs bash with the rest
    (`[*shim, "bash", ...]`: perl's `syscall`, without forking Python the slow way). Empty
    when there is no perl or bash, or the architecture is unknown: then run bash with
    `become_subreaper` as its `preexec_fn`."""
    number = PRCTL_SYSCALL.get(platform.machine())
    perl = shutil.which("perl")
    bash = shutil.which("bash")
    if number is None or perl is None or bash is None:
        return []
    code = (
        f'syscall({number}, {_PR_SET_CHILD_SUBREAPER}, 1, 0, 0, 0) == 0 or die "prctl: $!\\n";'
        f" exec {{ '{bash}' }} @ARGV or die \"exec: $!\\n\";"
    )
    return [perl, "-e", code, "--"]


@functools.cache
def perl_reaper() -> tuple[str, ...]:
    """An argv prefix (`[*prefix, COMMAND]`) that runs `/bin/sh -c COMMAND` below a perl
    parent that is a child subreaper and, when the command ends, kills and reaps everything
    it left. Empty without perl or on an architecture whose prctl number we do not know.
    Looked up once per process."""
    number = PRCTL_SYSCALL.get(platform.machine())
    perl = shutil.which("perl")
    if number is None or perl is None:
        return ()
    code = _PERL_REAPER % {"prctl": number, "subreaper": _PR_SET_CHILD_SUBREAPER}
    return (perl, "-e", code, "--")


def kills_leftovers(run: str) -> str:
    """A bash script for a subreaper bash: `run` (lines of bash), then SIGKILL everything it
    left (handed to us) until nothing is left, then exit with `run`'s status."""
    return f'{run.strip()}\nstatus=$?\n{_KILL_LEFTOVERS.strip()}\nexit "$status"\n'
