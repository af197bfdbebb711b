"""The interactive session's cost (issue 13, acceptance): numbers from one run, printed.

    uv run python tests/bench/bench_repl.py [--rounds N]

The real `warren` against the fake Messages API, in a real pseudo-terminal (a pty this
script reads, answering the terminal's cursor-position queries as a terminal would):

(a) keystroke to echo: a key written to the terminal until its character comes back in the
    output, while the session is idle (prompt_toolkit echoes it) and while 10 subagents stream
    (the live area shows what is typed ahead); median and p90 of 20 keys each
(b) the coordinator's time between turns while 10 subagents stream, with the REPL's UI, with
    headless `-p` at a terminal (its progress on stderr) and with `-p` piped (no UI at all):
    - a subagent's turn: its request k ended at the API -> its request k+1 arrived (the worker
      ran a Glob, the coordinator forwarded the next request);
    - the main agent's turn: the last subagent's last request ended -> the main agent's next
      request arrived (ten results collected, ten tool lines drawn).
    Medians and p90 over every gap of every round; goal: the UI within 1 ms of `-p` piped.
    Next to the wall-clock times, the CPU time the coordinator's threads ran (their
    `/proc/PID/task/*/schedstat`, sampled by the fake API as each request arrives and once its
    answer is written; the steadier figure on a shared machine): per subagent turn, the
    coordinator's CPU from the round's first subagent request to the end of its last,
    divided by their number (relaying the streams included); per main turn, its CPU in that
    gap.
(c) what one redraw of the live area with 10 subagent rows costs, in process.

Each round: the main agent dispatches 10 subagents; each streams 3 turns of text (50
deltas, 10 ms apart), the first two ending in a Glob. The ten first requests of a round are
answered together once all have come (`StartTogether`), so every mode streams ten at once.
The load average is printed with the numbers: on a shared machine a load above the core
count makes them noise.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import itertools
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.cli.demo.sample_repo import generate  # noqa: E402
from tests.bench.bench_vs_parent import cpu_between, thread_times  # noqa: E402
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply  # noqa: E402

AGENTS = 10
TURNS = 3
ROWS, COLS = 40, 110
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>]|\r")


_DRAIN = """
import os
while True:
    try:
        data = os.read(0, 65536)
    except OSError:  # EIO: the terminal's last holder closed it
        break
    if not data:
        break
    os.write(1, data)
