"""What hardening costs, measured in one run against an older commit (issue "Keep the floor's
promise": <= 1 ms per tool call median on a 10,000-file workspace; launch -> first model
request no more than 30 ms slower).

    uv run python tests/bench/bench_vs_parent.py --base REV [--rounds 5]

Builds REV in a temporary git worktree (its own `.venv`), then runs the real `warren -p` of
both trees, interleaved, against one fake Messages API server on 127.0.0.1:

- launch -> first request: the median over the rounds of each tree, and the CPU time the
  coordinator process itself used until then (its own, not its children's: on a loaded
  machine the steadier figure), each launch with the change scans' stamps and stored
  contents removed from the state directory, so a tree that scans the workspace at start-up
  (change sets) reads all 10,000 files, as in a workspace never seen;
- per tool call: a 10,000-file git workspace (fresh copy per run, synced to disk before the
  run starts), a scripted session of
  Read / Grep / read-only Bash / Edit / writable Bash calls (one per turn); the cost of a call
  is the gap between the end of the reply that asked for it and the arrival of the next
  request, the median per kind over all rounds, and, paired by round (each round runs base
  then this, so a drift in the machine's load hits both), the median of the rounds'
  differences of medians with the lowest and highest: Grep's own ripgrep walk of 10,000
  files varies by +-10 ms from run to run here, more than the budget, so a difference of
  medians from one session each says little;
- Grep without ripgrep (`--rg-lifetimes`, needs `perf` and root): each Grep's gap minus the
  lifetime of the ripgrep process it ran (from the kernel's exec and exit events of that
  tree's `rg`, `perf record -a -e sched:sched_process_exec,sched:sched_process_exit`): what
  Warren's own code costs around the search, which is the same binary, flags and files in
  both trees;
- CPU per tool call: the time the coordinator's and its tool hosts' threads ran (their own,
  not their children's: ripgrep and shell commands are not counted) between those two
  requests, read from /proc/PID/task/*/schedstat (nanoseconds, each thread's growth) when
  each request arrives, the mean and median per kind (the first call of a run, which
  overlaps the tool hosts' start-up, left out). Wall-clock gaps on a shared machine measure
  its load as much as the code; CPU time mostly does not. What a tree does in the background
  counts when it is done before the next request.

Both trees see the same server, workspace and script; only the code differs. Both are
prepared alike, as an install would leave them: `uv sync --frozen --compile-bytecode` and
Warren's own packages byte-compiled (this machine sets PYTHONDONTWRITEBYTECODE, so a tree
that is not compiled recompiles every module it imports at each start, in the coordinator
and in every tool host). The load average is printed before and after: numbers taken on a
loaded machine are noise.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply  # noqa: E402

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


SDK_PRELOADED = """
import os, runpy, sys, time
import anthropic, anthropic.types  # the SDK, and with it httpx2, pydantic, anyio
with open(os.environ["WARREN_BENCH_T0"], "w") as out:
    out.write(f"{time.monotonic()!r} {time.process_time()!r}")
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(sys.argv[0])  # as when the script runs itself, not the cwd
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""`--sdk-preloaded`: the tree's `warren` script run by a process that has imported the SDK
first; the launch is timed from the moment the import is done (written to WARREN_BENCH_T0)."""


TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu(pid: int) -> float:
    """Seconds of CPU `pid` used itself (utime + stime), 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_times(pid: int) -> dict[int, int]:
    """Nanoseconds each live thread of `pid` has run so far (its `schedstat`; empty when the
    process is gone). Unlike utime + stime, counted in clock ticks (10 ms here, as long as a
    tool call), it resolves one call."""
    times: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                ran = Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0]
                times[int(task)] = int(ran)
    return times


def cpu_by_process(pid: int) -> dict[str, dict[int, int]]:
    """The threads' run times so far of the coordinator `pid` and of each tool host below it
    (by role)."""
    found = {"coordinator": thread_times(pid)}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                if "workers.toolhost" in argv and "--role" in argv:
                    role = argv[argv.index("--role") + 1]
                    found.setdefault(role, {}).update(thread_times(child.pid))
    return found


def cpu_between(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]) -> float:
    """Seconds the threads ran between two samples: each thread's growth (a thread that
    started in between, all of its time; one that ended in between is missed)."""
    ran = 0
    for role, threads in after.items():
        earlier = before.get(role, {})
        ran += sum(max(0, t - earlier.get(tid, 0)) for tid, t in threads.items())
    return ran / 1e9


