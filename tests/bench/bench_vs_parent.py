"""What hardening costs, measured in one run against an older commit (issue "Keep the floor's
promise": <= 1 ms per tool call median on a 10,000-file workspace; launch -> first model
request no more than 30 ms slower).

    uv run python tests/bench/bench_vs_parent.py --base REV [--rounds 5]

Builds REV in a temporary git worktree (its own `.venv`), then runs the real `warren -p` of
both trees, interleaved, against one fake Messages API server on 127.0.0.1:

- launch -> first request: the median over the rounds of each tree;
- per tool call: a 10,000-file git workspace (fresh copy per run), a scripted session of
  Read / Grep / read-only Bash / Edit / writable Bash calls (one per turn); the cost of a call
  is the gap between the end of the reply that asked for it and the arrival of the next
  request, the median per kind over all rounds.

Both trees see the same server, workspace and script; only the code differs. Both are
prepared alike, as an install would leave them: `uv sync --frozen --compile-bytecode` and
Warren's own packages byte-compiled (this machine sets PYTHONDONTWRITEBYTECODE, so a tree
that is not compiled recompiles every module it imports at each start, in the coordinator
and in every tool host). The load average is printed before and after: numbers taken on a
loaded machine are noise.
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
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402

FILES = 10_000
CALLS_PER_KIND = 12


def make_workspace(path: Path) -> None:
    """10,000 small Python files in 100 packages, committed."""
    for d in range(FILES // 100):
        pkg = path / f"pkg{d:03d}"
        pkg.mkdir(parents=True)
        for f in range(100):
            (pkg / f"mod{f:03d}.py").write_text(
                f"def f{f}(x):\n    return x + {f}  # marker{d}\n" * 5
            )
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)


def script(ws: Path) -> tuple[list[Reply], list[str]]:
    replies: list[Reply] = []
    kinds: list[str] = []

    def call(kind: str, name: str, input: dict[str, Any]) -> None:
        replies.append(Reply.tool_use(name, input))
        kinds.append(kind)

    for i in range(CALLS_PER_KIND):
        target = ws / f"pkg{i:03d}" / "mod000.py"
        call("Read", "Read", {"file_path": str(target)})
        call("Grep", "Grep", {"pattern": f"marker{i}\\b", "path": str(ws),
                              "output_mode": "files_with_matches"})
        call("Bash read-only", "Bash", {"command": f"wc -l {target}"})
        call("Edit", "Edit", {"file_path": str(target), "old_string": "return x + 0  #",
                              "new_string": "return x - 0  #", "replace_all": True})
        call("Bash writable", "Bash", {"command": f"echo {i} >> {ws}/notes.txt"})
    replies.append(Reply.text("done"))
    kinds.append("end")
    return replies, kinds


def warren_of(tree: Path) -> Path:
    return tree / ".venv" / "bin" / "warren"


def run_once(tree: Path, replies: list[Reply], ws: Path, env: dict[str, str],
             extra: list[str]) -> tuple[float, list[float]]:
    with FakeMessagesAPI(list(replies)) as api:
        t0 = time.monotonic()
        done = subprocess.run(
            [warren_of(tree), "-p", "bench", "--cwd", ws, *extra],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, check=False,
        )
        requests = api.requests
    if done.returncode != 0:
        raise SystemExit(f"{tree}: warren exited {done.returncode}: {done.stderr[-2000:]}")
    launch = requests[0].started_at - t0
    gaps = []
    for before, after in itertools.pairwise(requests):
        assert before.ended_at is not None
        gaps.append(after.started_at - before.ended_at)
    return launch, gaps


PACKAGES = ("orchestrator", "workers", "sandbox", "policies")


def prepare(tree: Path) -> None:
    """Install `tree`'s environment and byte-compile it and Warren's packages (see above)."""
    subprocess.run(["uv", "sync", "--frozen", "--quiet", "--compile-bytecode"], cwd=tree,
                   check=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"})
    packages = [p for p in PACKAGES if (tree / p).is_dir()]
    subprocess.run([tree / ".venv" / "bin" / "python", "-m", "compileall", "-q", *packages],
                   cwd=tree, check=True, stdout=subprocess.DEVNULL)


def build_base(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", into, rev], check=True)
    prepare(into)
    return into


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="warren-bench-", dir="/var/tmp"))
    try:
        base = build_base(args.base, scratch / "base")
        prepare(ROOT)
        trees = {"base": base, "this": ROOT}
        pristine = scratch / "pristine"
        make_workspace(pristine)
        state = scratch / "state"
        state.mkdir()
        env = {**os.environ, "XDG_STATE_HOME": str(state), "ANTHROPIC_API_KEY": "sk-bench"}
        before = load()
        launches: dict[str, list[float]] = defaultdict(list)
        per_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for _ in range(args.rounds):
            for label, tree in trees.items():
                launch, _ = run_once(tree, [Reply.text("hi")], pristine, env, [])
                launches[label].append(launch)
                ws = scratch / f"ws-{label}"
                shutil.rmtree(ws, ignore_errors=True)
                shutil.copytree(pristine, ws, symlinks=True)
                replies, kinds = script(ws)
                _, gaps = run_once(tree, replies, ws, env, ["--permission-mode", "bypass"])
                for kind, gap in zip(kinds, gaps, strict=False):
                    per_kind[label][kind].append(gap)
        print(f"base {args.base} vs this tree; {args.rounds} rounds, {FILES} files; "
              f"{before} at the start, {load()} at the end")
        b, t = statistics.median(launches["base"]), statistics.median(launches["this"])
        print(f"launch -> first request: base {b * 1000:.0f} ms, this {t * 1000:.0f} ms, "
              f"difference {(t - b) * 1000:+.0f} ms (budget +30 ms)")
        for kind in per_kind["base"]:
            b = statistics.median(per_kind["base"][kind])
            t = statistics.median(per_kind["this"][kind])
            print(f"{kind:>15}: base {b * 1000:6.2f} ms, this {t * 1000:6.2f} ms, "
                  f"difference {(t - b) * 1000:+.2f} ms (budget +1 ms), ratio {t / b:.2f}")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", scratch / "base"],
                       check=False, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
