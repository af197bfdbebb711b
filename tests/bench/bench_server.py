"""Load on one `warren server` (issue 15): concurrent sessions, leaks, and what a live session
tree costs in memory.

    uv run python tests/bench/bench_server.py [--sessions 200] [--concurrent 16]
        [--tree CHECKOUT]...     the session tree of each checkout (default: this one),
                                 e.g. `--tree /tmp/base --tree .` to compare before and after

Against one fake Messages API server on 127.0.0.1 and one private server (its own
`WARREN_SERVER_DIR`, stopped at the end):

1. a session tree measured while its tool call is in flight (a `Bash("sleep 3")` running in
   the read-only tool host): PSS and RSS of each process, grouped by part (the session
   process, each tool host with its bwrap processes and the commands it runs, workers), and
   again once the session's start-up scan child has exited, if it was still running;
2. `--sessions` scripted `warren -p` sessions (each: a Read and a Bash call in one turn, then
   the answer), `--concurrent` at a time: every exit code, and the server's open
   descriptors, child processes and RSS/PSS before and after, and any process left behind
   by the sessions (psutil: anything running with the bench's directory on its command line
   or in its environment).

The load average is printed with the figures. Nothing here is timed against a goal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply  # noqa: E402

MB = 1024 * 1024


def _route(workspace: Path) -> Any:
    """Each session's turn 1: a Read and a Bash call (or the held `sleep 3` when the prompt
    says `hold`); turn 2: the answer."""

    def route(request: RecordedRequest) -> Reply:
        messages = request.messages
        last = messages[-1]["content"] if messages else ""
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return Reply.text("done")
        prompt = messages[0]["content"] if messages else ""
        if "hold" in str(prompt):
            return Reply(content=[{"type": "tool_use", "name": "Bash",
                                   "input": {"command": "sleep 3"}}])  # fmt: skip
        return Reply(content=[
            {"type": "tool_use", "name": "Read", "input": {"file_path": str(workspace / "a.py")}},
            {"type": "tool_use", "name": "Bash", "input": {"command": "ls"}},
        ])  # fmt: skip

    return route


def _pss(process: psutil.Process) -> int:
    try:
        return int(process.memory_full_info().pss)
    except psutil.Error:
        return 0


def _uss(process: psutil.Process) -> int:
    """Memory only this process maps: what it costs beyond what it shares (a forked
    session process shares most of its pages with the server, and PSS charges it half)."""
    try:
        return int(process.memory_full_info().uss)
    except psutil.Error:
        return 0


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def _cmd(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return "?"


def _part_name(root: psutil.Process, tree: list[psutil.Process]) -> str:
    for process in [root, *tree]:
        cmd = _cmd(process)
        for module in ("workers.toolhost", "workers.agent_worker", "workers.zygote",
                       "sandbox.probe"):  # fmt: skip
            if module in cmd:
                role = cmd.split("--role", 1)[1].split()[0] if "--role" in cmd else ""
                return f"{module} {role}".strip()
    return _cmd(root)[:60]


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return list(process.children(recursive=True))
    except psutil.Error:  # gone meanwhile
        return []


def adopted(session: psutil.Process) -> list[psutil.Process]:
    """The processes `session` holds a pidfd of and did not start: the server's spare tool
    hosts it adopted (their bwrap; `sandbox.spare`), which are the server's children. A
    pidfd's fdinfo names its process (`Pid:`); the session's own descendants (a worker
    forked by its zygote, also held by pidfd) are left out."""
    own = {p.pid for p in _descendants(session)}
    found: dict[int, psutil.Process] = {}
    try:
        fds = os.listdir(f"/proc/{session.pid}/fd")
    except OSError:  # gone meanwhile
        return []
    for fd in fds:
        try:
            if os.readlink(f"/proc/{session.pid}/fd/{fd}") != "anon_inode:[pidfd]":
                continue
            info = Path(f"/proc/{session.pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("Pid:") and (pid := int(line.split()[1])) > 0 and pid not in own:
                with contextlib.suppress(psutil.Error):
                    found[pid] = psutil.Process(pid)
    return list(found.values())


def session_parts(session: psutil.Process) -> list[psutil.Process]:
    """The roots of `session`'s parts: its children (cold tool hosts, the pool, its
    zygote) and the spare tool hosts it adopted from the server."""
    try:
        children = session.children()
    except psutil.Error:
        return []
    return [*children, *adopted(session)]


def session_tree(session: psutil.Process) -> None:
    """Print the PSS and RSS of `session` and of each part it runs (`session_parts`)."""
    print(f"  {'part / process':58} {'PSS MB':>8} {'RSS MB':>8} {'USS MB':>8}")
    own_pss, own_rss, own_uss = _pss(session), _rss(session), _uss(session)
    print(f"  {'session process (forked from the server)':58} {own_pss / MB:8.1f} "
          f"{own_rss / MB:8.1f} {own_uss / MB:8.1f}")  # fmt: skip
    total_pss, total_rss, total_uss = own_pss, own_rss, own_uss
    spares = {p.pid for p in adopted(session)}
    for child in session_parts(session):
        tree = _descendants(child)
        parts = [child, *tree]
        pss = sum(_pss(p) for p in parts)
        rss = sum(_rss(p) for p in parts)
        uss = sum(_uss(p) for p in parts)
        total_pss, total_rss, total_uss = total_pss + pss, total_rss + rss, total_uss + uss
        name = _part_name(child, tree) + (" (spare)" if child.pid in spares else "")
        print(f"  {name:58} {pss / MB:8.1f} {rss / MB:8.1f} {uss / MB:8.1f}")
        for process in parts:
            print(f"    {_cmd(process)[:56]:56} {_pss(process) / MB:8.1f} "
                  f"{_rss(process) / MB:8.1f} {_uss(process) / MB:8.1f}")  # fmt: skip
    print(f"  {'whole session tree':58} {total_pss / MB:8.1f} {total_rss / MB:8.1f} "
          f"{total_uss / MB:8.1f}")  # fmt: skip


def _server_figures(server: psutil.Process) -> dict[str, Any]:
    children = server.children(recursive=True)
    return {
        "fds": server.num_fds(),
        "fd_targets": sorted(_fd_targets(server.pid)),
        "children": [_cmd(c)[:80] for c in children],
        "threads": server.num_threads(),
        "rss": _rss(server),
        "pss": _pss(server),
    }


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            pass
    return targets


def leftovers(work: Path, server_pid: int) -> list[str]:
    """Live processes that name the bench's directory (a workspace, the server directory),
    the server itself left out."""
    found = []
    mark = str(work)
    for process in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
        if process.pid in (server_pid, os.getpid()):
            continue
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            environ: Mapping[str, str] = process.info["environ"] or {}
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        if mark in cmdline or any(mark in v for v in environ.values()):
            found.append(f"{process.pid} {cmdline[:100]}")
    return found


def _session(warren: list[str], env: dict[str, str], cwd: Path, prompt: str) -> tuple[int, str]:
    done = subprocess.run(
        [*warren, "-p", prompt], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    return done.returncode, done.stdout.strip() if done.returncode == 0 else done.stderr[-300:]


def _wait_for_floor(warren: list[str], env: dict[str, str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = subprocess.run(
            [*warren, "server", "status"], env=env, capture_output=True, text=True
        ).stdout
        if "floor proven" in status and "not proven" not in status:
            return
        time.sleep(0.1)
    raise SystemExit("the server never proved the floor")


def _held_session(
    warren: list[str], env: dict[str, str], workspace: Path, server: psutil.Process
) -> None:
    client = subprocess.Popen(
        [*warren, "-p", "hold"], env=env, cwd=workspace,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        # The server's children are its sessions (forked: the server's command line) and
        # its spare tool hosts (bwrap).
        sessions = [p for p in server.children() if _cmd(p) == _cmd(server)]
        for session in sessions:
            tree = [q for p in session_parts(session) for q in [p, *_descendants(p)]]
            if any(_cmd(p).startswith("sleep 3") or _cmd(p).endswith("sleep 3") for p in tree):
                print(f"a session tree with `sleep 3` in flight (load {os.getloadavg()[0]:.2f})")
                session_tree(session)
                # The session's first change scan runs in a child of its own for its first
                # second or so (orchestrator/changes/scan_child.py); the tree once it is done too.
                child = "orchestrator.changes.scan_child"
                scans = [p for p in session.children() if child in _cmd(p)]
                if scans:
                    psutil.wait_procs(scans, timeout=2.5)
                    print("the same tree once the start-up scan child has exited:")
                    session_tree(session)
                _, err = client.communicate(timeout=120)
                if client.returncode != 0:
                    raise SystemExit(f"the held session failed: {err}")
                return
        time.sleep(0.02)
    client.kill()
    raise SystemExit("the held session never ran its sleep")


def _env(checkout: Path, work: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "WARREN_SERVER_DIR": str(work / "srv"),
        "XDG_STATE_HOME": str(work / "state"),
        "XDG_CONFIG_HOME": str(work / "config"),
        "ANTHROPIC_API_KEY": "sk-bench",
    }
    env.pop("WARREN_NO_SERVER", None)
    return env


def _warren(checkout: Path) -> list[str]:
    """`warren` of `checkout`: its own virtual environment's Python (a tool host runs
    `python -I`, which finds Warren's code through that environment, not PYTHONPATH)."""
    python = checkout / ".venv" / "bin" / "python"
    return [str(python if python.exists() else Path(sys.executable)), "-m", "orchestrator.cli"]


