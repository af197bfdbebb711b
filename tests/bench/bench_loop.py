"""Kernel benchmarks (issue "Agent kernel"): each prints a ratio or median from one run.

    .venv/bin/python tests/bench/bench_loop.py

(a) one turn of 10 read-only calls of 1 s each: wall / 1 s            (goal <= 1.05)
(b) content_block_stop sent -> the call starts, median, real socket    (goal <= 5 ms)
(c) last tool result -> next request arrives, median, real socket,
    10-message vs 1,000-message history                                (goal <= 5 ms, <= 2x)
(d) `warren -p` launch -> first request, beside `python -c "import anthropic"`
(e) peak RSS of a 4-turn `warren -p` session                           (goal <= 120 MB)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.calls.permissions import default_permission, headless_asker  # noqa: E402
from orchestrator.calls.pipeline import ToolPipeline  # noqa: E402
from orchestrator.conversation.loop import LoopConfig, run_loop  # noqa: E402
from orchestrator.messages import Message, TextBlock  # noqa: E402
from orchestrator.model.anthropic import AnthropicModel  # noqa: E402
from orchestrator.model.scripted import ScriptedModel, ScriptedTurn  # noqa: E402
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress  # noqa: E402
from orchestrator.tools.registry import ToolRegistry  # noqa: E402
from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402


class NapInput(ToolInput):
    label: str
    seconds: float = 0.0


class NapTool(Tool[NapInput]):
    """A read-only tool that sleeps and records when it started and ended (monotonic)."""

    name = "Nap"
    input_model = NapInput
    description = "Sleeps."

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}
        self.ends: dict[str, float] = {}

    def is_read_only(self, input: NapInput) -> bool:
        return True

    async def call(
        self, input: NapInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        self.starts[input.label] = time.monotonic()
        if input.seconds:
            await trio.sleep(input.seconds)
        self.ends[input.label] = time.monotonic()
        yield ToolOutput.text("ok")


def nap(label: str, seconds: float = 0.0) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "name": "Nap",
        "id": f"toolu_{label}",
        "input": {"label": label, "seconds": seconds},
    }


def pipeline_for(tool: NapTool, ws: Path) -> ToolPipeline:
    return ToolPipeline(
        tools=ToolRegistry([tool]),
        ctx=ToolContext(workspace=ws, cwd=ws),
        permission=default_permission("default"),
        asker=headless_asker,
        emit=lambda e: None,
    )


async def bench_a(ws: Path) -> None:
    tool = NapTool()
    turns = [
        ScriptedTurn.model_validate({"content": [nap(f"n{i}", 1.0) for i in range(10)]}),
        ScriptedTurn.model_validate({"content": [{"type": "text", "text": "done"}]}),
    ]
    started = time.monotonic()
    await run_loop(
        model=ScriptedModel(turns),
        messages=[Message.user_text("go")],
        pipeline=pipeline_for(tool, ws),
        config=LoopConfig(),
        emit=lambda e: None,
    )
    wall = time.monotonic() - started
    print(
        f"(a) 10 read-only calls x 1 s in one turn: wall {wall:.3f} s, "
        f"ratio {wall / 1.0:.3f} (goal <= 1.05)"
    )


async def bench_b(ws: Path) -> None:
    tool = NapTool()
    n = 20
    # Each block is followed by a pause, so "block complete" and "call started" pair up.
    reply = Reply(content=[nap(f"b{i}") for i in range(n)], block_delay_s=0.02)
    with FakeMessagesAPI([reply, Reply.text("done")]) as api:
        model = AnthropicModel("claude-sonnet-4-6", api_key="sk-bench", base_url=api.base_url)
        try:
            await run_loop(
                model=model,
                messages=[Message.user_text("go")],
                pipeline=pipeline_for(tool, ws),
                config=LoopConfig(),
                emit=lambda e: None,
            )
        finally:
            await model.aclose()
        request = api.requests[0]
    lags = [
        (tool.starts[f"b{i}"] - request.event_time("content_block_stop", i)) * 1000
        for i in range(n)
    ]
    print(
        "(b) content_block_stop -> call start over a real socket: "
        f"median {statistics.median(lags):.2f} ms, "
        f"max {max(lags):.2f} ms over {n} blocks (goal <= 5 ms)"
    )


def history(n: int) -> list[Message]:
    messages: list[Message] = []
    for i in range(n // 2):
        messages.append(
            Message(
                role="user",
                content=[TextBlock(text=f"request {i}: please look at file_{i}.py and report")],
            )
        )
        messages.append(
            Message(
                role="assistant", content=[TextBlock(text=f"answer {i} " + "lorem ipsum " * 20)]
            )
        )
    messages.append(Message.user_text("go"))
    return messages


async def gap_median(ws: Path, prior: list[Message], turns: int) -> float:
    tool = NapTool()
    replies = [Reply(content=[nap(f"c{i}")]) for i in range(turns)] + [Reply.text("done")]
    with FakeMessagesAPI(replies) as api:
        model = AnthropicModel("claude-sonnet-4-6", api_key="sk-bench", base_url=api.base_url)
        try:
            await run_loop(
                model=model,
                messages=prior,
                pipeline=pipeline_for(tool, ws),
                config=LoopConfig(),
                emit=lambda e: None,
            )
        finally:
            await model.aclose()
        requests = api.requests
    gaps = [(requests[i + 1].started_at - tool.ends[f"c{i}"]) * 1000 for i in range(turns)]
    return statistics.median(gaps[1:])  # the first turn warms the connection


async def bench_c(ws: Path) -> None:
    small = await gap_median(ws, history(10), 40)
    large = await gap_median(ws, history(1000), 40)
    print(
        f"(c) last tool result -> next request: median {small:.2f} ms with 10 messages, "
        f"{large:.2f} ms with 1,000 (ratio {large / small:.2f}; goals <= 5 ms, <= 2x)"
    )


def bench_d_e(ws: Path) -> None:
    warren = ROOT / ".venv" / "bin" / "warren"
    python = ROOT / ".venv" / "bin" / "python"
    imports = []
    for _ in range(5):
        t0 = time.monotonic()
        subprocess.run([python, "-c", "import anthropic"], check=True)
        imports.append(time.monotonic() - t0)
    launches = []
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "XDG_STATE_HOME": state, "ANTHROPIC_API_KEY": "sk-bench"}
        for _ in range(5):
            with FakeMessagesAPI([Reply.text("hi")]) as api:
                t0 = time.monotonic()
                subprocess.run(
                    [warren, "-p", "hello", "--cwd", ws],
                    env={**env, "ANTHROPIC_BASE_URL": api.base_url},
                    check=True,
                    capture_output=True,
                )
                launches.append(api.requests[0].started_at - t0)
        print(
            "(d) `warren -p` launch -> first request: "
            f"median {statistics.median(launches) * 1000:.0f} ms; "
            f"`python -c 'import anthropic'`: median {statistics.median(imports) * 1000:.0f} ms "
            f"(ratio {statistics.median(launches) / statistics.median(imports):.2f})"
        )
        (ws / "a.txt").write_text("alpha\n" * 100)
        replies = [
            Reply(
                content=[
                    {"type": "tool_use", "name": "Read", "input": {"file_path": str(ws / "a.txt")}}
                ]
            ),
            Reply(
                content=[
                    {
                        "type": "tool_use",
                        "name": "Grep",
                        "input": {"pattern": "alpha", "path": str(ws)},
                    }
                ]
            ),
            Reply(content=[{"type": "tool_use", "name": "LS", "input": {"path": str(ws)}}]),
            Reply.text("done"),
        ]
        with FakeMessagesAPI(replies) as api:
            proc = subprocess.Popen(
                [warren, "-p", "hello", "--cwd", ws],
                env={**env, "ANTHROPIC_BASE_URL": api.base_url},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            coordinator, hosts = peak_rss(proc)
            turns = len(api.requests)
        print(
            f"(e) peak RSS of a {turns}-turn `warren -p` session: coordinator {coordinator:.1f} MB "
            f"(goal <= 120 MB); its sandboxed processes at most {hosts:.1f} MB each "
            f"(exit {proc.returncode})"
        )


def peak_rss(proc: subprocess.Popen[bytes]) -> tuple[float, float]:
    """The coordinator's own high-water mark (VmHWM, read until it exits) and the largest
    peak among its descendants (polled). `wait4`'s ru_maxrss would mix in forked children."""
    import psutil

    coordinator = 0.0
    children = 0.0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):
                        coordinator = max(coordinator, int(line.split()[1]) / 1024)
            for child in psutil.Process(proc.pid).children(recursive=True):
                children = max(children, child.memory_info().rss / 2**20)
        except (OSError, psutil.Error):
            pass
        time.sleep(0.005)
    return coordinator, children


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        await bench_a(ws)
        await bench_b(ws)
        await bench_c(ws)
        await trio.to_thread.run_sync(bench_d_e, ws)


if __name__ == "__main__":
    trio.run(main)
