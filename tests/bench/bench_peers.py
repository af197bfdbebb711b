"""Warren next to Claude Code on the peer harness's scenarios, interleaved (issue 15's "4-turn
session wall, 5 parallel `sleep 1` wall: below Claude Code's").

    uv sync --frozen --compile-bytecode
    uv run python tests/bench/bench_peers.py [--rounds 5] [--scenario cc_read5_edit_bash]...
        [--no-warm] [--no-claude]

Each round runs every scenario once per variant, one after the other, through
`../shared/peers/run_peer.py` (its fake API, a fresh repository and HOME per run):

- `warren`: this checkout as the harness runs it (`.venv/bin/warren -p`; its TMPDIR is fresh
  per run, so no server is found: the run is in-process);
- `warren-warm`: the same with `WARREN_SERVER_DIR` pointing at a `warren server` this bench
  started (its session processes are forked from it), stopped at the end;
- `claude`: Claude Code (`$CLAUDE_BIN`, else where the harness's README installs it).

Printed per scenario: the medians of wall, launch -> first model request, each turnaround
(a response's end -> the next request), last message_stop -> exit and the process tree's
peak PSS, with Warren's ratios to Claude Code and the load average before and after.
Everything the harness wrote stays under `--out` (default: a temporary directory, kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PEERS = next(
    (p for p in (ROOT.parent / "shared" / "peers", ROOT.parents[1] / "shared" / "peers")
     if p.is_dir()),
    ROOT.parent / "shared" / "peers",
)  # fmt: skip
CLAUDE_BIN = Path(
    os.environ.get("CLAUDE_BIN")
    or Path.home() / "peers/cc/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
)
PYTHON = ROOT / ".venv" / "bin" / "python"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"  # the harness's


def _server_env(work: Path) -> dict[str, str]:
    (work / "home").mkdir(exist_ok=True)
    return {
        "PATH": f"{PYTHON.parent}:{BASE_PATH}",
        "HOME": str(work / "home"),
        "LANG": "C.UTF-8",
        "WARREN_SERVER_DIR": str(work / "srv"),
    }


def _start_server(work: Path) -> None:
    env = _server_env(work)
    warren = [str(PYTHON), "-m", "orchestrator.cli", "server"]
    subprocess.run([*warren, "start"], env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = subprocess.run([*warren, "status"], env=env, capture_output=True, text=True)
        if "floor proven" in status.stdout and "not proven" not in status.stdout:
            return
        time.sleep(0.1)
    raise SystemExit("the warm server never proved the floor")


def _server_status(work: Path) -> str:
    warren = [str(PYTHON), "-m", "orchestrator.cli", "server", "status"]
    return subprocess.run(warren, env=_server_env(work), capture_output=True, text=True).stdout


def _stop_server(work: Path) -> None:
    warren = [str(PYTHON), "-m", "orchestrator.cli", "server", "stop"]
    subprocess.run(warren, env=_server_env(work), capture_output=True)


def _warm_scenario(scenario: Path, work: Path) -> Path:
    """A copy of `scenario` whose runs find the bench's server."""
    data = json.loads(scenario.read_text())
    data["env"] = {**data.get("env", {}), "WARREN_SERVER_DIR": str(work / "srv")}
    copy = work / "scenarios" / scenario.name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(json.dumps(data))
    return copy


def _run(peer: str, scenario: Path, out: Path) -> dict[str, Any]:
    env = {**os.environ, "WARREN_CHECKOUT": str(ROOT), "CLAUDE_BIN": str(CLAUDE_BIN)}
    subprocess.run(
        [sys.executable, str(PEERS / "run_peer.py"), "--peer", peer, "--scenario",
         str(scenario), "--runs", "1", "--out", str(out)],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    metrics: dict[str, Any] = json.loads((out / "run0" / "metrics.json").read_text())
    return metrics


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _figures(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    ok = [r for r in runs if r.get("ok")]
    figures: dict[str, float | None] = {
        "wall": _median([r["wall_s"] for r in ok]),
        "first request": _median(
            [r["first_messages_request_s"] for r in ok if r.get("first_messages_request_s")]
        ),
        "exit after last stop": _median(
            [r["exit_after_last_stop_s"] for r in ok if r.get("exit_after_last_stop_s")]
        ),
        "tree peak PSS MB": _median([r["tree_peak_pss_mb"] for r in ok]),
    }
    turns = max((len(r["main_turns"]) for r in ok), default=0)
    for i in range(turns - 1):
        figures[f"turnaround {i + 1}"] = _median(
            [
                r["main_turns"][i]["turnaround_s"]
                for r in ok
                if i < len(r["main_turns"]) and "turnaround_s" in r["main_turns"][i]
            ]
        )
    figures["ok runs"] = float(len(ok))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenario", action="append", default=None)
    parser.add_argument("--no-warm", action="store_true")
    parser.add_argument("--no-claude", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = args.scenario or ["cc_read5_edit_bash", "cc_bash_sleep5"]
    out = args.out or Path(tempfile.mkdtemp(prefix="wpeers", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="wpw", dir="/tmp"))  # short: the socket's path
    variants = ["warren"] + ([] if args.no_warm else ["warren-warm"])
    if not args.no_claude and CLAUDE_BIN.is_file():
        variants.append("claude")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    load_before = os.getloadavg()
    try:
        if "warren-warm" in variants:
            _start_server(work)
        for round_ in range(args.rounds):
            for name in names:
                scenario = PEERS / "scenarios" / f"{name}.json"
                for variant in variants:
                    peer = "claude" if variant == "claude" else "warren"
                    path = _warm_scenario(scenario, work) if variant == "warren-warm" else scenario
                    metrics = _run(peer, path, out / f"{variant}-{name}" / f"round{round_}")
                    runs.setdefault((variant, name), []).append(metrics)
                    print(f"round {round_} {name:20} {variant:12} ok={metrics.get('ok')} "
                          f"wall={metrics.get('wall_s')} load={os.getloadavg()[0]:.2f}",
                          flush=True)  # fmt: skip
        if "warren-warm" in variants:
            print(f"warm server: {_server_status(work).strip()}")
    finally:
        _stop_server(work)
    load_after = os.getloadavg()
    print(f"\nmedians of {args.rounds} interleaved rounds (load average {load_before[0]:.2f} "
          f"before, {load_after[0]:.2f} after; runs under {out})")  # fmt: skip
    for name in names:
        table = {v: _figures(runs[(v, name)]) for v in variants}
        print(f"\n{name}")
        print(f"  {'figure':22}" + "".join(f"{v:>14}" for v in variants)
              + ("".join(f"{v + '/cc':>16}" for v in variants if v != "claude")
                 if "claude" in variants else ""))  # fmt: skip
        keys = sorted({k for figures in table.values() for k in figures}, key=_order)
        for key in keys:
            cells = [table[v].get(key) for v in variants]
            line = f"  {key:22}" + "".join(
                f"{'-':>14}" if c is None else f"{c:14.3f}" for c in cells
            )
            theirs = table.get("claude", {}).get(key)
            if theirs and key != "ok runs":
                for v in variants:
                    ours = table[v].get(key)
                    if v != "claude":
                        line += f"{'-':>16}" if ours is None else f"{ours / theirs:15.2f}x"
            print(line)


def _order(key: str) -> tuple[int, str]:
    first = ["ok runs", "wall", "first request"]
    return (first.index(key), "") if key in first else (len(first), key)


if __name__ == "__main__":
    main()