def _start_server(warren: list[str], env: dict[str, str]) -> psutil.Process:
    subprocess.run([*warren, "server", "start"], env=env, check=True, capture_output=True)
    status = subprocess.run(
        [*warren, "server", "status"], env=env, capture_output=True, text=True
    ).stdout
    server = psutil.Process(int(status.split("server pid ", 1)[1].split()[0]))
    _wait_for_floor(warren, env)
    return server


def _settle(server: psutil.Process) -> None:
    """Wait until the server's spare tool hosts are the ones forked from its template (a
    fresh spare stands in while the template warms: orchestrator/cli/warm/spares.py); a tree
    without templates shows none within 3 s and is measured as it is."""
    started = time.monotonic()
    while time.monotonic() - started < 20:
        family = _descendants(server)
        fresh = [p for p in family if "workers.toolhost" in _cmd(p) and "python" in _cmd(p)]
        forked = [p for p in family if "--serves toolhost" in _cmd(p)]
        if not forked and time.monotonic() - started > 3:
            return
        if forked and not fresh and len(forked) >= 4:  # its waiting parent, it, two hosts
            return
        time.sleep(0.1)


def measure_tree(checkout: Path, work: Path, workspace: Path, api: FakeMessagesAPI) -> None:
    """The session tree of `checkout`'s Warren, forked by its own server, with a tool call
    in flight."""
    warren = _warren(checkout)
    env = {**_env(checkout, work), "ANTHROPIC_BASE_URL": api.base_url}
    try:
        server = _start_server(warren, env)
        code, out = _session(warren, env, workspace, "warm up")  # the page cache, the first fork
        if code != 0:
            raise SystemExit(f"the first session failed: {out}")
        _settle(server)
        print(f"\n{checkout}: ", end="")
        _held_session(warren, env, workspace, server)
    finally:
        subprocess.run([*warren, "server", "stop"], env=env, capture_output=True)


