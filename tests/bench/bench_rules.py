"""Path-rule matching, wcmatch globs against the hand-written regex they replaced, one run.

    .venv/bin/python tests/bench/bench_rules.py [OLD_REV]

OLD_REV (default a293442, the last commit with the hand-written glob-to-regex) names the
commit whose `policies/rules.py` is loaded from git as the old way. Prints, for the rules of
a realistic policy plus the floor's default read masks, the median time to ask every rule
about one path (what `PolicyEngine.decide` does per path tool call), the time to compile the
rules (policy load, start-up), and the one-off cost of the first glob match (wcmatch import).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from policies import rules as new  # noqa: E402
from sandbox.spec import DEFAULT_DENY_READ  # noqa: E402

RUNS = 3000
WS = Path("/work/repo")
HOME = Path("/home/ann")
SPECS = [
    "Read(~/notes/**)",
    "Read(~/.netrc)",
    "Edit(src/**)",
    "Edit(tests/**)",
    "Write(docs/**/*.md)",
    "Edit(src/generated/**)",
    "Read(.env)",
    "Read(secrets/**)",
    "Edit(vendor/**)",
    "Read(*.pem)",
    "Edit(**/migrations/*.sql)",
    *(f"Read(//{p.lstrip('/')})" for p in DEFAULT_DENY_READ if p.startswith("/")),
    *(f"Read({p})" for p in DEFAULT_DENY_READ if p.startswith("~/")),
]
PATHS = [
    "/work/repo/src/app/main.py",
    "/work/repo/docs/guide/intro.md",
    "/work/repo/a/b/c/d/e/f/g/deep_module_name.py",
    "/etc/ssh/ssh_host_rsa_key",
    "/home/ann/.ssh/id_rsa",
]


def load_old(rev: str) -> ModuleType:
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:policies/rules.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("old_rules", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_rules"] = module
    exec(compile(text, "old_rules.py", "exec"), module.__dict__)
    return module


def compiled(module: ModuleType) -> list[object]:
    out = []
    for text in SPECS:
        parsed = module.parse_rule(text)
        out.append(module.compile_rule(parsed, anchor=WS, workspace=WS, home=HOME))
    return out


def median_us(step: object, runs: int = RUNS) -> float:
    assert callable(step)
    step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "a293442"
    start = time.perf_counter()
    new_rules = compiled(new)
    for rule in new_rules:  # the first glob match pays for importing wcmatch
        rule.matches_path(tuple(PATHS))  # type: ignore[attr-defined]
    first_use_ms = (time.perf_counter() - start) * 1000
    old = load_old(rev)
    old_rules = compiled(old)
    for label, module in (("old", old), ("new", new)):
        load = median_us(lambda module=module: compiled(module), runs=200)
        print(f"{label}: compile {len(SPECS)} rules: {load:8.1f} us")
    print(f"new: first compile + first match of every rule (wcmatch import): {first_use_ms:.1f} ms")
    for path in PATHS:
        results = []
        for rules in (old_rules, new_rules):

            def step(rules: list[object] = rules, path: str = path) -> list[bool]:
                return [r.matches_path((path,)) for r in rules]  # type: ignore[attr-defined]

            results.append((median_us(step), step()))
        (old_us, old_hits), (new_us, new_hits) = results
        assert old_hits == new_hits, (path, old_hits, new_hits)
        print(
            f"{path:<46} all {len(SPECS)} rules: old {old_us:6.1f} us  new {new_us:6.1f} us"
            f"  new/old {new_us / old_us:4.2f}"
        )


if __name__ == "__main__":
    main()