def run_once(
    tree: Path,
    replies: list[Reply],
    ws: Path,
    env: dict[str, str],
    extra: list[str],
    *,
    preloaded: bool = False,
    rg_events: Path | None = None,
) -> tuple[float, float, list[float], list[float]]:
    """Launch -> first request, the coordinator's CPU until then, the gap before each later
    request, and the CPU each process used in each gap. `preloaded`: the launch and its CPU
    counted from the end of the SDK's import (`SDK_PRELOADED`). `rg_events`: the session runs
    under `perf record` of every exec and exit on the machine, written there (`rg_lifetimes`)."""
    samples: list[dict[str, dict[int, int]]] = []
    running: list[subprocess.Popen[str]] = []
    first_cpu: list[float] = []

    def coordinator() -> int:
        """The session's process: the one started, or under `perf record` its child."""
        pid = running[0].pid
        if rg_events is not None:
            with contextlib.suppress(psutil.Error):
                return next(iter(psutil.Process(pid).children()), psutil.Process(pid)).pid
        return pid

    def sample(_request: RecordedRequest) -> None:
        if running and not first_cpu:
            first_cpu.append(own_cpu(coordinator()))  # every thread's, ended ones too
        samples.append(cpu_by_process(coordinator()) if running else {})

    command: list[str | Path] = [warren_of(tree), "-p", "bench", "--cwd", ws, *extra]
    marks = ws.parent / f"t0-{os.getpid()}"
    if preloaded:
        marks.unlink(missing_ok=True)
        command = [tree / ".venv" / "bin" / "python", "-c", SDK_PRELOADED, *command]
        env = {**env, "WARREN_BENCH_T0": str(marks)}
    if rg_events is not None:
        events = "sched:sched_process_exec,sched:sched_process_exit"
        command = ["perf", "record", "-q", "-a", "-e", events, "-o", rg_events, "--", *command]
    with FakeMessagesAPI(list(replies), route=sample) as api:
        t0 = time.monotonic()
        with subprocess.Popen(
            command,
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as process:
            running.append(process)
            _, stderr = process.communicate()
        requests = api.requests
    if process.returncode != 0:
        raise SystemExit(f"{tree}: warren exited {process.returncode}: {stderr[-2000:]}")
    cpu_before = 0.0
    if preloaded:  # timed from the end of the SDK's import, its CPU left out
        t0, cpu_before = (float(x) for x in marks.read_text().split())
    launch = requests[0].started_at - t0
    gaps = []
    for before, after in itertools.pairwise(requests):
        assert before.ended_at is not None
        gaps.append(after.started_at - before.ended_at)
    cpu = [cpu_between(before, after) for before, after in itertools.pairwise(samples)]
    return launch, (first_cpu[0] - cpu_before) if first_cpu else 0.0, gaps, cpu


def rg_lifetimes(events: Path, rg: Path) -> list[float]:
    """Seconds each run of `rg` (that binary, by its path) lived, in the order they started,
    from a `perf record` of exec and exit events (`run_once(rg_events=...)`)."""
    script = subprocess.run(
        ["perf", "script", "-i", events], capture_output=True, text=True, check=True
    ).stdout
    started: dict[int, float] = {}
    lived: list[tuple[float, float]] = []
    for line in script.splitlines():
        found = re.search(r"\s(\d+\.\d+): +sched:sched_process_(exec|exit): (.*)", line)
        if found is None:
            continue
        at, kind, rest = float(found[1]), found[2], found[3]
        pid = re.search(r"pid=(\d+)", rest)
        if pid is None:
            continue
        if kind == "exec" and f"filename={rg} " in f"{rest} ":
            started[int(pid[1])] = at
        elif kind == "exit" and int(pid[1]) in started:
            begun = started.pop(int(pid[1]))
            lived.append((begun, at - begun))
    return [took for _, took in sorted(lived)]


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
    parser.add_argument("--launch-only", action="store_true",
                        help="measure only launch -> first request (no per-call session)")
    parser.add_argument(
        "--rg-lifetimes",
        action="store_true",
        help="also Grep's cost without ripgrep's own run time (needs perf and root)",
    )
    parser.add_argument(
        "--sdk-preloaded",
        action="store_true",
        help="also time each launch from the end of `import anthropic`, done before in the "
        "same process: Warren's own start-up, without the import's variance",
    )
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
        launch_cpu: dict[str, list[float]] = defaultdict(list)
        sdk_launches: dict[str, list[float]] = defaultdict(list)
        sdk_cpu: dict[str, list[float]] = defaultdict(list)
        per_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        cpu_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        round_medians: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        without_rg: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.rounds):
            for label, tree in trees.items():
                for kept in ("scans", "objects"):
                    shutil.rmtree(state / "warren" / kept, ignore_errors=True)
                launch, cpu_used, _, _ = run_once(tree, [Reply.text("hi")], pristine, env, [])
                launches[label].append(launch)
                launch_cpu[label].append(cpu_used)
                if args.sdk_preloaded:
                    for kept in ("scans", "objects"):
                        shutil.rmtree(state / "warren" / kept, ignore_errors=True)
                    launch, cpu_used, _, _ = run_once(
                        tree, [Reply.text("hi")], pristine, env, [], preloaded=True
                    )
                    sdk_launches[label].append(launch)
                    sdk_cpu[label].append(cpu_used)
                if args.launch_only:
                    continue
                ws = scratch / f"ws-{label}"
                shutil.rmtree(ws, ignore_errors=True)
                shutil.copytree(pristine, ws, symlinks=True)
                # The copy's 10,000 files on disk before the run: their writeback would land
                # in whichever tree's journal commits (an fsync) happen to come first.
                os.sync()
                replies, kinds = script(ws)
                events = scratch / f"rg-{label}.perf" if args.rg_lifetimes else None
                _, _, gaps, cpu = run_once(
                    tree, replies, ws, env, ["--permission-mode", "bypass"], rg_events=events
                )
                if events is not None:
                    rg = tree / ".venv" / "bin" / "rg"
                    greps = [gap for kind, gap in zip(kinds, gaps, strict=False) if kind == "Grep"]
                    lifetimes = rg_lifetimes(events, rg)
                    if len(lifetimes) != len(greps):
                        raise SystemExit(f"{len(greps)} Greps but {len(lifetimes)} runs of {rg}")
                    without_rg[label] += [g - r for g, r in zip(greps, lifetimes, strict=True)]
                this_round: dict[str, list[float]] = defaultdict(list)
                for kind, gap in zip(kinds, gaps, strict=False):
                    per_kind[label][kind].append(gap)
                    this_round[kind].append(gap)
                for kind, kind_gaps in this_round.items():
                    round_medians[label][kind].append(statistics.median(kind_gaps))
                # The first call's CPU holds the tool hosts' start-up: left out.
                for kind, used in zip(kinds[1:], cpu[1:], strict=False):
                    cpu_kind[label][kind].append(used)
        print(f"base {args.base} vs this tree; {args.rounds} rounds, {FILES} files; "
              f"{before} at the start, {load()} at the end")
        b, t = statistics.median(launches["base"]), statistics.median(launches["this"])
        print(f"launch -> first request: base {b * 1000:.0f} ms, this {t * 1000:.0f} ms, "
              f"difference {(t - b) * 1000:+.0f} ms (budget +30 ms)")
        b, t = statistics.median(launch_cpu["base"]), statistics.median(launch_cpu["this"])
        print(f"coordinator CPU until the first request: base {b * 1000:.0f} ms, "
              f"this {t * 1000:.0f} ms, difference {(t - b) * 1000:+.0f} ms")
        if args.sdk_preloaded:
            b = statistics.median(sdk_launches["base"])
            t = statistics.median(sdk_launches["this"])
            paired = statistics.median(
                t - b for b, t in zip(sdk_launches["base"], sdk_launches["this"], strict=True)
            )
            print(f"from the end of import anthropic -> first request: base {b * 1000:.0f} ms, "
                  f"this {t * 1000:.0f} ms, difference {(t - b) * 1000:+.0f} ms "
                  f"(median of the rounds' paired differences {paired * 1000:+.0f} ms)")
            b, t = statistics.median(sdk_cpu["base"]), statistics.median(sdk_cpu["this"])
            print(f"coordinator CPU from then until the first request: base {b * 1000:.0f} ms, "
                  f"this {t * 1000:.0f} ms, difference {(t - b) * 1000:+.0f} ms")
        if args.launch_only:
            return
        for kind in per_kind["base"]:
            b = statistics.median(per_kind["base"][kind])
            t = statistics.median(per_kind["this"][kind])
            print(f"{kind:>15}: base {b * 1000:6.2f} ms, this {t * 1000:6.2f} ms, "
                  f"difference {(t - b) * 1000:+.2f} ms (budget +1 ms), ratio {t / b:.2f}")
        print("Paired by round (each round runs base then this; drift in the machine's load "
              "hits both): median of the rounds' differences of medians [lowest, highest]:")
        for kind in round_medians["base"]:
            diffs = sorted(
                t - b
                for b, t in zip(
                    round_medians["base"][kind], round_medians["this"][kind], strict=True
                )
            )
            print(f"{kind:>15}: {statistics.median(diffs) * 1000:+.2f} ms "
                  f"[{diffs[0] * 1000:+.2f}, {diffs[-1] * 1000:+.2f}]")
        if args.rg_lifetimes:
            b, t = statistics.median(without_rg["base"]), statistics.median(without_rg["this"])
            print(f"Grep without ripgrep's own run: base {b * 1000:.2f} ms, this {t * 1000:.2f} "
                  f"ms, difference {(t - b) * 1000:+.2f} ms (budget +1 ms)")
        print("CPU per call (coordinator + tool hosts), mean; median:")
        for kind in cpu_kind["base"]:
            b, t = statistics.mean(cpu_kind["base"][kind]), statistics.mean(cpu_kind["this"][kind])
            bm = statistics.median(cpu_kind["base"][kind])
            tm = statistics.median(cpu_kind["this"][kind])
            print(f"{kind:>15}: base {b * 1000:6.2f} ms, this {t * 1000:6.2f} ms, "
                  f"difference {(t - b) * 1000:+.2f} ms; median {bm * 1000:6.2f} ms, "
                  f"{tm * 1000:6.2f} ms, {(tm - bm) * 1000:+.2f} ms")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", scratch / "base"],
                       check=False, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