def measure_load(
    sessions: int, concurrent: int, work: Path, workspace: Path, api: FakeMessagesAPI
) -> None:
    """`sessions` sessions, `concurrent` at a time, through one server of this checkout."""
    warren = _warren(ROOT)
    env = {**_env(ROOT, work), "ANTHROPIC_BASE_URL": api.base_url}
    failures: list[str] = []
    try:
        server = _start_server(warren, env)
        for i in range(2):  # the page cache, the first forks; a held session's whole tree
            code, out = _session(warren, env, workspace, f"warm up {i}")
            if code != 0:
                raise SystemExit(f"a first session failed: {out}")
        deadline = time.monotonic() + 10
        while server.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        before = _server_figures(server)
        load_before = os.getloadavg()
        started = time.monotonic()
        cpu_before = server.cpu_times()
        with ThreadPoolExecutor(concurrent) as pool:
            for code, out in pool.map(
                lambda i: _session(warren, env, workspace, f"session {i}"), range(sessions)
            ):
                if code != 0 or out != "done":
                    failures.append(f"{code}: {out}")
        wall = time.monotonic() - started
        cpu_after = server.cpu_times()
        deadline = time.monotonic() + 10
        while server.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        after = _server_figures(server)
        load_after = os.getloadavg()
    finally:
        subprocess.run([*warren, "server", "stop"], env=env, capture_output=True)
    # What outlives the server's stop is left behind (its spares and templates are its own,
    # and stop with it).
    with contextlib.suppress(psutil.Error):
        server.wait(30)
    left = leftovers(work, server.pid)

    print(f"\n{sessions} sessions, {concurrent} at a time, in {wall:.1f} s "
          f"(load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)")  # fmt: skip
    print(f"  exit 0 with the answer: {sessions - len(failures)} of {sessions}")
    for failure in failures[:10]:
        print(f"    failed: {failure}")
    cpu = cpu_after.user - cpu_before.user + cpu_after.system - cpu_before.system
    print(f"  the server's own CPU time for them: {cpu:.2f} s")
    for key in ("fds", "threads"):
        print(f"  server {key:8} before {before[key]:6}   after {after[key]:6}")
    for key in ("rss", "pss"):
        print(f"  server {key:8} before {before[key] / MB:6.1f} MB after {after[key] / MB:6.1f} MB")
    print(f"  server children before: {before['children']}")
    print(f"  server children after:  {after['children']}")
    extra = sorted(set(after["fd_targets"]) - set(before["fd_targets"]))
    if extra:
        print(f"  descriptors opened and not closed: {extra}")
    print(f"  processes left behind: {left or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=200, help="0: the session tree only")
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        default=None,
        metavar="CHECKOUT",
        help="measure the session tree of this checkout of Warren (with its .venv); "
        "repeatable, to compare before and after in one run (default: this one)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wsbench", dir="/tmp"))
    workspace = work / "ws"
    workspace.mkdir()
    (workspace / "a.py").write_text("print('hi')\n")
    try:
        with FakeMessagesAPI([], route=_route(workspace)) as api:
            for checkout in args.tree or [ROOT]:
                measure_tree(checkout.resolve(), work, workspace, api)
            if args.sessions:
                measure_load(args.sessions, args.concurrent, work, workspace, api)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