"""


class Pty:
    """`argv` on a fresh pseudo-terminal (its controlling terminal); everything it writes is
    drained by a process of its own (a thread of this process, which also serves the fake
    API to ten streaming subagents, falls behind: the pty's 4 KB buffer fills and the
    program's terminal writes block, which measures this process, not the program) into a
    pipe, and read from there by a thread into `output`."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        self._drain = subprocess.Popen(
            [sys.executable, "-c", _DRAIN], stdin=self.master, stdout=subprocess.PIPE
        )
        assert self._drain.stdout is not None
        self._drained = self._drain.stdout.fileno()
        self.output = bytearray()
        self._lock = threading.Lock()
        self._grown = threading.Condition(self._lock)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._drained, 65536)
            except OSError:
                data = b""
            with self._grown:
                if not data:
                    self._grown.notify_all()
                    return
                if b"\x1b[6n" in data:  # where is the cursor? (prompt_toolkit asks)
                    os.write(self.master, b"\x1b[%d;1R" % ROWS)
                self.output += data
                self._grown.notify_all()

    def write(self, data: bytes) -> int:
        """Write `data`; the output's length just before (where to look for its echo)."""
        with self._lock:
            mark = len(self.output)
        os.write(self.master, data)
        return mark

    def wait_for(self, needle: bytes, after: int = 0, timeout: float = 60.0) -> float:
        """Block until `needle` is in the output after byte `after`; the time it arrived."""
        deadline = time.monotonic() + timeout
        with self._grown:
            while needle not in self.output[after:]:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    tail = _ANSI.sub(b"", bytes(self.output[-2000:])).decode("utf-8", "replace")
                    raise RuntimeError(f"{needle!r} never came; the output ends:\n{tail}")
                self._grown.wait(left)
            return time.monotonic()

    def text(self, after: int = 0) -> str:
        with self._lock:
            return _ANSI.sub(b"", bytes(self.output[after:])).decode("utf-8", "replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.close(self.master)
        self._drain.kill()
        self._drain.wait()


# --- the scripted conversation --------------------------------------------------------------

_SUB = re.compile(r"\[sub r(\d+) a(\d+)\]")
_MAIN = re.compile(r"\[main r(\d+)\]")
_PROSE = "Looking through the module for every caller of the helper, one file at a time. " * 8


def _route(request: RecordedRequest) -> Reply:
    messages = request.messages
    first = json.dumps(messages[:1])
    if _SUB.search(first):
        turn = sum(1 for m in messages if m["role"] == "assistant")
        text = {"type": "text", "text": _PROSE[:600]}
        if turn < TURNS - 1:
            glob = {"type": "tool_use", "name": "Glob", "input": {"pattern": "shop/*/*.py"}}
            return Reply(content=[text, glob], chunk_delay_s=0.01)
        return Reply(content=[text], chunk_delay_s=0.01)
    last = messages[-1]
    content = last["content"]
    if isinstance(content, list) and any(b.get("type") == "tool_result" for b in content):
        round_no = _MAIN.findall(json.dumps(messages))[-1]
        return Reply.text(f"Round {round_no} done.")
    found = _MAIN.search(json.dumps(last))
    assert found is not None, f"an unexpected request: {json.dumps(last)[:300]}"
    return Reply(
        content=[
            {
                "type": "tool_use",
                "name": "dispatch_agent",
                "input": {
                    "description": f"survey part {k}",
                    "prompt": f"[sub r{found[1]} a{k}] find the callers",
                },
            }
            for k in range(AGENTS)
        ]
    )


class StartTogether:
    """Holds each round's first subagent requests until all ten have come, then answers them
    together: the ten streams then overlap as much in every mode. Without it the modes ran
    different workloads: a fresh `-p` process starts its workers one after another (its
    subagents' first requests spread over 1.3-2.2 s, so fewer streamed at once), while the
    REPL's rounds after the first reuse warm workers (spread 0.1-0.25 s, all ten streaming
    together), and each subagent turn waited behind more streams in the REPL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[str, threading.Barrier] = {}

    def wait(self, request: RecordedRequest) -> None:
        messages = request.messages
        sub = _SUB.search(json.dumps(messages[:1]))
        if sub is None or any(m["role"] == "assistant" for m in messages):
            return
        with self._lock:
            barrier = self._rounds.setdefault(sub[1], threading.Barrier(AGENTS))
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            pass  # a subagent never asked: the round fails in _gaps, which says so


class CoordinatorCpu:
    """The coordinator's threads' CPU time, sampled by the fake API (in its threads) as each
    request arrives (after `StartTogether`) and once it is answered."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.at_start: dict[int, dict[str, dict[int, int]]] = {}
        self.at_end: dict[int, dict[str, dict[int, int]]] = {}
        self.together = StartTogether()

    def _sample(self) -> dict[str, dict[int, int]]:
        return {"coordinator": thread_times(self.pid)} if self.pid is not None else {}

    def route(self, request: RecordedRequest) -> FakeResponse:
        self.together.wait(request)
        self.at_start[request.number] = self._sample()
        return _route(request)

    def answered(self, request: RecordedRequest) -> None:
        self.at_end[request.number] = self._sample()

    def api(self) -> FakeMessagesAPI:
        return FakeMessagesAPI([], route=self.route, on_answered=self.answered)


def _prompt(round_no: int) -> str:
    return f"[main r{round_no}] survey the shop, one subagent per part"


def _gaps(
    requests: list[RecordedRequest], round_no: int, cpu: CoordinatorCpu
) -> tuple[list[float], float, float, float]:
    """Each subagent turn's gap, the main agent's gap, the coordinator's CPU per subagent
    turn and in the main agent's gap, of one round, in seconds."""
    by_agent: dict[str, list[RecordedRequest]] = {}
    main_next: RecordedRequest | None = None
    for request in requests:
        first = json.dumps(request.messages[:1])
        sub = _SUB.search(first)
        if sub is not None and int(sub[1]) == round_no:
            by_agent.setdefault(sub[2], []).append(request)
        elif sub is None and f"[main r{round_no}]" in json.dumps(request.messages):
            last = request.messages[-1]["content"]
            if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
                main_next = request
    assert len(by_agent) == AGENTS and main_next is not None, "a round did not complete"
    turn_gaps: list[float] = []
    ending: RecordedRequest | None = None  # the round's last subagent request to end
    for turns in by_agent.values():
        turns.sort(key=lambda r: r.started_at)
        for before, after in itertools.pairwise(turns):
            assert before.ended_at is not None
            turn_gaps.append(after.started_at - before.ended_at)
        if ending is None or (turns[-1].ended_at or 0.0) > (ending.ended_at or 0.0):
            ending = turns[-1]
    assert ending is not None and ending.ended_at is not None
    subs = [r for turns in by_agent.values() for r in turns]
    opening = min(subs, key=lambda r: r.started_at)
    per_turn = cpu_between(cpu.at_start[opening.number], cpu.at_end[ending.number]) / len(subs)
    main_cpu = cpu_between(cpu.at_end[ending.number], cpu.at_start[main_next.number])
    return turn_gaps, main_next.started_at - ending.ended_at, per_turn, main_cpu


def _env(tmp: Path, api: FakeMessagesAPI, mode: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp)),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "XDG_STATE_HOME": str(tmp / f"state-{mode}"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "ANTHROPIC_API_KEY": "sk-bench",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",  # no warm server started for next time
    }


