"""Start-up and exit of a real `warren -p` run, with and without the warm server (issue 15).

    uv run python tests/bench/bench_startup.py [--rounds 5]

Against one fake Messages API server on 127.0.0.1, interleaved, the median over the rounds:

- warm launch -> first model request: `warren -p` handed to a running `warren server`;
- cold launch -> first model request: `warren -p --no-server`, next to the time of
  `python -c "import anthropic"` (the floor no in-process trick gets under);
- last message_stop -> process exit, warm and cold;
- first tool turnaround, warm and cold: the end of the reply asking for a Read
  (`message_stop`) -> the next request (with its tool_result); and the second, the hosts
  long up, for scale (under load both grow, and the ratio stays). Warm, the server's spare
  tool hosts serve the session (orchestrator/cli/warm/spares.py); cold, they start alongside
  the first request (`--no-server`).

A session of two turns (a Read, then the answer) in a small workspace (the tool hosts
start; a cold run proves the floor, a warm one reuses the proof its server made,
`sandbox.probe.reuse_floor`). The server runs in a private directory and is stopped at the
end. The load average is printed with the figures: on a busy machine they are noise.

Side by side: when Claude Code is installed (`$CLAUDE_BIN`, else where `../shared/peers/`
installs it: `~/peers/cc/node_modules/@anthropic-ai/claude-code/bin/claude.exe`), each round
also runs `claude -p` against the same fake API (the peer harness's environment: a fresh
HOME, no non-essential traffic), and its figures and the ratios are printed next to
Warren's. `--no-peer` leaves it out.
"""

from __future__ import annotations

import argparse
import itertools
import json
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
) -> tuple[float, float, float, float]:
    """(launch -> first request, last message_stop -> exit, first and second tool
    turnaround) of one run, in seconds."""
    before = len(api.requests)
    _add_turns(api, cwd)
    launched = time.monotonic()
    done = subprocess.run([*WARREN, "-p", "hi", *args], env=env, cwd=cwd, capture_output=True)
    exited = time.monotonic()
    if done.returncode != 0:
        raise SystemExit(f"warren failed: {done.stderr.decode()}")
    request = api.requests[before]
    last = api.requests[-1]
    return (
        request.started_at - launched,
        exited - last.event_time("message_stop"),
        *_turnarounds(api, before),
    )


def _add_turns(api: FakeMessagesAPI, cwd: Path) -> None:
    api.add(Reply.tool_use("Read", {"file_path": str(cwd / "a.py")}))
    api.add(Reply.tool_use("Read", {"file_path": str(cwd / "b.py")}))
    api.add(Reply.text("done"))


def _turnarounds(api: FakeMessagesAPI, before: int) -> tuple[float, float]:
    """The end of a reply asking for a Read -> the request carrying its result: the first,
    and the second (the hosts long up: a turnaround without any start-up, for scale)."""
    requests = api.requests[before:]
    found = [
        request.started_at - previous.event_time("message_stop")
        for previous, request in itertools.pairwise(requests)
        if "tool_result" in json.dumps(request.messages[-1:])
    ]
    if len(found) < 2:
        raise SystemExit("fewer than two requests carried a tool_result")
    return found[0], found[1]


CLAUDE_BIN = Path(
    os.environ.get("CLAUDE_BIN")
    or Path.home() / "peers/cc/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
)


def _claude_env(work: Path, api: FakeMessagesAPI) -> dict[str, str]:
    """What `../shared/peers/run_peer.py` gives Claude Code: a fresh HOME, the fake API, no
    telemetry, updates or other side traffic."""
    for name in ("home", "tmp"):
        (work / name).mkdir(exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(work / "home"),
        "TERM": "dumb",
        "LANG": "C.UTF-8",
        "IS_SANDBOX": "1",  # root + --dangerously-skip-permissions
        "ANTHROPIC_BASE_URL": api.base_url,
        "ANTHROPIC_API_KEY": "sk-bench",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_TMPDIR": str(work / "tmp"),
        "TMPDIR": str(work / "tmp"),
    }


