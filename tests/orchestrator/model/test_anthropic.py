"""The Anthropic client: the real SDK over a real socket against the fake Messages API.

Ordering is proven with the fake's hold points (the server pauses until the test releases it),
never with sleeps; backoff waits go to a recording sleep.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from contextlib import aclosing

import pytest
import trio

from orchestrator.errors import ModelError
from orchestrator.messages import Message, TextBlock, ThinkingBlock, ToolUseBlock, Usage
from orchestrator.model.anthropic import AnthropicModel, warm_up
from orchestrator.model.base import (
    BlockComplete,
    MessageComplete,
    ModelClient,
    ModelEvent,
    ModelRequest,
    Retry,
    TextDelta,
    ToolSpec,
)
from orchestrator.model.catalog import cost_usd
from orchestrator.model.retry import RetryPolicy
from tests.kit.fake_api import (
    TEST_MODEL,
    DropConnection,
    FakeMessagesAPI,
    HttpError,
    MalformedToolJson,
    MidStreamError,
    RecordingSleep,
    Reply,
    Stall,
    model_for,
)

REQUEST = ModelRequest(system=["You are a test."], messages=[Message.user_text("hi")])
NO_JITTER = RetryPolicy(jitter=0.0)


async def collect(model: AnthropicModel, request: ModelRequest = REQUEST) -> list[ModelEvent]:
    events: list[ModelEvent] = []
    try:
        async with aclosing(model.stream(request)) as stream:
            async for event in stream:
                events.append(event)
    finally:
        await model.aclose()
    return events


def final(events: list[ModelEvent]) -> MessageComplete:
    assert isinstance(events[-1], MessageComplete)
    assert sum(isinstance(e, MessageComplete) for e in events) == 1
    return events[-1]


def sent_key(headers: Mapping[str, str]) -> str | None:
    """The key as sent: `x-api-key`, or a bearer token (as SDK 2.x does)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    return headers.get("authorization", "").removeprefix("Bearer ") or None


def after_last_retry(events: list[ModelEvent]) -> list[ModelEvent]:
    """What a consumer keeps: everything since the last `Retry`."""
    starts = [i for i, e in enumerate(events) if isinstance(e, Retry)]
    return events[starts[-1] + 1 :] if starts else events


async def test_the_model_is_a_model_client() -> None:
    with FakeMessagesAPI() as api:
        model = model_for(api)
        assert isinstance(model, ModelClient)
        assert model.model == TEST_MODEL
        await model.aclose()


async def test_one_connection_serves_every_turn() -> None:
    """A consumer that stops at `MessageComplete` (as the loop does) still leaves the
    connection reusable: the body is read to its end first. Otherwise every turn opens a new
    connection (a TLS handshake against the real API) and leaves a TIME_WAIT socket behind."""
    with FakeMessagesAPI([Reply.text(f"turn {i}") for i in range(3)]) as api:
        model = model_for(api)
        try:
            for _ in range(3):
                async with aclosing(model.stream(REQUEST)) as stream:
                    async for event in stream:
                        if isinstance(event, MessageComplete):
                            break
        finally:
            await model.aclose()
        requests = api.requests
    assert [r.response for r in requests] == ["Reply"] * 3
    assert [r.connection for r in requests] == [0, 0, 0]


async def test_warm_up_imports_the_sdk_in_a_thread() -> None:
    await warm_up()
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        model = model_for(api)
        await model.warm_up()
        assert final(await collect(model)).message.message.text() == "ok"


