"""Warm tool hosts through a real server (orchestrator/cli/warm/spares.py): real sessions (a
scripted model reading a file), real spares under the floor. Which host served a session is
told by pid (the session's log names each host's bwrap pid, the server's status its spares),
never by timing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import psutil

from tests.kit.keeper_loop import spare_waiting
from tests.orchestrator.server.conftest import WARREN, Server
from tests.orchestrator.server.test_fast_exit import alive


def test_a_spare_serves_one_identical_session_once(server: Server, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / ".warren").mkdir(parents=True)
    policy = workspace / ".warren" / "policy.toml"
    policy.write_text('[permissions]\ndeny = ["Read(nothing-here.txt)"]\n')
    (workspace / "a.txt").write_text("hello\n")
    (workspace / "secret.txt").write_text("s3cret\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"content": [{"type": "tool_use", "name": "Read",
                      "input": {"file_path": str(workspace / "a.txt")}}]},
        {"content": [{"type": "text", "text": "read it"}]},
    ]))  # fmt: skip
    state = tmp_path / "state"
    server.env = {
        **server.env,
        "XDG_STATE_HOME": str(state),
        "XDG_CONFIG_HOME": str(tmp_path),
        "ANTHROPIC_API_KEY": "sk-warm-secret",  # each session's; never a spare's
    }
    pid = server.start(entry=None)
    before = _tree(workspace)

    def session() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*WARREN, "-p", "read", "--model", f"scripted:{script}"], env=server.env,
            cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run() -> dict[str, tuple[int, bool]]:
        seen = set(state.glob("warren/logs/*.log"))
        done = session()
        out, err = done.communicate(timeout=180)
        assert (done.returncode, out.strip()) == (0, "read it"), err
        (log,) = set(state.glob("warren/logs/*.log")) - seen
        return _hosts(log)

    cold = run()
    assert not any(warm for _, warm in cold.values()), cold  # nothing to adopt yet
    spares = _spares(server, SLOTS)
    assert not spares & {p for p, _ in cold.values()}
    born = _born(spares)
    hosts = _tool_hosts(spares)
    _until_idle(hosts)
    # The idle read-write spare left the user's tree byte-identical.
    assert _tree(workspace) == before
    for spare in spares:
        for process in [psutil.Process(spare), *psutil.Process(spare).children(recursive=True)]:
            assert "sk-warm-secret" not in json.dumps(process.environ())

    warm = run()
    # The spares served it, by pid: its read-only host at least (the session starts both in
    # the background and reads only, so it may end before the read-write one is ready).
    assert "read_only" in warm and {p for p, _ in warm.values()} <= hosts, warm
    assert all(w for _, w in warm.values()), warm
    again = _spares(server, SLOTS)  # replaced once that session ended
    assert not _born(again) & born  # never handed out twice (a pid may come round again)

    # A changed deny rule: the session's own recipe differs, so it starts cold.
    policy.write_text('[permissions]\ndeny = ["Read(secret.txt)"]\n')
    changed = run()
    assert not any(w for _, w in changed.values()), changed
    assert not {p for p, _ in changed.values()} & again

    # Two sessions at once: each spare goes to one of them at most. (The spares of the old
    # recipe were stopped when that session ended, for ones of its recipe.)
    fresh = _spares(server, SLOTS, excluding=again)
    _until_idle(_tool_hosts(fresh))
    seen = set(state.glob("warren/logs/*.log"))
    runs = [session(), session()]
    for done in runs:
        out, err = done.communicate(timeout=180)
        assert (done.returncode, out.strip()) == (0, "read it"), err
    logs = set(state.glob("warren/logs/*.log")) - seen
    adopted = [p for log in logs for p, w in _hosts(log).values() if w]
    # (A spare handed out is replaced at once, so the second may adopt a replacement.)
    assert len(adopted) == len(set(adopted)), adopted
    assert set(adopted) & fresh and not set(adopted) & (spares | again), adopted

    replacements = _spares(server, SLOTS, excluding=fresh)  # before the family is listed
    family = psutil.Process(pid).children(recursive=True)
    assert replacements <= {p.pid for p in family}
    stop = subprocess.run(
        [*WARREN, "server", "stop"], env=server.env, capture_output=True, text=True, timeout=60
    )
    assert stop.returncode == 0, stop.stderr
    assert server.process is not None
    server.process.wait(30)
    assert alive(family) == []  # spares, their sandboxes and sessions: all gone


SLOTS = 3
"""A workspace's spares: its two tool hosts and its context probe's sandbox
(tests/orchestrator/server/test_warm_context_e2e.py)."""


def _tool_hosts(spares: set[int]) -> set[int]:
    """The tool hosts among the spares (not the context probe's)."""
    hosts = {
        pid
        for pid in spares
        if not any("context_probe.py" in part for part in psutil.Process(pid).cmdline())
    }
    assert len(hosts) == 2, (spares, hosts)
    return hosts


def _tree(root: Path) -> list[str]:
    """`find . -printf '%p %y %m'` with each file's digest and each entry's mtime."""
    lines = []
    for path in sorted([root, *root.rglob("*")]):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        lines.append(f"{path} {oct(info.st_mode)} {info.st_mtime_ns} {digest}")
    return lines


def _hosts(log: Path) -> dict[str, tuple[int, bool]]:
    """The tool hosts a session's log says it had: role -> (bwrap pid, adopted)."""
    found = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "tool host ready":
            found[event["role"]] = (event["pid"], event["warm"])
    return found


def _born(pids: set[int]) -> set[tuple[int, float]]:
    """Each live process of `pids` as (pid, start time): one process, even after this machine
    (pid_max 32768 under a busy test run) has handed its pid to another."""
    found = set()
    for pid in pids:
        try:
            found.add((pid, psutil.Process(pid).create_time()))
        except psutil.NoSuchProcess:
            pass
    return found


def _spares(server: Server, count: int, excluding: set[int] = frozenset()) -> set[int]:  # type: ignore[assignment]
    """The server's idle spares' pids, once it has `count` (none of them in `excluding`)."""
    deadline = time.monotonic() + 120
    while True:
        pids = server.status().get("spare_pids")
        assert isinstance(pids, list)
        # Fresh tool hosts stand in while the template warms, then give way to forked ones.
        if len(pids) == count and not set(pids) & excluding and _forked(set(pids)):
            return set(pids)
        assert time.monotonic() < deadline, f"the server has {pids} spares, not {count}"
        time.sleep(0.05)


def _forked(spares: set[int]) -> bool:
    """The tool hosts among `spares` are forked from the workspace's template
    (orchestrator/cli/warm/host_template.py), whose command line they carry."""
    try:
        hosts = [
            psutil.Process(pid).cmdline()
            for pid in spares
            if not any("context_probe.py" in part for part in psutil.Process(pid).cmdline())
        ]
    except psutil.Error:
        return False
    return len(hosts) == 2 and all("workers.zygote" in command for command in hosts)


def _until_idle(spares: set[int]) -> None:
    """Until each spare's tool host waits for its first message (sent `Ready`, idle in
    trio's epoll wait)."""
    deadline = time.monotonic() + 120
    for pid in spares:
        while not spare_waiting(pid):
            assert time.monotonic() < deadline, f"spare {pid} never became idle"
            time.sleep(0.05)
