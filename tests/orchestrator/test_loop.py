"""The loop contract (DESIGN.md): one result per tool_use, in order; scheduling; reasons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.calls.permissions import Allow, Ask, Deny, default_permission, headless_asker
from orchestrator.calls.pipeline import (
    INTERRUPTED_RUNNING,
    INTERRUPTED_WAITING,
    REJECTED_EARLIER,
    ToolPipeline,
)
from orchestrator.conversation.loop import LoopConfig, RunControl, RunResult, run_loop
from orchestrator.events import Event
from orchestrator.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from orchestrator.model.scripted import ScriptedModel, ScriptedTurn
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from tests.orchestrator.probe_tools import ProbeLog, ProbeTool


def probe(label: str, **kw: Any) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "name": "Probe",
        "id": f"toolu_{label}",
        "input": {"label": label, **kw},
    }


def turn(*content: dict[str, Any], **kw: Any) -> ScriptedTurn:
    return ScriptedTurn.model_validate({"content": list(content), **kw})


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


async def run(
    turns: list[ScriptedTurn],
    tmp_path: Path,
    *,
    log: ProbeLog | None = None,
    config: LoopConfig | None = None,
    control: RunControl | None = None,
    permission: Any = None,
    tool_timeout_s: float = 60.0,
    events: list[Event] | None = None,
    asker: Any = None,
) -> RunResult:
    log = log or ProbeLog()
    ctx = ToolContext(workspace=tmp_path, cwd=tmp_path)
    sink = events.append if events is not None else (lambda e: None)
    pipeline = ToolPipeline(
        tools=ToolRegistry([ProbeTool(log, timeout_s=tool_timeout_s)]),
        ctx=ctx,
        permission=permission or default_permission("bypass"),
        asker=asker or headless_asker,
        emit=sink,
    )
    return await run_loop(
        model=ScriptedModel(turns),
        messages=[Message.user_text("go")],
        pipeline=pipeline,
        config=config or LoopConfig(),
        emit=sink,
        control=control,
    )


def results_of(result: RunResult, index: int = 2) -> list[ToolResultBlock]:
    return result.messages[index].tool_results()


async def test_text_only_turn_completes(tmp_path: Path) -> None:
    result = await run([turn(text("hello"))], tmp_path)
    assert result.reason == "completed"
    assert result.result == "hello"
    assert result.num_turns == 1


async def test_results_come_back_in_tool_use_order(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    result = await run(
        [turn(probe("a", ms=300), probe("b", ms=100), probe("c", ms=200)), turn(text("ok"))],
        tmp_path,
    )
    assert [r.tool_use_id for r in results_of(result)] == ["toolu_a", "toolu_b", "toolu_c"]
    assert [r.text() for r in results_of(result)] == ["done a", "done b", "done c"]
    assert result.reason == "completed"


async def test_safe_calls_run_together(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log = ProbeLog()
    t0 = trio.current_time()
    await run(
        [turn(*(probe(f"s{i}", ms=1000) for i in range(10))), turn(text("ok"))], tmp_path, log=log
    )
    spans = log.spans()
    assert len(spans) == 10
    assert max(end for _, end in spans.values()) - t0 == pytest.approx(1.0)


async def test_limiter_caps_safe_calls(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log = ProbeLog()
    t0 = trio.current_time()
    await run(
        [turn(*(probe(f"s{i}", ms=1000) for i in range(6))), turn(text("ok"))],
        tmp_path,
        log=log,
        config=LoopConfig(max_concurrency=2),
    )
    assert max(end for _, end in log.spans().values()) - t0 == pytest.approx(3.0)


async def test_unsafe_call_is_a_barrier(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log = ProbeLog()
    await run(
        [
            turn(
                probe("r1", ms=100),
                probe("r2", ms=300),
                probe("w", ms=100, safe=False),
                probe("r3", ms=100),
            ),
            turn(text("ok")),
        ],
        tmp_path,
        log=log,
    )
    spans = log.spans()
    assert spans["w"][0] >= max(spans["r1"][1], spans["r2"][1])
    assert spans["r3"][0] >= spans["w"][1]
    assert spans["r1"][0] == spans["r2"][0]


async def test_safe_call_starts_while_message_streams(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log = ProbeLog()
    t0 = trio.current_time()
    await run(
        [
            turn(
                probe("early", ms=10), text("more text"), probe("late", ms=10), block_latency_ms=500
            ),
            turn(text("ok")),
        ],
        tmp_path,
        log=log,
    )
    spans = log.spans()
    assert spans["early"][0] - t0 == pytest.approx(0.0)
    assert spans["late"][0] - t0 == pytest.approx(1.0)


async def test_unsafe_call_waits_for_message_end(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    log = ProbeLog()
    t0 = trio.current_time()
    await run(
        [turn(probe("w", safe=False), text("trailing"), block_latency_ms=500), turn(text("ok"))],
        tmp_path,
        log=log,
    )
    assert log.spans()["w"][0] - t0 == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ({"type": "tool_use", "name": "Nope", "id": "toolu_x", "input": {}}, "No such tool: Nope"),
        (
            {"type": "tool_use", "name": "Probe", "id": "toolu_x", "input": {}},
            "label: Field required",
        ),
        (
            {
                "type": "tool_use",
                "name": "Probe",
                "id": "toolu_x",
                "input": {"label": "x", "bogus": 1},
            },
            "bogus: Extra inputs are not permitted",
        ),
        (probe("x", fail="raise"), "RuntimeError: probe exploded"),
        (probe("x", fail="tool_error"), "probe x refused"),
    ],
)
async def test_bad_calls_become_error_results(
    tmp_path: Path, call: dict[str, Any], expected: str
) -> None:
    result = await run([turn(call), turn(text("ok"))], tmp_path)
    [only] = results_of(result)
    assert only.is_error
    assert expected in only.text()
    assert result.reason == "completed"


async def test_hanging_tool_times_out(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    result = await run(
        [turn(probe("h", fail="hang")), turn(text("ok"))], tmp_path, tool_timeout_s=5
    )
    [only] = results_of(result)
    assert only.is_error and "timed out after 5 s" in only.text()


async def test_huge_output_is_cut_to_head_and_tail(tmp_path: Path) -> None:
    result = await run([turn(probe("big", fail="huge")), turn(text("ok"))], tmp_path)
    [only] = results_of(result)
    assert len(only.text()) < 101_000
    assert "removed from the middle" in only.text()


async def test_malformed_tool_json_gets_error_result(tmp_path: Path) -> None:
    class Broken(ScriptedModel):
        pass

    block = ToolUseBlock(id="toolu_bad", name="Probe", input={}, parse_error="Expecting ',' at 12")
    log = ProbeLog()
    ctx = ToolContext(workspace=tmp_path, cwd=tmp_path)
    pipeline = ToolPipeline(
        tools=ToolRegistry([ProbeTool(log)]),
        ctx=ctx,
        permission=default_permission("bypass"),
        asker=headless_asker,
        emit=lambda e: None,
    )
    result = await pipeline.execute(pipeline.prepare(block))
    assert (
        result.is_error and "not valid JSON" in result.text() and "Expecting ','" in result.text()
    )


async def test_empty_assistant_message_completes(tmp_path: Path) -> None:
    result = await run([turn()], tmp_path)
    assert result.reason == "completed"
    assert result.result == ""


async def test_max_turns(tmp_path: Path) -> None:
    result = await run(
        [turn(probe(f"p{i}")) for i in range(5)], tmp_path, config=LoopConfig(max_turns=3)
    )
    assert result.reason == "max_turns"
    assert result.num_turns == 3
    assert result.messages[-1].role == "user"


async def test_model_error_ends_run(tmp_path: Path) -> None:
    result = await run([turn(probe("a"))], tmp_path)
    assert result.reason == "model_error"
    assert "no turn left for the main agent" in result.result


async def test_headless_ask_becomes_deny_naming_the_tool(tmp_path: Path) -> None:
    events: list[Event] = []
    result = await run(
        [turn(probe("w", safe=False)), turn(text("ok"))],
        tmp_path,
        permission=default_permission("default"),
        events=events,
    )
    [only] = results_of(result)
    assert only.is_error
    assert "--allowed-tools Probe" in only.text()


async def test_permission_can_rewrite_input(tmp_path: Path) -> None:
    async def rewrite(plan: Any, ctx: Any) -> Allow | Deny | Ask:
        return Allow(updated_input={"label": "rewritten"})

    result = await run([turn(probe("orig")), turn(text("ok"))], tmp_path, permission=rewrite)
    assert results_of(result)[0].text() == "done rewritten"


async def test_interrupt_fills_missing_results(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    control = RunControl()
    log = ProbeLog()

    async def interrupt_soon() -> None:
        await trio.sleep(1.5)
        control.interrupt()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt_soon)
        result = await run(
            [
                turn(
                    probe("done", ms=1000),
                    probe("w", ms=1000, safe=False),
                    probe("after", safe=True),
                ),
                turn(text("never")),
            ],
            tmp_path,
            log=log,
            control=control,
        )
    assert result.reason == "interrupted"
    texts = [r.text() for r in results_of(result)]
    assert texts == ["done done", INTERRUPTED_RUNNING, INTERRUPTED_WAITING]
    assert result.messages[-1].content[-1].type == "text"


async def test_interrupt_mid_stream_keeps_completed_blocks(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    control = RunControl()

    async def interrupt_soon() -> None:
        await trio.sleep(0.7)
        control.interrupt()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt_soon)
        result = await run(
            [turn(probe("a", ms=5000), probe("b"), block_latency_ms=1000)],
            tmp_path,
            control=control,
        )
    assert result.reason == "interrupted"
    assistant = result.messages[1]
    assert [b.id for b in assistant.tool_uses()] == ["toolu_a"]
    assert [r.tool_use_id for r in results_of(result)] == ["toolu_a"]


def test_message_copy_does_not_keep_a_stale_api_form() -> None:
    original = Message.user_text("before")
    assert original.to_api()["content"][0]["text"] == "before"
    changed = original.model_copy(update={"content": [TextBlock(text="after")]})
    assert changed.to_api()["content"][0]["text"] == "after"


async def test_a_tool_without_its_own_limit_gets_the_sessions(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    from collections.abc import AsyncIterator

    from orchestrator.tools.base import Tool, ToolInput, ToolOutput, ToolProgress

    class Nothing(ToolInput):
        pass

    class Hang(Tool[Nothing]):
        name = "Hang"
        input_model = Nothing
        description = "Never returns."

        async def call(
            self, input: Nothing, ctx: ToolContext
        ) -> AsyncIterator[ToolProgress | ToolOutput]:
            await trio.sleep_forever()
            yield ToolOutput.text("unreachable")

    pipeline = ToolPipeline(
        tools=ToolRegistry([Hang()]),
        ctx=ToolContext(workspace=tmp_path, cwd=tmp_path),
        permission=default_permission("bypass"),
        asker=headless_asker,
        emit=lambda e: None,
        default_timeout_s=7,
    )
    block = ToolUseBlock(id="toolu_h", name="Hang", input={})
    result = await pipeline.execute(pipeline.prepare(block))
    assert result.is_error and "timed out after 7 s" in result.text()


@pytest.mark.parametrize("by_user", [True, False])
async def test_a_call_the_user_rejects_stops_the_calls_queued_after_it(
    tmp_path: Path, by_user: bool
) -> None:
    """The user's "no" stops the rest of the batch (issue 13); a denial that is not the
    user's (a headless deny, a policy) stops only its own call."""
    asked: list[str] = []

    async def asker(tool: Any, input: Any, ask: Ask) -> Allow | Deny:
        asked.append(input.label)
        if input.label == "a":
            return Deny("no", rule="user: no", by_user=by_user)
        return Allow(rule="user: yes")

    log = ProbeLog()
    result = await run(
        [
            turn(
                probe("r", safe=True),
                probe("a", safe=False),
                probe("b", safe=False),
                probe("c", safe=True),
            ),
            turn(text("ok")),
        ],
        tmp_path,
        log=log,
        permission=default_permission("default"),
        asker=asker,
    )
    texts = [r.text() for r in results_of(result)]
    assert texts[0] == "done r" and "no" in texts[1]
    if by_user:
        assert asked == ["a"] and log.started() == ["r"]
        assert texts[2:] == [REJECTED_EARLIER, REJECTED_EARLIER]
    else:
        assert asked == ["a", "b"] and sorted(log.started()) == ["b", "c", "r"]
        assert texts[2:] == ["done b", "done c"]
    assert result.reason == "completed"