def _run_claude(
    env: dict[str, str], cwd: Path, api: FakeMessagesAPI
) -> tuple[float, float, float, float]:
    """`_run`'s figures for one `claude -p` run."""
    before = len(api.requests)
    _add_turns(api, cwd)
    argv = [str(CLAUDE_BIN), "-p", "hi", "--output-format", "stream-json", "--verbose",
            "--dangerously-skip-permissions"]  # fmt: skip
    launched = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True)
    exited = time.monotonic()
    if done.returncode != 0 or len(api.requests) <= before:
        raise SystemExit(f"claude failed: {done.stderr.decode()[-500:]}")
    first, last = api.requests[before], api.requests[-1]
    return (
        first.started_at - launched,
        exited - last.event_time("message_stop"),
        *_turnarounds(api, before),
    )


def _import_anthropic() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import anthropic"], check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-peer", action="store_true", help="leave Claude Code out")
    args = parser.parse_args()
    rounds = args.rounds
    peer = not args.no_peer and CLAUDE_BIN.is_file()
    work = Path(tempfile.mkdtemp(prefix="wbench", dir="/tmp"))
    (work / "ws").mkdir()
    (work / "ws" / "a.py").write_text("print('hi')\n")
    (work / "ws" / "b.py").write_text("print('ho')\n")
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
    warm: list[tuple[float, float, float, float]] = []
    cold: list[tuple[float, float, float, float]] = []
    claude: list[tuple[float, float, float, float]] = []
    imports: list[float] = []
    try:
        with FakeMessagesAPI([]) as api:
            env["ANTHROPIC_BASE_URL"] = api.base_url
            subprocess.run([*WARREN, "server", "start"], env=env, check=True, capture_output=True)
            _run([], env, work / "ws", api)  # the first session process warms the page cache
            claude_env = _claude_env(work, api) if peer else {}
            if peer:
                _run_claude(claude_env, work / "ws", api)  # and Claude Code's first run
            for _ in range(rounds):
                warm.append(_run([], env, work / "ws", api))
                cold.append(_run(["--no-server"], env, work / "ws", api))
                if peer:
                    claude.append(_run_claude(claude_env, work / "ws", api))
                imports.append(_import_anthropic())
    finally:
        subprocess.run([*WARREN, "server", "stop"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()[0]

    def median(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:7.0f} ms"

    def versus(ours: list[float], theirs: list[float]) -> str:
        if not theirs:
            return ""
        ratio = statistics.median(ours) / statistics.median(theirs)
        return f"   Claude Code {median(theirs)}   ratio {ratio:4.2f}x"

    launch = [c[0] for c in claude]
    leave = [c[1] for c in claude]
    turn = [c[2] for c in claude]
    later = [c[3] for c in claude]
    print(f"warren start-up, median of {rounds} interleaved rounds "
          f"(load average {load_before:.2f} before, {load_after:.2f} after)")  # fmt: skip
    if not peer:
        print("  (Claude Code not measured: --no-peer, or no binary at $CLAUDE_BIN / "
              f"{CLAUDE_BIN})")  # fmt: skip
    print(f"  warm launch -> first request     {median([w[0] for w in warm])}"
          f"{versus([w[0] for w in warm], launch)}")  # fmt: skip
    print(f"  cold launch -> first request     {median([c[0] for c in cold])}"
          f"{versus([c[0] for c in cold], launch)}")  # fmt: skip
    print(f"  python -c 'import anthropic'     {median(imports)}")
    print(f"  warm last message_stop -> exit   {median([w[1] for w in warm])}"
          f"{versus([w[1] for w in warm], leave)}")  # fmt: skip
    print(f"  cold last message_stop -> exit   {median([c[1] for c in cold])}"
          f"{versus([c[1] for c in cold], leave)}")  # fmt: skip
    print(f"  warm first tool turnaround       {median([w[2] for w in warm])}"
          f"{versus([w[2] for w in warm], turn)}")  # fmt: skip
    print(f"  cold first tool turnaround       {median([c[2] for c in cold])}"
          f"{versus([c[2] for c in cold], turn)}")  # fmt: skip
    print(f"  warm second tool turnaround      {median([w[3] for w in warm])}"
          f"{versus([w[3] for w in warm], later)}")  # fmt: skip


if __name__ == "__main__":
    main()