WARREN = [sys.executable, "-m", "orchestrator.cli"]
_IDLE_KEYS = "αβγδεζηθικλμνξοπρστυ"
_BUSY_KEYS = "ΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥ"  # Greek capitals: never in the UI's own text


def _type_and_time(pty: Pty, keys: str, until: float | None = None) -> list[float]:
    """Each key's echo latency in seconds (keys written 30 ms apart; stop at `until`)."""
    took = []
    for key in keys:
        if until is not None and time.monotonic() > until:
            break
        encoded = key.encode()
        mark = pty.write(encoded)
        sent = time.monotonic()
        took.append(pty.wait_for(encoded, after=max(0, mark - 1), timeout=5) - sent)
        time.sleep(0.03)
    return took


class Results:
    def __init__(self) -> None:
        self.turn_gaps: dict[str, list[float]] = {}
        self.main_gaps: dict[str, list[float]] = {}
        self.turn_cpu: dict[str, list[float]] = {}
        self.main_cpu: dict[str, list[float]] = {}
        self.echo: dict[str, list[float]] = {"idle": [], "busy": []}

    def add(self, mode: str, api: FakeMessagesAPI, round_no: int, cpu: CoordinatorCpu) -> None:
        turn_gaps, main_gap, turn_cpu, main_cpu = _gaps(api.requests, round_no, cpu)
        self.turn_gaps.setdefault(mode, []).extend(turn_gaps)
        self.main_gaps.setdefault(mode, []).append(main_gap)
        self.turn_cpu.setdefault(mode, []).append(turn_cpu)
        self.main_cpu.setdefault(mode, []).append(main_cpu)


def run_repl(tmp: Path, sample: Path, rounds: int, results: Results) -> None:
    cpu = CoordinatorCpu()
    with cpu.api() as api:
        pty = Pty(WARREN, _env(tmp, api, "repl"), sample)
        cpu.pid = pty.process.pid
        try:
            pty.wait_for(b"/help for commands")
            pty.wait_for(b">", after=pty.output.rindex(b"/help for commands"))
            time.sleep(0.5)  # the prompt drawn: keys typed now are not buffered ahead of it
            results.echo["idle"] += _type_and_time(pty, _IDLE_KEYS)
            pty.write(b"\x03")  # Ctrl-C clears the line
            for round_no in range(1, rounds + 1):
                mark = pty.write(_prompt(round_no).encode() + b"\r")
                if round_no == rounds:  # type while the subagents stream (after warm-up)
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline:
                        started = [r for r in api.requests if f"[sub r{round_no} " in
                                   json.dumps(r.messages[:1])]  # fmt: skip
                        if len(started) >= AGENTS:
                            break
                        time.sleep(0.01)
                    busy_until = time.monotonic() + 1.0  # the subagents' streaming lasts ~1.5 s
                    results.echo["busy"] += _type_and_time(pty, _BUSY_KEYS, busy_until)
                pty.wait_for(f"Round {round_no} done".encode(), after=mark, timeout=120)
                results.add("repl", api, round_no, cpu)
                pty.wait_for(b">", after=pty.output.rindex(f"Round {round_no} done".encode()))
                pty.write(b"\x03")  # what was typed ahead is the next prompt's start: clear
            pty.write(b"/exit\r")
            pty.process.wait(60)
        finally:
            pty.close()


def run_headless(tmp: Path, sample: Path, rounds: int, results: Results, tty: bool) -> None:
    mode = "-p tty" if tty else "-p piped"
    cpu = CoordinatorCpu()
    with cpu.api() as api:
        for round_no in range(1, rounds + 1):
            argv = [*WARREN, "-p", _prompt(round_no)]
            env = _env(tmp, api, mode.replace(" ", ""))
            if tty:
                pty = Pty(argv, env, sample)
                cpu.pid = pty.process.pid
                try:
                    pty.process.wait(120)
                finally:
                    pty.close()
            else:
                with subprocess.Popen(
                    argv, env=env, cwd=sample, stdout=subprocess.PIPE, stderr=subprocess.PIPE
                ) as process:
                    cpu.pid = process.pid
                    _, err = process.communicate(timeout=120)
                if process.returncode != 0:
                    raise RuntimeError(f"warren -p exited {process.returncode}: {err[-2000:]!r}")
            results.add(mode, api, round_no, cpu)


