"""Sandbox benchmarks (issue "The OS floor"): each prints medians and a ratio from one run.

    .venv/bin/python tests/bench/bench_sandbox.py [--runs 50]

(a) spawn overhead: `/bin/true` in a sandbox (read-only and writable workspace) vs
    unsandboxed, median of N runs each, in ms and as a ratio
(b) a read-only one-shot command: `rg` over this repository, sandboxed vs unsandboxed
(c) the floor probe, end to end (goal < 100 ms)
(d) the reaper of adopted sandbox inits (sandbox/process/reaper.py): `/bin/true` sandboxed
    with it and with it switched off, alternating, and the cost of one look for adopted inits

Both sides of each comparison spawn the same way (fork+exec from the trio thread) and capture
output the same way, so the difference is bwrap: namespaces, mounts, seccomp, prlimit, the
stub registry and the host-facts step.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox.host import SandboxHost, detect_host  # noqa: E402
from sandbox.probe import probe_floor  # noqa: E402
from sandbox.run import run_sandboxed  # noqa: E402
from sandbox.spec import SandboxSpec, WorkspaceRoot  # noqa: E402


async def _median_ms(runs: int, fn: Callable[[], Awaitable[object]]) -> float:
    await fn()  # warm caches
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def _bare(argv: list[str], cwd: Path) -> Callable[[], Awaitable[object]]:
    async def run() -> object:
        # Same spawn path as the runner: a blocking fork+exec, no worker thread.
        return subprocess.run(argv, cwd=cwd, capture_output=True, check=False)  # noqa: ASYNC221

    return run


def _boxed(
    host: SandboxHost, spec: SandboxSpec, argv: list[str]
) -> Callable[[], Awaitable[object]]:
    async def run() -> object:
        result = await run_sandboxed(spec, argv, host=host)
        assert result.exit_code == 0, result.stderr
        return result

    return run


async def main(runs: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="warren-bench-", dir="/var/tmp"))
    try:
        host = await detect_host(stub_dir=state / "stubs")
        print(f"{host.bwrap.describe()}; {host.cgroups.note}")
        workspace = state / "ws"
        workspace.mkdir()
        rw = SandboxSpec(workspaces=(WorkspaceRoot(path=workspace, mode="rw"),))
        ro = rw.read_only()

        true = ["/bin/true"]
        bare = await _median_ms(runs, _bare(true, workspace))
        boxed_ro = await _median_ms(runs, _boxed(host, ro, true))
        boxed_rw = await _median_ms(runs, _boxed(host, rw, true))
        print(
            f"(a) /bin/true, median of {runs}: unsandboxed {bare:.2f} ms, "
            f"sandboxed ro {boxed_ro:.2f} ms (x{boxed_ro / bare:.1f}, "
            f"+{boxed_ro - bare:.1f} ms), rw {boxed_rw:.2f} ms (x{boxed_rw / bare:.1f}, "
            f"+{boxed_rw - bare:.1f} ms)"
        )

        rg = shutil.which("rg", path=str(Path(sys.executable).parent)) or shutil.which("rg")
        if rg is None:
            print("(b) skipped: no rg")
        else:
            tree = SandboxSpec(workspaces=(WorkspaceRoot(path=ROOT, mode="ro"),))
            argv = [
                rg,
                "--count-matches",
                "def ",
                str(ROOT / "orchestrator"),
                str(ROOT / "sandbox"),
                str(ROOT / "tests"),
            ]
            n = max(runs // 5, 5)
            bare_rg = await _median_ms(n, _bare(argv, ROOT))

            async def boxed_rg() -> object:
                return await run_sandboxed(tree, argv, host=host)

            sandboxed_rg = await _median_ms(n, boxed_rg)
            print(
                f"(b) rg over the repository, median of {n}: unsandboxed {bare_rg:.1f} ms, "
                f"sandboxed (ro) {sandboxed_rg:.1f} ms, ratio x{sandboxed_rg / bare_rg:.2f}"
            )

        import sandbox.run as sandbox_run
        from sandbox.process.reaper import adopted_sandbox_inits

        real_reap = sandbox_run.reap_adopted_sandbox_inits  # type: ignore[attr-defined]

        async def no_reaping(timeout_s: float) -> list[int]:
            return []

        with_reaper: list[float] = []
        without: list[float] = []
        for _ in range(runs):
            for reap, samples in ((real_reap, with_reaper), (no_reaping, without)):
                sandbox_run.reap_adopted_sandbox_inits = reap  # type: ignore[attr-defined]
                start = time.perf_counter()
                await _boxed(host, ro, true)()
                samples.append((time.perf_counter() - start) * 1000)
        sandbox_run.reap_adopted_sandbox_inits = real_reap  # type: ignore[attr-defined]
        look = []
        for _ in range(200):
            start = time.perf_counter()
            adopted_sandbox_inits()
            look.append((time.perf_counter() - start) * 1000)
        new, old = statistics.median(with_reaper), statistics.median(without)
        print(
            f"(d) reaper, median of {runs}: /bin/true sandboxed with it {new:.2f} ms, without "
            f"{old:.2f} ms (x{new / old:.3f}); one look for adopted inits "
            f"{statistics.median(look) * 1000:.0f} us"
        )

        probe_ms = []
        for _ in range(5):
            start = time.perf_counter()
            report = await probe_floor(host=host, base_dir=state / "probe")
            probe_ms.append((time.perf_counter() - start) * 1000)
            assert report.proven, report.render()
        print(f"(c) floor probe, median of 5: {statistics.median(probe_ms):.0f} ms (goal < 100 ms)")
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    trio.run(main, parser.parse_args().runs)
