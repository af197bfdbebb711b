"""Start-up and exit of a real `warren -p` run, with and without the warm server (issue 15).

    uv run python tests/bench/bench_startup.py [--rounds 5]

Against one fake Messages API server on 127.0.0.1, interleaved, the median over the rounds:

- warm launch -> first model request: `warren -p` handed to a running `warren server`;
- cold launch -> first model request: `warren -p --no-server`, next to the time of
  `python -c "import anthropic"` (the floor no in-process trick gets under);
- last message_stop -> process exit, warm and cold.

A session of one turn in a small workspace (the tool hosts start; a cold run proves the
floor, a warm one reuses the proof its server made, `sandbox.probe.reuse_floor`). The
server runs in a private directory and is stopped at the end. The load average is printed
with the figures: on a busy machine they are noise. Claude Code's figures are not measured
here (`../shared/peers/` has its harness).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402

WARREN = [sys.executable, "-m", "orchestrator.cli"]


def _run(
    args: list[str], env: dict[str, str], cwd: Path, api: FakeMessagesAPI
) -> tuple[float, float]:
    """(launch -> first request, last message_stop -> exit) of one run, in seconds."""
    before = len(api.requests)
    api.add(Reply.text("done"))
    launched = time.monotonic()
    done = subprocess.run([*WARREN, "-p", "hi", *args], env=env, cwd=cwd, capture_output=True)
    exited = time.monotonic()
    if done.returncode != 0:
        raise SystemExit(f"warren failed: {done.stderr.decode()}")
    request = api.requests[before]
    return request.started_at - launched, exited - request.event_time("message_stop")


def _import_anthropic() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import anthropic"], check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    work = Path(tempfile.mkdtemp(prefix="wbench", dir="/tmp"))
    (work / "ws").mkdir()
    (work / "ws" / "a.py").write_text("print('hi')\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WARREN_SERVER_DIR": str(work / "srv"),
        "XDG_STATE_HOME": str(work / "state"),
        "XDG_CONFIG_HOME": str(work / "config"),
        "ANTHROPIC_API_KEY": "sk-bench",
    }
    env.pop("WARREN_NO_SERVER", None)
    load_before = os.getloadavg()[0]
    warm: list[tuple[float, float]] = []
    cold: list[tuple[float, float]] = []
    imports: list[float] = []
    try:
        with FakeMessagesAPI([]) as api:
            env["ANTHROPIC_BASE_URL"] = api.base_url
            subprocess.run([*WARREN, "server", "start"], env=env, check=True, capture_output=True)
            _run([], env, work / "ws", api)  # the first session process warms the page cache
            for _ in range(rounds):
                warm.append(_run([], env, work / "ws", api))
                cold.append(_run(["--no-server"], env, work / "ws", api))
                imports.append(_import_anthropic())
    finally:
        subprocess.run([*WARREN, "server", "stop"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:7.0f} ms"

    print(f"warren start-up, median of {rounds} interleaved rounds "
          f"(load average {load_before:.2f} before, {load_after:.2f} after)")  # fmt: skip
    print(f"  warm launch -> first request     {median([w[0] for w in warm])}")
    print(f"  cold launch -> first request     {median([c[0] for c in cold])}")
    print(f"  python -c 'import anthropic'     {median(imports)}")
    print(f"  warm last message_stop -> exit   {median([w[1] for w in warm])}")
    print(f"  cold last message_stop -> exit   {median([c[1] for c in cold])}")


if __name__ == "__main__":
    main()