def redraw_cost() -> tuple[float, float, float]:
    """Milliseconds (medians of 50) of one live-area redraw with 10 subagent rows, of those
    rows printed alone, and of the same rows as the `rich.table.Table` drawn before."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from orchestrator.agents.types import SubagentStarted
    from orchestrator.cli.repl.display import TurnView, _agents_rows

    console = Console(
        file=io.StringIO(), force_terminal=True, width=COLS, height=ROWS, color_system="truecolor"
    )
    view = TurnView(console)
    for k in range(AGENTS):
        started = SubagentStarted(
            agent_id=f"agent-{k:012x}",
            agent_type="general",
            description=f"survey part {k}",
            transcript=None,
        )
        view.subagent(started)

    def table() -> Table:
        old = Table(box=None, show_header=True, header_style="dim", padding=(0, 1))
        for column in ("agent", "task", "tool", "turns", "tokens", "time", "pid"):
            old.add_column(column, no_wrap=True, overflow="ellipsis")
        for k in range(AGENTS):
            old.add_row(Text(f"{k:08x}", "cyan"), Text(f"survey part {k}"),
                        Text("thinking…", "dim"), "0", "0", "1.0 s", "12345")  # fmt: skip
        return old

    def median_ms(step: Callable[[], object]) -> float:
        took = []
        for _ in range(50):
            t0 = time.perf_counter()
            step()
            took.append(time.perf_counter() - t0)
        return statistics.median(took) * 1000

    view.start()
    redraw = median_ms(view.redraw)
    view.stop()
    rows = median_ms(lambda: console.print(_agents_rows(view._agents.values(), 1.0)))
    old = median_ms(lambda: console.print(table()))
    return redraw, rows, old


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return f"median {statistics.median(values) * 1000:7.2f} ms  p90 {p90 * 1000:7.2f} ms"


def _say(what: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    results = Results()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sample = generate(tmp / "shop")
        _say("-p piped")
        run_headless(tmp, sample, args.rounds, results, tty=False)
        _say("repl")
        run_repl(tmp, sample, args.rounds, results)
        _say("-p tty")
        run_headless(tmp, sample, args.rounds, results, tty=True)
        _say("done")
    load_after = os.getloadavg()[0]
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after; "
          f"{os.cpu_count()} cores")  # fmt: skip
    print("(a) keystroke -> echo in a pty")
    print(f"    idle at the prompt            {_ms(results.echo['idle'])}")
    print(f"    10 subagents streaming        {_ms(results.echo['busy'])}"
          f"  ({len(results.echo['busy'])} keys)")  # fmt: skip
    print(f"(b) coordinator time between turns, 10 subagents streaming, {args.rounds} rounds")
    median = statistics.median
    base = {
        "turn": median(results.turn_gaps["-p piped"]),
        "main": median(results.main_gaps["-p piped"]),
        "turn cpu": median(results.turn_cpu["-p piped"]),
        "main cpu": median(results.main_cpu["-p piped"]),
    }
    for mode in ("-p piped", "repl", "-p tty"):
        for what, wall, cpu in (
            ("subagent turn", results.turn_gaps[mode], results.turn_cpu[mode]),
            ("main turn", results.main_gaps[mode], results.main_cpu[mode]),
        ):
            key = "turn" if what == "subagent turn" else "main"
            print(
                f"    {mode if what == 'subagent turn' else '':9} {what:13} wall {_ms(wall)}  "
                f"({(median(wall) - base[key]) * 1000:+.2f} ms vs -p piped)"
            )
            print(
                f"    {'':9} {'':13} cpu  median {median(cpu) * 1000:7.2f} ms"
                f"  ({(median(cpu) - base[key + ' cpu']) * 1000:+.2f} ms vs -p piped)"
            )
    redraw, rows, old = redraw_cost()
    print(
        f"(c) one redraw of the live area with {AGENTS} subagent rows: {redraw:.2f} ms "
        f"(the rows alone {rows:.2f} ms; as the rich Table drawn before: {old:.2f} ms)"
    )


if __name__ == "__main__":
    main()
