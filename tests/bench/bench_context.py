"""Start-up cost of gathering the context in a read-only sandbox, against the old way, in one run.

    .venv/bin/python tests/bench/bench_context.py [BASE_COMMIT] [ROUNDS]

(a) `gather_context` alone: host git + reads (old) vs the one-shot sandboxed probe (new),
    median of in-process calls on a small git repository with memory files;
(d) `warren -p` launch -> first model request, the BASE_COMMIT checkout (default: the merge
    base with `main`) vs this one, runs interleaved, medians          (budget: <= +30 ms)

The old checkout is extracted with `git archive` into a temporary directory and run with the
same interpreter (`python -m orchestrator.cli` from its directory).
"""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.conversation.context import ContextSandbox, context_spec, gather_context  # noqa: E402
from sandbox.host import detect_host  # noqa: E402
from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    for i in range(50):
        (ws / f"f{i}.py").write_text(f"x = {i}\n")
    (ws / "CLAUDE.md").write_text("Run the tests.\n" * 50)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(root)}
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "i"]):
        subprocess.run(
            ["git", "-c", "user.name=b", "-c", "user.email=b@b", *args],
            cwd=ws,
            env=env,
            check=True,
        )
    (ws / "f1.py").write_text("changed\n")
    return ws


async def _old_gather(ws: Path) -> None:
    """What start-up did before: two host git processes and host reads, concurrently."""

    async def git(*args: str) -> None:
        await trio.run_process(["git", *args], cwd=ws, capture_stdout=True, check=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(git, "rev-parse", "--abbrev-ref", "HEAD")
        nursery.start_soon(git, "status", "--short")
        for name in ("WARREN.md", "AGENTS.md", "CLAUDE.md"):
            try:
                (ws / name).read_text()
            except OSError:
                pass


async def bench_a(ws: Path, rounds: int) -> None:
    host = await detect_host()
    box = ContextSandbox(context_spec(ws), host)
    old, new = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await _old_gather(ws)
        old.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snapshot = await gather_context(ws, sandbox=box)
        new.append(time.perf_counter() - t0)
        assert snapshot.git_branch is not None and snapshot.memory
    o, n = statistics.median(old), statistics.median(new)
    print(
        f"(a) gather_context: host (old) median {o * 1000:.1f} ms, sandboxed (new) median "
        f"{n * 1000:.1f} ms (ratio {n / o:.2f}); it overlaps the SDK import at start-up"
    )


def _extract(commit: str, into: Path) -> Path:
    data = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _launch(checkout: Path, ws: Path, env: dict[str, str]) -> float:
    with FakeMessagesAPI([Reply.text("hi")]) as api:
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-p", "hello", "--cwd", str(ws)],
            cwd=checkout,
            env={**env, "ANTHROPIC_BASE_URL": api.base_url, "PYTHONPATH": str(checkout)},
            check=True,
            capture_output=True,
        )
        return api.requests[0].started_at - t0


def bench_d(ws: Path, base: str, rounds: int, tmp: Path) -> None:
    old_checkout = _extract(base, tmp / "old")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "ANTHROPIC_API_KEY": "sk-bench"}
    _launch(old_checkout, ws, env)  # warm the page cache for both
    _launch(ROOT, ws, env)
    old, new = [], []
    for _ in range(rounds):
        old.append(_launch(old_checkout, ws, env))
        new.append(_launch(ROOT, ws, env))
    o, n = statistics.median(old), statistics.median(new)
    print(
        f"(d) `warren -p` launch -> first request: {base[:10]} (old) median {o * 1000:.0f} ms, "
        f"this checkout (new) median {n * 1000:.0f} ms: {(n - o) * 1000:+.0f} ms "
        f"(ratio {n / o:.3f}; budget +30 ms)"
    )


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else ""
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    if not base:
        base = subprocess.run(
            ["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as name:
        tmp = Path(name)
        ws = _workspace(tmp)
        trio.run(bench_a, ws, rounds * 3)
        bench_d(ws, base, rounds, tmp)


if __name__ == "__main__":
    main()