async def test_text_streams_as_deltas_before_the_message_ends() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 3
    with FakeMessagesAPI([Reply.text(text, hold_before_stop=True)]) as api:
        model = model_for(api)
        deltas: list[str] = []
        complete: MessageComplete | None = None
        try:
            async with aclosing(model.stream(REQUEST)) as stream:
                async for event in stream:
                    if isinstance(event, TextDelta):
                        deltas.append(event.text)
                    elif isinstance(event, BlockComplete):
                        # The whole text has arrived while the server still holds the end of
                        # the message: the deltas were not buffered until message_stop.
                        assert [e.name for e in api.requests[0].events][-1] == "content_block_stop"
                        api.release()
                    elif isinstance(event, MessageComplete):
                        complete = event
        finally:
            await model.aclose()
    assert len(deltas) > 5
    assert "".join(deltas) == text
    assert complete is not None
    assert complete.message.message.content == [TextBlock(text=text)]
    assert complete.message.stop_reason == "end_turn"


async def test_each_tool_use_completes_before_the_next_block_is_sent() -> None:
    reply = Reply(
        content=[
            {"type": "text", "text": "Reading two files."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": "/repo/a.py"}},
            {
                "type": "tool_use",
                "name": "Read",
                "input": {"file_path": "/repo/b.py"},
                "id": "toolu_b",
            },
        ],
        hold_before_block=2,
    )
    with FakeMessagesAPI([reply]) as api:
        model = model_for(api)
        completed: list[BlockComplete] = []
        events: list[ModelEvent] = []
        try:
            async with aclosing(model.stream(REQUEST)) as stream:
                async for event in stream:
                    events.append(event)
                    if isinstance(event, BlockComplete):
                        completed.append(event)
                        if event.index == 1:
                            sent = [(e.name, e.index) for e in api.requests[0].events]
                            assert ("content_block_start", 2) not in sent
                            api.release()
        finally:
            await model.aclose()
    first, second = completed[1].block, completed[2].block
    assert isinstance(first, ToolUseBlock) and isinstance(second, ToolUseBlock)
    assert first.input == {"file_path": "/repo/a.py"} and first.id.startswith("toolu_")
    assert second.input == {"file_path": "/repo/b.py"} and second.id == "toolu_b"
    message = final(events).message
    assert message.stop_reason == "tool_use"
    assert message.message.tool_uses() == [first, second]
    # input JSON arrived in several pieces, yet no tool delta was surfaced as text
    assert not any(isinstance(e, TextDelta) and e.index != 0 for e in events)


async def test_malformed_tool_json_becomes_a_parse_error_not_a_retry() -> None:
    with FakeMessagesAPI([MalformedToolJson(name="Read", raw_json='{"file_path": "/a", ')]) as api:
        events = await collect(model_for(api))
        assert len(api.requests) == 1
    [tool] = final(events).message.message.tool_uses()
    assert tool.name == "Read" and tool.input == {}
    assert tool.parse_error is not None
    assert "not valid JSON" in tool.parse_error and '{"file_path": "/a", ' in tool.parse_error
    assert not any(isinstance(e, Retry) for e in events)


async def test_429_waits_as_long_as_retry_after_says() -> None:
    sleep = RecordingSleep()
    with FakeMessagesAPI([HttpError(429, headers={"retry-after": "3"}), Reply.text("ok")]) as api:
        events = await collect(model_for(api, sleep=sleep))
        assert len(api.requests) == 2
    [retry] = [e for e in events if isinstance(e, Retry)]
    assert retry.attempt == 2 and retry.delay_s == 3.0 and retry.status == 429
    assert "rate limit" in retry.error
    assert sleep.delays == [3.0]
    assert final(events).message.message.text() == "ok"


async def test_retry_after_ms_is_honoured() -> None:
    sleep = RecordingSleep()
    with FakeMessagesAPI(
        [HttpError(429, headers={"retry-after-ms": "1500"}), Reply.text("ok")]
    ) as api:
        await collect(model_for(api, sleep=sleep))
    assert sleep.delays == [1.5]


async def test_529_before_the_stream_backs_off_on_the_schedule() -> None:
    sleep = RecordingSleep()
    with FakeMessagesAPI(
        [HttpError(529, headers={}), HttpError(503, headers={}), Reply.text("ok")]
    ) as api:
        events = await collect(model_for(api, sleep=sleep, retry=NO_JITTER))
    retries = [e for e in events if isinstance(e, Retry)]
    assert [(r.attempt, r.status) for r in retries] == [(2, 529), (3, 503)]
    assert sleep.delays == [0.5, 1.0]
    assert "overloaded_error" in retries[0].error


async def test_overloaded_mid_stream_restarts_and_discards_partial_output() -> None:
    partial = Reply.text("FIRST attempt text that must vanish", text_chunk_chars=5)
    with FakeMessagesAPI(
        [MidStreamError(after_events=6, reply=partial), Reply.text("second")]
    ) as api:
        events = await collect(model_for(api))
        assert [r.response for r in api.requests] == ["MidStreamError", "Reply"]
    retry_at = next(i for i, e in enumerate(events) if isinstance(e, Retry))
    assert any(isinstance(e, TextDelta) for e in events[:retry_at]), "partial output streamed"
    retry = events[retry_at]
    assert isinstance(retry, Retry) and retry.attempt == 2 and "overloaded_error" in retry.error
    kept = after_last_retry(events)
    assert "".join(e.text for e in kept if isinstance(e, TextDelta)) == "second"
    assert final(events).message.message.content == [TextBlock(text="second")]


async def test_a_dropped_connection_mid_stream_is_retried() -> None:
    with FakeMessagesAPI([DropConnection(after_events=5), Reply.text("recovered")]) as api:
        events = await collect(model_for(api))
        assert len(api.requests) == 2
    [retry] = [e for e in events if isinstance(e, Retry)]
    assert "dropped" in retry.error and retry.status is None
    assert final(events).message.message.text() == "recovered"


async def test_a_stalled_stream_times_out_and_is_retried() -> None:
    with FakeMessagesAPI([Stall(after_events=3, seconds=30), Reply.text("fresh")]) as api:
        events = await collect(model_for(api, read_timeout_s=0.2))
        assert len(api.requests) == 2
    [retry] = [e for e in events if isinstance(e, Retry)]
    assert "read timeout" in retry.error
    assert final(events).message.message.text() == "fresh"


async def test_a_rejected_key_fails_at_once() -> None:
    with FakeMessagesAPI([HttpError(401), Reply.text("never")]) as api:
        with pytest.raises(ModelError) as caught:
            await collect(model_for(api))
        assert len(api.requests) == 1
    assert caught.value.reason == "model_error"
    assert caught.value.status == 401
    assert "API key was rejected" in str(caught.value) and "ANTHROPIC_API_KEY" in str(caught.value)
    assert caught.value.__cause__ is not None  # the SDK error, translated once


async def test_a_prompt_that_is_too_long_ends_with_its_own_reason() -> None:
    too_long = HttpError(400, message="prompt is too long: 212345 tokens > 200000 maximum")
    with FakeMessagesAPI([too_long]) as api:
        with pytest.raises(ModelError) as caught:
            await collect(model_for(api))
        assert len(api.requests) == 1
    assert caught.value.reason == "prompt_too_long"
    assert "212345 tokens" in str(caught.value)


@pytest.mark.parametrize(
    ("error", "needle"),
    [
        (HttpError(400, message="messages: roles must alternate"), "roles must alternate"),
        (HttpError(402), "credit balance"),
        (HttpError(400, message="Your credit balance is too low"), "billing"),
        (HttpError(403), "not permitted"),
        (HttpError(404, message="model: claude-nope"), "was not found"),
    ],
)
async def test_other_client_errors_are_not_retried(error: HttpError, needle: str) -> None:
    with FakeMessagesAPI([error]) as api:
        with pytest.raises(ModelError, match=needle) as caught:
            await collect(model_for(api))
        assert len(api.requests) == 1
    assert caught.value.reason == "model_error"
    assert caught.value.status == error.status


async def test_ten_failed_attempts_give_up_with_the_last_error() -> None:
    sleep = RecordingSleep()
    script = [HttpError(500, headers={})] * 9 + [MidStreamError(after_events=1)]
    with FakeMessagesAPI(script) as api:
        model = model_for(api, sleep=sleep, retry=NO_JITTER)
        events: list[ModelEvent] = []
        with pytest.raises(ModelError) as caught:
            async with aclosing(model.stream(REQUEST)) as stream:
                async for event in stream:
                    events.append(event)
        await model.aclose()
        assert len(api.requests) == 10 and api.unanswered == 0
    assert [e.attempt for e in events if isinstance(e, Retry)] == list(range(2, 11))
    assert sleep.delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 32.0, 32.0]
    assert "after 10 attempts" in str(caught.value) and "overloaded_error" in str(caught.value)
    assert caught.value.reason == "model_error"


