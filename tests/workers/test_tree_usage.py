"""`tree_usage`, the pool's measure of a worker's process tree (read from /proc/PID/stat),
agrees with psutil's, and sees every descendant, a grandchild in another thread's children
included."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from workers.pool import tree_usage

_TREE = """
import subprocess, sys, threading, time
def grandchild():
    subprocess.run([sys.executable, "-c", "x = bytearray(40_000_000); import time; time.sleep(60)"])
threading.Thread(target=grandchild, daemon=True).start()  # a child of a second thread
sum(range(3_000_000))  # some CPU time of its own
time.sleep(60)
"""


def test_tree_usage_agrees_with_psutil() -> None:
    with subprocess.Popen([sys.executable, "-c", _TREE]) as top:
        try:
            deadline = time.monotonic() + 30
            while len(psutil.Process(top.pid).children(recursive=True)) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)  # the grandchild's bytearray is in place
            usage = tree_usage(top.pid)
            members = [psutil.Process(top.pid), *psutil.Process(top.pid).children(recursive=True)]
            rss = sum(p.memory_info().rss for p in members)
            cpu = sum(sum(p.cpu_times()[:4]) for p in members)
            assert usage is not None
            assert abs(usage[0] - rss) < rss * 0.1
            assert usage[0] > 40_000_000  # the grandchild's memory is counted
            assert abs(usage[1] - cpu) < 0.05 + cpu * 0.1
        finally:
            for child in psutil.Process(top.pid).children(recursive=True):
                child.kill()
            top.kill()
    assert tree_usage(top.pid) is None  # gone (reaped)
