"""A session entry for the server's tests (`warren server run --entry ...`, the server's
seam): instead of a Warren session it reports what the session process was given (argv,
cwd, environment, umask, descriptors, terminal) and which signals reach it.

    echo CODE                 stdin, argv, cwd, env, umask, ttys, open descriptors as JSON on
                              stdout; exit CODE
    signals FILE              print `ready`, then each signal as `got N` (also appended to
                              FILE); SIGTERM or SIGHUP end it with 128 + N
    wait                      print pid and $MARK, then wait for a line on stdin
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def _tty(fd: int) -> str | None:
    try:
        return os.ttyname(fd)
    except OSError:
        return None


def _descriptors() -> dict[int, str]:
    """This process's open descriptors and what each is (`readlink /proc/self/fd/N`)."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the directory's own descriptor, closed by now
            pass
    return found


def session(argv: list[str], terminal: Path | None, known_floor: object = None) -> int:
    mode = argv[0]
    if mode == "echo":
        umask = os.umask(0)
        os.umask(umask)
        stdin = "" if os.isatty(0) else sys.stdin.read()
        report = {
            "argv": argv,
            "sys_argv": sys.argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "umask": umask,
            "stdin": stdin,
            "ttys": [_tty(0), _tty(1), _tty(2)],
            "terminal": None if terminal is None else str(terminal),
            "pid": os.getpid(),
            "fds": _descriptors(),
        }
        print(json.dumps(report))
        print("this went to stderr", file=sys.stderr)
        return int(argv[1])
    if mode == "signals":
        log = Path(argv[1])
        pending: list[int] = []

        def got(signum: int, frame: object) -> None:
            pending.append(signum)  # reported below: a handler that prints can interrupt
            # another print in progress (a reentrant write raises)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGWINCH):
            signal.signal(sig, got)
        print("ready", flush=True)
        while True:
            while not pending:
                time.sleep(0.01)  # not pause(): the signal may be delivered to another thread
            signum = pending.pop(0)
            print(f"got {signum}", flush=True)
            with log.open("a") as file:
                file.write(f"got {signum}\n")
            if signum in (signal.SIGTERM, signal.SIGHUP):
                return 128 + signum
    if mode == "wait":
        print(json.dumps({"pid": os.getpid(), "mark": os.environ.get("MARK")}), flush=True)
        sys.stdin.readline()
        print(f"done {os.environ.get('MARK')}", flush=True)
        return 0
    raise SystemExit(f"probe: unknown mode {mode}")