async def test_running_out_of_script_fails_at_once_with_the_fakes_message() -> None:
    with FakeMessagesAPI([]) as api:
        with pytest.raises(ModelError, match="no scripted response left"):
            await collect(model_for(api))
        assert api.unanswered == 1


async def test_cancelling_during_backoff_stops_at_once() -> None:
    with FakeMessagesAPI([HttpError(529, headers={"retry-after": "600"})]) as api:
        model = AnthropicModel(TEST_MODEL, api_key="k", base_url=api.base_url)  # real trio.sleep
        seen: list[ModelEvent] = []
        with trio.fail_after(60):  # the backoff alone would take 600 s
            with trio.CancelScope() as scope:
                async with aclosing(model.stream(REQUEST)) as stream:
                    async for event in stream:
                        seen.append(event)
                        scope.cancel()  # the stream is in its backoff when it resumes
        await model.aclose()
    assert scope.cancelled_caught
    assert [type(e) for e in seen] == [Retry]


async def test_the_request_body_carries_cache_breakpoints() -> None:
    conversation = [
        Message.user_text("first"),
        Message(
            role="assistant",
            content=[ThinkingBlock(thinking="hm", signature="sig"), TextBlock(text="ok")],
        ),
        Message.user_text("second"),
        Message(role="assistant", content=[]),
        Message.user_text("third"),
    ]
    request = ModelRequest(
        system=["stable part", "volatile part"],
        messages=conversation,
        tools=[ToolSpec("Read", "Reads a file.", {"type": "object", "properties": {}})],
        max_tokens=4096,
    )
    with FakeMessagesAPI([Reply.text("ok")]) as api:
        await collect(model_for(api), request)
        [sent] = api.requests
    body = sent.body
    assert sent.path == "/v1/messages" and body["stream"] is True
    assert body["model"] == TEST_MODEL and body["max_tokens"] == 4096
    assert sent_key(sent.headers) == "sk-ant-test"
    assert body["system"] == [
        {"type": "text", "text": "stable part"},
        {"type": "text", "text": "volatile part", "cache_control": {"type": "ephemeral"}},
    ]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    marked = [
        (m, b)
        for m, message in enumerate(body["messages"])
        for b, block in enumerate(message["content"])
        if "cache_control" in block
    ]
    assert marked == [(3, 0), (4, 0)]
    assert body["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "hm",
        "signature": "sig",
    }
    assert body["messages"][3]["content"] == [
        {"type": "text", "text": "(no content)", "cache_control": {"type": "ephemeral"}}
    ]
    assert "cache_control" not in conversation[4].to_api()["content"][0]


