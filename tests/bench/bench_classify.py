"""Bash classification benchmark (issue "Policies", item 5): medians from one run, printed.

    .venv/bin/python tests/bench/bench_classify.py

Every Bash call the model makes is classified before it runs (and again to decide whether it
may start while the message still streams), so classification must cost far less than the
call itself. Goal: the median for a typical command <= 1 ms over 1,000 runs, with the
analyser (and its parser) created once, as the policy engine holds it.

Also printed, for scale: a one-word command, a long pipeline, a command near the
10,000-character limit, the module-level `classify()` (which builds a parser per call), and
the first call in the process (which imports tree-sitter and loads the grammar).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from policies.bash_analysis import BashAnalyser, classify  # noqa: E402

TYPICAL = "git log --oneline -20 | head -5 && rg -n 'TODO' src/ 2>/dev/null"
RUNS = 1_000
GOAL_MS = 1.0
OTHERS = {
    "one word (ls)": "ls",
    "long pipeline": (
        "find . -name '*.py' -not -path './.venv/*' -print0 | xargs -0 wc -l | sort -n "
        "| tail -20 && git diff --stat HEAD~3 -- src tests | tee /dev/null; echo $(date +%s)"
    ),
    "9,900 characters": "echo " + " ".join(["word"] * 1_979),
}


def median_ms(analyser: BashAnalyser, command: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        analyser.classify(command, floor=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> int:
    analyser = BashAnalyser()
    start = time.perf_counter()
    analyser.classify(TYPICAL, floor=True)
    first_ms = (time.perf_counter() - start) * 1000

    typical_ms = median_ms(analyser, TYPICAL, RUNS)
    verdict = "ok" if typical_ms <= GOAL_MS else "OVER GOAL"
    print(
        f"typical command, median of {RUNS}: {typical_ms:.3f} ms (goal <= {GOAL_MS} ms): {verdict}"
    )
    print(f"  {TYPICAL}")
    for label, command in OTHERS.items():
        runs = 100 if len(command) > 1_000 else RUNS
        print(f"{label}, median of {runs}: {median_ms(analyser, command, runs):.3f} ms")
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        classify(TYPICAL, floor=True)
        samples.append(time.perf_counter() - start)
    fresh_ms = statistics.median(samples) * 1000
    print(f"module-level classify() (a fresh analyser per call): {fresh_ms:.3f} ms")
    print(f"first call in this process (imports and loads the grammar): {first_ms:.3f} ms")
    return 0 if typical_ms <= GOAL_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
