"""The floor's added work, old way against new way, on a 10,000-file workspace, in one run.

    .venv/bin/python tests/bench/bench_guard.py

Start-up (once per writable sandbox, in a worker thread that overlaps the first model request):
  old: host facts + the stub registry's acquire and release (the placeholders)
  new: the guard's walk and watches + host facts with the nested paths + the read-deny walk
Per tool call (goal <= 1 ms median):
  old: nothing (the placeholders cost nothing per call)
  new: the guard's drain after a call that changed nothing, after one that wrote 5 files,
       and the read-deny check of one path (Read) and of a 200-line Grep result.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.grep import _without_denied  # noqa: E402
from sandbox.guard import WorkspaceGuard, find_denied  # noqa: E402
from sandbox.masks import gather_host_facts  # noqa: E402
from sandbox.spec import SandboxSpec, WorkspaceRoot  # noqa: E402
from sandbox.stubs import StubRegistry, StubRequest  # noqa: E402

FILES = 10_000
PER_DIR = 20


def make_workspace(base: Path) -> Path:
    ws = base / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    for i in range(FILES):
        d = ws / f"pkg{i // 500}" / f"mod{(i // PER_DIR) % 25}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text("x = 1\n")
    (ws / "pkg3" / ".envrc").write_text("")
    (ws / ".env").write_text("K=v\n")
    return ws


def median_ms(step: Callable[[], object], runs: int) -> float:
    step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    base = Path("/var/tmp") / f"warren-bench-guard-{time.time_ns()}"
    base.mkdir()
    try:
        ws = make_workspace(base)
        spec = SandboxSpec(workspaces=(WorkspaceRoot(path=ws),), home=base)
        protected = [p.path for p in spec.all_protected]
        registry = StubRegistry(base / "stubs")
        ctx = ToolContext(
            workspace=ws, cwd=ws, read_deny=((".env", str(ws)), ("secrets/**", str(ws)))
        )

        def denied(path: str) -> bool:  # as Grep, Glob and the start-up walk check
            return ctx.read_denied(path, resolve=False)

        def old_start() -> None:
            facts = gather_host_facts(spec, environ={})
            missing = [ws / ".envrc", ws / ".vscode", ws / ".github", ws / ".bashrc"]
            stubs = [StubRequest(path=p, kind="dir") for p in missing if not p.exists()]
            registry.release(registry.acquire(stubs))
            assert facts is not None

        def new_start() -> None:
            guard = WorkspaceGuard.start([ws], protected)
            facts = gather_host_facts(spec, environ={}, nested=guard.survey.protected)
            guard.watch_paths(facts.watched)
            find_denied([ws], denied)
            guard.close()

        def walk_only() -> None:
            WorkspaceGuard.start([ws], protected).close()

        def deny_walk() -> None:
            find_denied([ws], denied)

        runs = 15
        print(f"workspace: {FILES} files in {FILES // PER_DIR} directories ({ws})")
        old = median_ms(old_start, runs)
        new = median_ms(new_start, runs)
        print(f"start-up, old (facts + placeholders):         {old:8.2f} ms")
        print(f"start-up, new (guard + facts + deny walk):    {new:8.2f} ms  ({new / old:.1f}x)")
        print(f"  of which the guard's walk and watches:      {median_ms(walk_only, runs):8.2f} ms")
        print(f"  of which the read-deny walk:                {median_ms(deny_walk, runs):8.2f} ms")

        guard = WorkspaceGuard.start([ws], protected)
        target = ws / "pkg1" / "mod3"

        def quiet() -> None:
            assert guard.drain() == []

        def busy() -> None:
            for i in range(5):
                (target / f"new{i}.py").write_text("y = 2\n")
            guard.drain()
            for i in range(5):
                (target / f"new{i}.py").unlink()

        def busy_baseline() -> None:  # the same file work without the guard, to subtract
            for i in range(5):
                (target / f"new{i}.py").write_text("y = 2\n")
            for i in range(5):
                (target / f"new{i}.py").unlink()

        lines = [f"{ws}/pkg1/mod3/f{i}.py\0{i}:x = 1" for i in range(200)]

        def grep_filter() -> None:
            _without_denied(lines, ws, ctx)

        runs = 2000
        print("per call, old: 0 (nothing ran per call)")
        print(
            f"per call, new: drain, nothing changed:       {median_ms(quiet, runs) * 1000:8.1f} us"
        )
        extra = median_ms(busy, 500) - median_ms(busy_baseline, 500)
        print(f"per call, new: drain after 5 files written:  {extra * 1000:8.1f} us")
        path = str(target / "f1.py")
        read_us = median_ms(lambda: ctx.read_denied(path), runs) * 1000
        print(f"per call, new: Read's deny check:            {read_us:8.1f} us")
        grep_us = median_ms(grep_filter, 200) * 1000
        print(f"per call, new: Grep's deny filter, 200 lines:{grep_us:8.1f} us")
        guard.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
