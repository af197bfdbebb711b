"""What the issue 9 analyser checks cost: classification and decision, before and after.

    .venv/bin/python tests/bench/bench_analyser_cost.py [BASE]

BASE (default: the merge base with `main`) is checked out with `git archive` into a
temporary directory; the same measurement then runs in one subprocess per tree, in the same
run, alternating, and the ratios of the best medians are printed. Measured:
`BashAnalyser.classify` medians for a typical command, a long pipeline, a nested `sh -c`
script and a 9,900-character line, and
`PolicyEngine.decide` for the typical command under deny rules (`Bash(git clean:*)`,
`Read(.env)`) that the new code matches against command views and named paths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MEASURE = r"""
import json, statistics, sys, tempfile, time
from pathlib import Path
from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyEngine
from policies.files import PolicyLayer, merge_policy, parse_policy_text

COMMANDS = json.loads(sys.argv[1])
RUNS = int(sys.argv[2])
analyser = BashAnalyser()
analyser.classify("ls", floor=True)
out = {}
for name, command in COMMANDS.items():
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        analyser.classify(command, floor=True, workspace=Path("/work/repo"))
        samples.append(time.perf_counter() - start)
    out[name] = statistics.median(samples) * 1000
with tempfile.TemporaryDirectory() as tmp:
    ws = Path(tmp).resolve()
    text = '[permissions]\ndeny = ["Bash(git clean:*)", "Read(.env)"]\nallow = ["Bash(make:*)"]\n'
    layer = PolicyLayer("user", "user.toml", parse_policy_text(text, file="user.toml"), ws, True)
    engine = PolicyEngine(merge_policy(ws, [layer], home=ws), workspace=ws, floor_proven=True,
                          analyser=analyser, env={"HOME": str(ws)})
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        engine.decide("Bash", {"command": COMMANDS["typical"]}, tool_read_only=False)
        samples.append(time.perf_counter() - start)
    out["decide, typical, 2 deny rules"] = statistics.median(samples) * 1000
print(json.dumps(out))
"""

COMMANDS = {
    "typical": "git log --oneline -20 | head -5 && rg -n 'TODO' src/ 2>/dev/null",
    "long pipeline": (
        "find . -name '*.py' -not -path './.venv/*' -print0 | xargs -0 wc -l | sort -n "
        "| tail -20 && git diff --stat HEAD~3 -- src tests | tee /dev/null; echo $(date +%s)"
    ),
    "sh -c script": "timeout 5 sh -c 'cd src && git -C . status && rm -rf build/*.o'",
    "9,900 characters": "echo " + " ".join(["word"] * 1_979),
}
RUNS = 300
ROUNDS = 5


def _measure(tree: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(COMMANDS), str(RUNS)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else None
    if base is None:
        base = subprocess.run(
            ["git", "merge-base", "HEAD", "main"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        archive = subprocess.run(
            ["git", "archive", base, "policies", "sandbox"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        # Alternate the trees and keep each one's best median: the machine is shared, and
        # load that comes and goes would otherwise land on one side only.
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        for _ in range(ROUNDS):
            for tree, best in ((old, before), (ROOT, after)):
                for name, value in _measure(tree).items():
                    best[name] = min(value, best.get(name, value))
    print(f"best of {ROUNDS} alternating medians of {RUNS} runs, base {base[:12]} vs this tree")
    for name, old_ms in before.items():
        new_ms = after[name]
        print(f"  {name:32} {old_ms:8.3f} ms -> {new_ms:8.3f} ms  (x{new_ms / old_ms:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
