"""Session benchmarks (issue 10, items 1 and 5): what the Session and the budget add.

    .venv/bin/python tests/bench/bench_session.py [BASE_COMMIT]     (default: main)

(a) `warren -p` launch -> first model request, this tree beside BASE (its files taken with
    `git archive`, run by the same interpreter), runs interleaved, medians; goal <= 30 ms
(b) the broker's budget estimate of one request (characters of its JSON / 4) beside the
    request's own serialisation for the SDK, on a 10- and a 1,000-message history
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.messages import Message, TextBlock  # noqa: E402
from orchestrator.model.base import ModelRequest  # noqa: E402
from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402
from workers.broker import estimate_input_tokens  # noqa: E402


def _tree_at(commit: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _launch(tree: Path, ws: Path, state: str) -> float:
    env = {
        **os.environ,
        "XDG_STATE_HOME": state,
        "ANTHROPIC_API_KEY": "sk-bench",
        "PYTHONPATH": str(tree),
    }
    with FakeMessagesAPI([Reply.text("hi")]) as api:
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-p", "hello", "--cwd", str(ws)],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            cwd=tree,
            check=True,
            capture_output=True,
        )
        return api.requests[0].started_at - t0


def bench_a(base: str, runs: int = 9) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = _tree_at(base, Path(tmp) / "base")
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "README.md").write_text("a workspace\n")
        times: dict[str, list[float]] = {"base": [], "this": []}
        for _ in range(runs):
            times["base"].append(_launch(old, ws, str(Path(tmp) / "state-base")))
            times["this"].append(_launch(ROOT, ws, str(Path(tmp) / "state-this")))
    was, now = statistics.median(times["base"]), statistics.median(times["this"])
    print(
        f"(a) launch -> first request: {base} median {was * 1000:.0f} ms, this tree median "
        f"{now * 1000:.0f} ms: {(now - was) * 1000:+.0f} ms (ratio {now / was:.3f}, goal <= +30 ms)"
    )


def bench_b() -> None:
    for size in (10, 1_000):
        messages = [
            Message(role="user" if i % 2 == 0 else "assistant", content=[TextBlock(text="x" * 400)])
            for i in range(size)
        ]
        request = ModelRequest(system=["You are Warren."] * 3, messages=messages)
        rounds = 50
        t0 = time.perf_counter()
        for _ in range(rounds):
            estimate_input_tokens(request)
        estimate = (time.perf_counter() - t0) / rounds
        t0 = time.perf_counter()
        for _ in range(rounds):
            json.dumps([m.to_api() for m in request.messages])
        serialise = (time.perf_counter() - t0) / rounds
        print(
            f"(b) {size:5d} messages: estimate {estimate * 1e3:.3f} ms, the request's own "
            f"serialisation {serialise * 1e3:.3f} ms (ratio {estimate / serialise:.2f})"
        )


if __name__ == "__main__":
    bench_b()
    bench_a(sys.argv[1] if len(sys.argv) > 1 else "main")
