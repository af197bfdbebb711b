"""Output limits (issue 11, item 5): per-model `max_tokens`, replies cut at `max_tokens`
continued or retried higher and never a clean `completed`, extended thinking echoed back
exactly. The real SDK over a real socket to the fake Messages API, through `run_loop`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.calls.permissions import default_permission, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.conversation.continuation import (
    CONTINUE_PROMPT,
    THINKING_ANSWER_TOKENS,
    OutputPlan,
    output_plan,
)
from orchestrator.conversation.loop import LoopConfig, RunResult, run_loop
from orchestrator.messages import Message, RedactedThinkingBlock, TextBlock, ThinkingBlock
from orchestrator.model.catalog import output_limit
from orchestrator.outcome import exit_code
from orchestrator.records.transcripts import SessionStore
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from tests.kit.fake_api import (
    TEST_MODEL,
    FakeMessagesAPI,
    FakeResponse,
    RecordedRequest,
    Reply,
    model_for,
)
from tests.orchestrator.probe_tools import ProbeLog, ProbeTool

CUT = {"stop_reason": "max_tokens"}


async def run(
    api: FakeMessagesAPI,
    tmp_path: Path,
    *,
    config: LoopConfig | None = None,
    model: str = TEST_MODEL,
    log: ProbeLog | None = None,
) -> RunResult:
    pipeline = ToolPipeline(
        tools=ToolRegistry([ProbeTool(log or ProbeLog())]),
        ctx=ToolContext(workspace=tmp_path, cwd=tmp_path),
        permission=default_permission("bypass"),
        asker=headless_asker,
        emit=lambda event: None,
    )
    client = model_for(api, model=model)
    try:
        return await run_loop(
            model=client,
            messages=[Message.user_text("write the essay")],
            pipeline=pipeline,
            config=config or LoopConfig(),
            emit=lambda event: None,
        )
    finally:
        await client.aclose()


def cut_probe(label: str) -> dict[str, Any]:
    """A Probe call whose input JSON stops mid-way, as a reply cut at max_tokens streams it."""
    return {"type": "tool_use", "name": "Probe", "partial_json": f'{{"label": "{label}", "ms'}


def probe(label: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": "Probe", "input": {"label": label}}


async def test_requests_ask_for_the_models_default_max_tokens(tmp_path: Path) -> None:
    with FakeMessagesAPI([Reply.text("hi")] * 3) as api:
        await run(api, tmp_path)
        await run(api, tmp_path, model="claude-3-5-haiku-20241022")
        await run(api, tmp_path, config=LoopConfig(max_tokens=10**6))
        sent = [r.body["max_tokens"] for r in api.requests]
    # sonnet 4.6: its 64,000 limit capped at 32,000; 3.5 haiku: its 8,192; configured: clamped
    assert sent == [32_000, 8_192, 64_000]


async def test_a_cut_text_is_continued_and_the_result_holds_the_whole_answer(
    tmp_path: Path,
) -> None:
    replies = [
        Reply.text("The first part of the essay, ", **CUT),
        Reply.text("the second part, ", **CUT),
        Reply.text("and the end."),
    ]
    with FakeMessagesAPI(replies) as api:
        result = await run(api, tmp_path)
        requests = api.requests
    assert result.reason == "completed"
    assert result.result == "The first part of the essay, the second part, and the end."
    assert result.num_turns == 3
    # Each continuation carries the cut text and asks to go on from exactly there.
    assert _texts(requests[2]) == [
        ("user", "write the essay"),
        ("assistant", "The first part of the essay, "),
        ("user", CONTINUE_PROMPT),
        ("assistant", "the second part, "),
        ("user", CONTINUE_PROMPT),
    ]
    assert [m.role for m in result.messages] == ["user", "assistant"] * 3


async def test_a_text_that_stays_cut_ends_output_truncated_never_completed(tmp_path: Path) -> None:
    replies = [Reply.text(f"piece {i}; ", **CUT) for i in range(4)]
    with FakeMessagesAPI([*replies, Reply.text("never asked for")]) as api:
        result = await run(api, tmp_path)
        asked = len(api.requests)
    assert result.reason == "output_truncated" and exit_code(result.reason) == 9
    assert result.result == "piece 0; piece 1; piece 2; piece 3; "
    assert asked == 4  # the first reply and three continuations
    # The cut texts stay in the conversation, so a next prompt (or --resume) goes on from them.
    assert result.messages[-1].role == "assistant" and result.messages[-1].text() == "piece 3; "


async def test_a_cut_tool_call_is_retried_with_a_higher_max_tokens(tmp_path: Path) -> None:
    """The fake server cuts the call whenever max_tokens is below the model's limit: only the
    retry with the higher limit gets the whole call, and the cut reply is not kept."""
    limit = output_limit(TEST_MODEL)
    answered: list[int] = []

    def route(request: RecordedRequest) -> FakeResponse | None:
        if any(m["role"] == "user" and _has_results(m) for m in request.messages):
            return Reply.text("written")
        answered.append(request.body["max_tokens"])
        if request.body["max_tokens"] < limit:
            return Reply(content=[{"type": "text", "text": "Writing it."}, cut_probe("big")], **CUT)
        return Reply(content=[{"type": "text", "text": "Writing it."}, probe("big")])

    log = ProbeLog()
    with FakeMessagesAPI(route=route) as api:
        result = await run(api, tmp_path, log=log)
        requests = api.requests
    assert answered == [32_000, limit]
    assert result.reason == "completed" and result.result == "written"
    assert log.started() == ["big"]  # once: the cut call never ran
    # The third request carries the whole call and its result, and nothing of the cut reply.
    history = requests[2].messages
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    call = next(b for b in history[1]["content"] if b["type"] == "tool_use")
    assert call["input"] == {"label": "big"}
    # Back to the default once the retry got through.
    assert requests[2].body["max_tokens"] == 32_000


async def test_a_tool_call_still_cut_after_the_retry_ends_output_truncated(
    tmp_path: Path,
) -> None:
    replies = [Reply(content=[cut_probe("huge")], **CUT), Reply(content=[cut_probe("huge")], **CUT)]
    log = ProbeLog()
    with FakeMessagesAPI([*replies, Reply.text("never asked for")]) as api:
        result = await run(api, tmp_path, log=log)
        sent = [r.body["max_tokens"] for r in api.requests]
    assert sent == [32_000, output_limit(TEST_MODEL)]
    assert result.reason == "output_truncated"
    assert "inside a Probe call" in result.result and "after a retry" in result.result
    assert [m.role for m in result.messages] == ["user"]  # no cut call, no orphan tool_use
    assert log.events == []  # the cut call never ran


async def test_a_cut_call_at_the_models_limit_is_not_retried(tmp_path: Path) -> None:
    limit = output_limit(TEST_MODEL)
    with FakeMessagesAPI([Reply(content=[cut_probe("x")], **CUT)]) as api:
        result = await run(api, tmp_path, config=LoopConfig(max_tokens=limit))
        assert len(api.requests) == 1
    assert result.reason == "output_truncated" and "after a retry" not in result.result


async def test_thinking_blocks_are_echoed_back_exactly(tmp_path: Path) -> None:
    thinking = {"type": "thinking", "thinking": "Let me look first.", "signature": "c2lnLTE="}
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDF"}
    replies = [
        Reply(content=[thinking, redacted, probe("look")]),
        Reply(content=[{**thinking, "signature": "c2lnLTI="}, {"type": "text", "text": "done"}]),
    ]
    with FakeMessagesAPI(replies) as api:
        result = await run(api, tmp_path, config=LoopConfig(thinking_budget=40_000))
        requests = api.requests
    assert result.reason == "completed" and result.result == "done"
    for request in requests:
        assert request.body["thinking"] == {"type": "enabled", "budget_tokens": 40_000}
        assert request.body["max_tokens"] == 40_000 + THINKING_ANSWER_TOKENS
    echoed = requests[1].messages[1]["content"]
    assert echoed[0] == thinking  # signature included, byte for byte
    assert echoed[1] == redacted
    assert echoed[2]["type"] == "tool_use"
    assert result.messages[1].content[:2] == [
        ThinkingBlock(thinking="Let me look first.", signature="c2lnLTE="),
        RedactedThinkingBlock(data="EmwKAhgBEgy3va3pzix/LafPsn4aDF"),
    ]


async def test_without_thinking_no_thinking_parameter_is_sent(tmp_path: Path) -> None:
    with FakeMessagesAPI([Reply.text("hi")]) as api:
        await run(api, tmp_path)
        assert "thinking" not in api.requests[0].body


def test_output_plan_fits_thinking_under_the_limit() -> None:
    assert output_plan(32_000, None, 64_000) == OutputPlan(32_000, None)
    assert output_plan(100_000, None, 64_000) == OutputPlan(64_000, None)
    assert output_plan(32_000, 10_000, 64_000) == OutputPlan(32_000, 10_000)
    assert output_plan(8_000, 10_000, 64_000) == OutputPlan(10_000 + THINKING_ANSWER_TOKENS, 10_000)
    # A budget the limit cannot hold leaves room for an answer.
    assert output_plan(8_192, 100_000, 8_192) == OutputPlan(8_192, 8_192 - THINKING_ANSWER_TOKENS)


def _texts(request: RecordedRequest) -> list[tuple[str, str]]:
    return [(m["role"], "".join(b.get("text", "") for b in m["content"])) for m in request.messages]


def _has_results(message: dict[str, Any]) -> bool:
    return any(b.get("type") == "tool_result" for b in message["content"])


def test_thinking_blocks_survive_the_transcript(tmp_path: Path) -> None:
    """`--resume` sends thinking back as it came: the transcript keeps both kinds whole."""
    reply = Message(
        role="assistant",
        content=[
            ThinkingBlock(thinking="Let me look first.", signature="c2lnLTE="),
            RedactedThinkingBlock(data="EmwKAhgBEgy3va3pzix/LafPsn4aDF"),
            TextBlock(text="done"),
        ],
    )
    store = SessionStore(tmp_path / "sessions")
    transcript = store.create(cwd=tmp_path, model=TEST_MODEL)
    transcript.message(Message.user_text("go"))
    transcript.message(reply)
    transcript.close()
    loaded = store.load(transcript.session_id)
    assert loaded.messages[1] == reply
    assert loaded.messages[1].to_api() == reply.to_api()
