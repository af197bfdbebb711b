"""Policy engine micro-benchmark: median `PolicyEngine.decide` time per call, one run each.

    .venv/bin/python tests/bench/bench_policy.py
    (or: .venv/bin/python -m tests.bench.bench_policy)

(a) Bash `git diff --stat | head -20` (read-only, analysed)   (goal <= 1 ms)
(b) Bash `npm run test -- --watch=false` (allowed by a rule)  (goal <= 1 ms)
(c) Edit of a file in the workspace (allowed by a path rule)  (goal <= 1 ms)
(d) Read of a file in the workspace (built-in read-only)      (for information)

The policy has a realistic size: every level filled with a few rules, the floor proven.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.tools.registry import builtin_facts  # noqa: E402
from policies.engine import PolicyDecision, PolicyEngine  # noqa: E402
from policies.files import (  # noqa: E402
    PolicyPaths,
    command_line_policy,
    load_effective_policy,
)
from policies.trust import TrustStore  # noqa: E402

RUNS = 2000

USER = """\
[permissions]
allow = ["Bash(git log:*)", "Read(~/notes/**)"]
ask = ["Bash(git push:*)"]
deny = ["Bash(curl:*)", "Bash(wget:*)", "Read(~/.netrc)"]
"""
PROJECT = """\
[permissions]
allow = ["Bash(npm run test:*)", "Bash(npm run lint:*)", "Bash(make check)", "Edit(src/**)",
         "Edit(tests/**)", "Write(docs/**/*.md)"]
ask = ["Edit(src/generated/**)"]
deny = ["Read(.env)", "Read(secrets/**)", "Edit(vendor/**)"]
"""


def median_ms(step: Callable[[], PolicyDecision], runs: int = RUNS) -> tuple[float, str]:
    decision = step()  # warm-up: loads the parser
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, decision.decision


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        ws = root / "repo"
        (ws / ".warren").mkdir(parents=True)
        (ws / "src").mkdir()
        (ws / ".warren/policy.toml").write_text(PROJECT)
        env = {"HOME": str(root / "home"), "XDG_CONFIG_HOME": str(root / "config")}
        (root / "config/warren").mkdir(parents=True)
        (root / "config/warren/policy.toml").write_text(USER)
        store = TrustStore(root / "trust.json")
        store.trust(ws)
        policy = load_effective_policy(
            ws,
            command_line=command_line_policy(allowed_tools=["Bash(make build)"]),
            paths=PolicyPaths.for_workspace(ws, env=env, managed=None),
            trust_store=store,
            env=env,
        )
        engine = PolicyEngine(
            policy, workspace=ws, floor_proven=True, env=env, tool_facts=builtin_facts()
        )
        cases = [
            ("(a) Bash read-only ", "Bash", {"command": "git diff --stat | head -20"}, False),
            ("(b) Bash by a rule ", "Bash", {"command": "npm run test -- --watch=false"}, False),
            ("(c) Edit by a rule ", "Edit", {"file_path": str(ws / "src/app/main.py")}, False),
            ("(d) Read read-only ", "Read", {"file_path": str(ws / "src/app/main.py")}, True),
        ]
        for label, tool, input, read_only in cases:

            def step(
                tool: str = tool, input: dict[str, str] = input, read_only: bool = read_only
            ) -> PolicyDecision:
                return engine.decide(tool, input, tool_read_only=read_only)

            ms, decision = median_ms(step)
            goal = "" if label.startswith("(d)") else " (goal <= 1 ms)"
            print(f"{label} -> {decision:<5} median of {RUNS}: {ms:.3f} ms{goal}")


if __name__ == "__main__":
    main()