async def test_usage_cost_and_request_id() -> None:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 500,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 3000,
    }
    with FakeMessagesAPI([HttpError(529), Reply.text("ok", usage=usage)]) as api:
        message = final(await collect(model_for(api))).message
    expected = Usage(**usage)
    assert message.usage == expected
    assert message.cost_usd == pytest.approx(cost_usd(TEST_MODEL, expected))
    assert message.cost_usd == pytest.approx((1000 * 3 + 500 * 15 + 200 * 3.75 + 3000 * 0.3) / 1e6)
    assert message.request_id == "req_fake_0001"
    assert message.model == TEST_MODEL


async def test_thinking_blocks_come_back_verbatim() -> None:
    reply = Reply(
        content=[
            {"type": "thinking", "thinking": "Let me think about it.", "signature": "c2lnbmF0dXJl"},
            {"type": "text", "text": "Answer."},
        ]
    )
    with FakeMessagesAPI([reply]) as api:
        message = final(await collect(model_for(api))).message.message
    assert message.content == [
        ThinkingBlock(thinking="Let me think about it.", signature="c2lnbmF0dXJl"),
        TextBlock(text="Answer."),
    ]


async def test_cancelling_the_consumer_stops_the_stream_promptly() -> None:
    with FakeMessagesAPI(
        [Reply.text("x" * 200, hold_before_stop=True), Reply.text("again")]
    ) as api:
        model = model_for(api)
        with trio.fail_after(5):
            with trio.CancelScope() as scope:
                async with aclosing(model.stream(REQUEST)) as stream:
                    async for event in stream:
                        if isinstance(event, TextDelta):
                            scope.cancel()
        assert scope.cancelled_caught
        # We left while the server still held the end of the message back...
        assert "message_delta" not in [e.name for e in api.requests[0].events]
        api.release()
        assert await trio.to_thread.run_sync(api.wait_idle)
        # ...and hung up: the server's next writes failed.
        assert api.requests[0].client_disconnected
        # The model is still usable after a cancelled stream.
        events = await collect(model)
    assert final(events).message.message.text() == "again"
    gc.collect()  # an abandoned async generator would warn (an error under pytest) here


