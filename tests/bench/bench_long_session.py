"""A 1,000-turn session through the real `warren -p` (issue 11): does the coordinator stay flat?

    uv run python tests/bench/bench_long_session.py [--turns 1000] [--window 200000]

The model (tests/kit/long_session.py, against a server enforcing `--window`) reads one 2 KB
file per turn. Printed, measured in this one run:

- coordinator time between turns (end of a response -> next request), median of the first
  and of the last 100 turns, and their ratio (goal <= 1.2);
- the coordinator's RSS (the `warren` process, sampled at every request) after the first 100
  turns and at the end, and the growth (goal <= 30 MB);
- requests, refusals and summaries, and the connections they came on (one per session: a
  client that reconnects every turn pays a handshake per turn).

The server drops each body once answered (`keep_bodies=False`): kept, the bodies of 1,000
requests are over 1 GB of parsed JSON in this process, whose garbage collections (seconds
each, a minute in all) take a core from the process being measured.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest  # noqa: E402
from tests.kit.long_session import LongSession, make_files  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=200_000)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="warren-bench-long-", dir="/var/tmp"))
    try:
        ws = scratch / "ws"
        ws.mkdir()
        session = LongSession(make_files(ws, args.turns, 2_000), window=args.window)
        rss: list[int] = []
        pid: list[int] = []

        def route(request: RecordedRequest) -> FakeResponse | None:
            if pid:
                try:
                    rss.append(psutil.Process(pid[0]).memory_info().rss)
                except psutil.Error:
                    pass
            return session(request)

        env = {
            **os.environ,
            "XDG_STATE_HOME": str(scratch / "state"),
            "XDG_CONFIG_HOME": str(scratch / "config"),
            "ANTHROPIC_API_KEY": "sk-bench",
        }
        warren = ROOT / ".venv" / "bin" / "warren"
        with FakeMessagesAPI(route=route, keep_bodies=False) as api:
            proc = subprocess.Popen(
                [warren, "-p", "read every file", "--cwd", ws, "--max-turns", str(args.turns + 50),
                 "--permission-mode", "bypass"],
                env={**env, "ANTHROPIC_BASE_URL": api.base_url},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            pid.append(proc.pid)
            _, stderr = proc.communicate(timeout=3600)
            requests = api.requests
        if proc.returncode != 0:
            raise SystemExit(f"warren exited {proc.returncode}: {stderr[-2000:]}")
        gaps = []
        for before, after in itertools.pairwise(requests):
            assert before.ended_at is not None
            gaps.append(after.started_at - before.ended_at)
        first, last = statistics.median(gaps[1:101]), statistics.median(gaps[-100:])
        print(
            f"{args.turns} turns, window {args.window} tokens: {len(requests)} requests, "
            f"{session.refusals} refused, {session.summaries} summaries, "
            f"{len({r.connection for r in requests})} connection(s)"
        )
        print(
            f"coordinator time between turns: first 100 {first * 1000:.2f} ms, last 100 "
            f"{last * 1000:.2f} ms, ratio {last / first:.2f} (goal <= 1.2)"
        )
        if len(rss) > 100:
            early, end = rss[100], rss[-1]
            print(
                f"coordinator RSS: after 100 turns {early / 2**20:.1f} MB, at the end "
                f"{end / 2**20:.1f} MB, growth {(end - early) / 2**20:+.1f} MB (goal <= 30 MB)"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
