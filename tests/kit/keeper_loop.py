"""`KeeperLoop`: the warm server's loop over a `SpareKeeper` (links, templates, reaping), in
a thread, for tests and benchmarks that adopt spares through real links without a server
process (tests/orchestrator/server/test_host_template.py, tests/bench/bench_host_template.py);
`is_forked` and `spare_waiting`, what a spare tool host is and whether it is idle.
"""

from __future__ import annotations

import queue
import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from orchestrator.cli.warm.spares import SpareKeeper, SpareLink

__all__ = ["KeeperLoop", "is_forked", "spare_waiting"]


class KeeperLoop:
    """The server's select loop over `keeper`, in a daemon thread; the keeper is used from
    that thread alone (`run_in` hands it work and returns its result or raises its error)."""

    def __init__(self, keeper: SpareKeeper) -> None:
        self.keeper = keeper
        self._work: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            while not self._work.empty():
                job, answer = self._work.get()
                try:
                    answer.put((job(), None))
                except Exception as exc:  # handed to the caller
                    answer.put((None, exc))
            links = self.keeper.link_fds()
            templates = self.keeper.template_fds()
            readable, _, _ = select.select([*links, *templates], [], [], 0.02)
            for fd in readable:
                if fd in links:
                    self.keeper.serve(links[fd])
                elif fd in templates:
                    self.keeper.template_readable(fd)
            self.keeper.reap()

    def run_in(self, job: Callable[[], Any]) -> Any:
        answer: queue.Queue[Any] = queue.Queue()
        self._work.put((job, answer))
        result, error = answer.get(timeout=120)
        if error is not None:
            raise error
        return result

    def link(self, pid: int) -> SpareLink:
        """A new session `pid`'s end of its link (the keeper holds the other)."""
        ours, theirs = self.keeper.new_link()
        self.run_in(lambda: self.keeper.attach(pid, ours))
        return SpareLink(theirs)

    def close(self) -> None:
        """Stop the keeper (its spares and templates) and the loop; idempotent."""
        if self._stop.is_set():
            return
        self.run_in(self.keeper.stop)
        self._stop.set()
        self._thread.join(30)


def is_forked(pid: int) -> bool:
    """The spare `pid` was forked from a tool-host template
    (orchestrator/cli/warm/host_template.py),
    whose command line it carries; False for a fresh one (a bwrap) or one gone."""
    try:
        return "workers.zygote" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


def spare_waiting(pid: int) -> bool:
    """The spare tool host `pid` waits for its first message (sent `Ready`, idle in trio's
    epoll wait): the process itself when forked, else the host's python under its bwrap."""
    try:
        process = psutil.Process(pid)
        forked = is_forked(pid)
        for candidate in [process] if forked else process.children(recursive=True):
            command = candidate.cmdline()
            if forked or ("workers.toolhost" in command and "bwrap" not in command[0]):
                return Path(f"/proc/{candidate.pid}/wchan").read_text() == "do_epoll_wait"
    except (psutil.Error, OSError):
        return False
    return False