async def test_a_consumer_that_stops_early_leaves_nothing_behind() -> None:
    with FakeMessagesAPI([Reply.text("y" * 100, hold_before_stop=True), Reply.text("next")]) as api:
        model = model_for(api)
        async with aclosing(model.stream(REQUEST)) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    break
        api.release()
        events = await collect(model)
        assert len(api.requests) == 2
    assert final(events).message.message.text() == "next"
    gc.collect()


async def test_requests_from_one_model_run_concurrently() -> None:
    replies = [Reply.text("a", hold_before_stop=True), Reply.text("b", hold_before_stop=True)]
    with FakeMessagesAPI(replies) as api:
        model = model_for(api)
        texts: list[str] = []
        held: list[int] = []

        async def one() -> None:
            async with aclosing(model.stream(REQUEST)) as stream:
                async for event in stream:
                    if isinstance(event, BlockComplete):
                        # Both responses are held open by the server: let them finish together.
                        held.append(event.index)
                        if len(held) == 2:
                            api.release(2)
                    if isinstance(event, MessageComplete):
                        texts.append(event.message.message.text())

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one)
                nursery.start_soon(one)
        finally:
            await model.aclose()
        assert api.max_in_flight() == 2
    assert sorted(texts) == ["a", "b"]


async def test_a_missing_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with FakeMessagesAPI([Reply.text("never")]) as api:
        model = AnthropicModel(TEST_MODEL, base_url=api.base_url)
        with pytest.raises(ModelError, match="ANTHROPIC_API_KEY"):
            await collect(model)
        assert api.requests == []


async def test_key_and_base_url_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeMessagesAPI([Reply.text("env")]) as api:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
        events = await collect(AnthropicModel(TEST_MODEL))
        assert sent_key(api.requests[0].headers) == "sk-ant-from-env"
    assert final(events).message.message.text() == "env"


async def test_a_closed_model_refuses_new_requests() -> None:
    with FakeMessagesAPI() as api:
        model = model_for(api)
        await model.aclose()
        await model.aclose()  # idempotent
        with pytest.raises(ModelError, match="closed"):
            await collect(model)
