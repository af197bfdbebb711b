"""What a pool worker imports on its way to `Ready`: a scoped writer starts a fresh worker, so
the worker's start-up is on the dispatch's critical path (tests/bench/bench_parallel_writers.py),
and every module it needs no more than the coordinator does is CPU three workers starting at
once pay on a shared machine. Pinned here: not the SDK (the model is brokered), not the floor
(the worker runs inside it; it only adopts orphans), not psutil (a kill path's helper).

The same for a tool host, of which every session starts two (a read-only and a read-write
one): not structlog, whose import (with rich, pygments and asyncio) cost each host 5 MB
(tests/bench/bench_server.py prints the PSS of a live session tree); nor the modules trio and
pydantic name but no host uses at start (ssl and hmac with OpenSSL, idna, secrets, bz2, lzma,
tempfile, locale: 1.9 MB; deferred by workers/lean.py, so `-X importtime` does not list them
unless they run); nor difflib (an Edit's diff, imported when one runs) nor argparse
(workers/toolhost.py `_parse_args`); nor the agent worker's messages (workers/host_protocol.py:
0.7 MB); nor, for both, pydantic's search for plugins (importlib.metadata and what it reads:
workers/lean.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import sandbox

ROOT = Path(__file__).resolve().parents[2]


def _modules_at_ready(workspace: Path, module: str, role: str) -> set[str]:
    """The modules a worker (`module` workers.agent_worker) or tool host (workers.toolhost)
    of `role` has loaded when it has sent `Ready` (stdin at end of file: it starts, sends
    Ready, and exits), started as the coordinator starts it (`python -I -m workers MODULE`,
    workers/child.py `HostLaunch.of_module`); `-X importtime` names each module it imports."""
    argv = [sys.executable, "-I", "-X", "importtime", "-m", "workers", module]
    done = subprocess.run(
        [*argv, "--workspace", str(workspace), "--role", role],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert b'"type":"ready"' in done.stdout
    lines = done.stderr.decode().splitlines()
    return {x.rsplit("|", 1)[1].strip() for x in lines if x.startswith("import time:")}


def test_a_worker_reaches_ready_without_the_sdk_the_floor_or_psutil(tmp_path: Path) -> None:
    modules = _modules_at_ready(tmp_path, "workers.agent_worker", "read_write")
    assert "workers.agent_worker" in modules and "sandbox.process.orphans" in modules
    unwanted = {"anthropic", "httpx", "psutil", "sandbox.probe", "sandbox.run", "sandbox.spec"}
    unwanted |= {"importlib.metadata"}  # pydantic's plugin search: workers/lean.py
    assert modules & unwanted == set()


def test_a_tool_host_reaches_ready_without_structlog_the_sdk_or_the_floor(tmp_path: Path) -> None:
    # read_write imports the same
    modules = _modules_at_ready(tmp_path, "workers.toolhost", "read_only")
    assert "workers.toolhost" in modules and "orchestrator.tools.bash" in modules
    assert "trio" in modules and "socket" in modules  # what names ssl and idna did run
    unwanted = {"structlog", "rich", "pygments", "asyncio", "anthropic", "httpx", "psutil"}
    unwanted |= {"sandbox.probe", "sandbox.run", "sandbox.spec", "importlib.metadata"}
    unwanted |= {"ssl", "_ssl", "idna", "hashlib", "hmac", "_hashlib", "secrets"}
    unwanted |= {"bz2", "_bz2", "lzma", "_lzma", "tempfile", "locale", "difflib", "argparse"}
    # the agent worker's messages (workers/host_protocol.py) and what only they need
    unwanted |= {"workers.protocol", "orchestrator.events", "orchestrator.model.base"}
    assert modules & unwanted == set()


def test_the_sandbox_package_still_offers_every_name_it_lists() -> None:
    for name in sandbox.__all__:
        value = getattr(sandbox, name)
        home = importlib.import_module(value.__module__)
        assert getattr(home, name) is value
    assert set(sandbox.__all__) <= set(dir(sandbox))


def test_a_tool_host_rehearsal_leaves_no_thread_and_builds_the_decoder() -> None:
    """`toolhost.rehearse` runs in a template before it forks hosts (workers/zygote.py): it
    must leave no thread behind (a fork copies none, and trio's thread cache would hand work
    to one the child lacks), and it must have built what a host's first line needs."""
    probe = (
        "import threading\n"
        "from workers import host_protocol, toolhost\n"
        "toolhost.rehearse()\n"
        "print(threading.active_count(), host_protocol._host_adapter.cache_info().currsize)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]
