"""Request shaping (cache breakpoints, normalisation) and stream decoding, with plain values."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from orchestrator.messages import (
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.model.base import BlockComplete, ModelRequest, TextDelta, ToolSpec
from orchestrator.model.convert import (
    EMPTY_CONTENT_TEXT,
    MAX_TOOL_INPUT_BYTES,
    MAX_TOOL_INPUT_DEPTH,
    MessageJsonCache,
    ServerSentEvent,
    SSEDecoder,
    StreamAccumulator,
    encode_request,
    request_params,
)

EPHEMERAL = {"type": "ephemeral"}


def _conversation() -> list[Message]:
    return [
        Message.user_text("read the file"),
        Message(
            role="assistant",
            content=[
                TextBlock(text="Reading."),
                ToolUseBlock(id="toolu_1", name="Read", input={"file_path": "/a"}),
            ],
        ),
        Message(role="user", content=[ToolResultBlock(tool_use_id="toolu_1", content="data")]),
        Message(role="assistant", content=[TextBlock(text="Done.")]),
        Message.user_text("thanks"),
    ]


def _breakpoints(params: dict[str, Any]) -> list[str]:
    found = []
    for i, block in enumerate(params.get("system", [])):
        if "cache_control" in block:
            found.append(f"system[{i}]")
    for i, tool in enumerate(params.get("tools", [])):
        if "cache_control" in tool:
            found.append(f"tools[{i}]")
    for m, message in enumerate(params["messages"]):
        for b, block in enumerate(message["content"]):
            if "cache_control" in block:
                found.append(f"messages[{m}][{b}]")
    return found


def test_breakpoints_on_system_tools_and_the_last_two_messages() -> None:
    request = ModelRequest(
        system=["stable", "per-session"],
        messages=_conversation(),
        tools=[ToolSpec("Read", "reads", {"type": "object"}), ToolSpec("LS", "lists", {})],
        max_tokens=1234,
    )
    params = request_params("claude-sonnet-4-6", request)
    assert params["model"] == "claude-sonnet-4-6"
    assert params["max_tokens"] == 1234
    assert params["system"] == [
        {"type": "text", "text": "stable"},
        {"type": "text", "text": "per-session", "cache_control": EPHEMERAL},
    ]
    assert _breakpoints(params) == ["system[1]", "tools[1]", "messages[3][0]", "messages[4][0]"]
    assert len(_breakpoints(params)) <= 4  # the API's limit


def test_the_callers_messages_are_not_touched() -> None:
    conversation = _conversation()
    before = [json.dumps(m.to_api(), sort_keys=True) for m in conversation]
    request_params("m", ModelRequest(system=["s"], messages=conversation))
    request_params("m", ModelRequest(system=["s"], messages=conversation))
    assert [json.dumps(m.to_api(), sort_keys=True) for m in conversation] == before


def test_a_breakpoint_skips_a_trailing_thinking_block() -> None:
    messages = [
        Message(
            role="assistant",
            content=[TextBlock(text="hm"), ThinkingBlock(thinking="...", signature="sig")],
        )
    ]
    params = request_params("m", ModelRequest(system=[], messages=messages))
    content = params["messages"][0]["content"]
    assert content[0]["cache_control"] == EPHEMERAL
    assert content[1] == {"type": "thinking", "thinking": "...", "signature": "sig"}
    assert "system" not in params and "tools" not in params


def test_empty_content_is_never_sent() -> None:
    messages = [
        Message.user_text("hi"),
        Message(role="assistant", content=[]),
        Message(
            role="assistant", content=[TextBlock(text=""), ToolUseBlock(id="t", name="X", input={})]
        ),
        Message(role="user", content=[TextBlock(text="")]),
    ]
    params = request_params("m", ModelRequest(system=["", "sys"], messages=messages))
    sent = params["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": EMPTY_CONTENT_TEXT}]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_use"]
    assert sent[3]["content"][0]["text"] == EMPTY_CONTENT_TEXT
    assert params["system"] == [{"type": "text", "text": "sys", "cache_control": EPHEMERAL}]


def test_parse_errors_are_not_sent_back() -> None:
    broken = ToolUseBlock(id="t", name="Read", input={}, parse_error="bad json")
    params = request_params(
        "m", ModelRequest(system=[], messages=[Message(role="assistant", content=[broken])])
    )
    assert "parse_error" not in params["messages"][0]["content"][0]


def test_the_encoded_body_equals_the_params_as_the_conversation_grows() -> None:
    cache = MessageJsonCache()
    tools = [ToolSpec("Read", 'reads \u00e9 "quoted"', {"type": "object"})]
    conversation: list[Message] = []
    for turn in [*_conversation(), Message(role="assistant", content=[]), Message.user_text("é")]:
        conversation.append(turn)
        request = ModelRequest(system=["s1", "s2"], messages=list(conversation), tools=tools)
        encoded = json.loads(encode_request("claude-x", request, cache))
        assert encoded == {**request_params("claude-x", request), "stream": True}
    # every message but the last two was encoded once and reused
    assert len(cache._entries) == len(conversation) - 2


def test_a_rewritten_early_message_is_encoded_anew() -> None:
    """Compaction replaces early messages and keeps later ones (the same objects): the reused
    prefix must not carry the old text."""
    cache = MessageJsonCache()
    conversation = [Message.user_text(f"m{i}") if i % 2 == 0 else
                    Message(role="assistant", content=[TextBlock(text=f"a{i}")])
                    for i in range(9)]  # fmt: skip
    encode_request("claude-x", ModelRequest(system=[], messages=conversation), cache)
    rewritten = [Message.user_text("cleared"), *conversation[1:]]
    request = ModelRequest(system=[], messages=rewritten)
    encoded = json.loads(encode_request("claude-x", request, cache))
    assert encoded == {**request_params("claude-x", request), "stream": True}
    shorter = ModelRequest(system=[], messages=[Message.user_text("head"), *conversation[5:]])
    encoded = json.loads(encode_request("claude-x", shorter, cache))
    assert encoded == {**request_params("claude-x", shorter), "stream": True}


def test_the_json_cache_is_bounded() -> None:
    cache = MessageJsonCache(limit=3)
    messages = [Message.user_text(str(i)) for i in range(5)]
    for message in messages:
        assert json.loads(cache.json(message))["content"][0]["text"] == message.text()
    assert len(cache._entries) <= 3


# --- SSE decoding --------------------------------------------------------------------------------

BODY = (
    b'event: message_start\ndata: {"a": 1}\n\n'
    b": a comment\n"
    b"event: ping\r\ndata: {}\r\n\r\n"
    b"data: line one\ndata: line two\n\n"
    b"event: caf\xc3\xa9\ndata:no-space\n\n"
)
EXPECTED = [
    ServerSentEvent("message_start", '{"a": 1}'),
    ServerSentEvent("ping", "{}"),
    ServerSentEvent("message", "line one\nline two"),
    ServerSentEvent("café", "no-space"),
]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(BODY)])
def test_sse_decoder_is_indifferent_to_chunk_boundaries(size: int) -> None:
    decoder = SSEDecoder()
    events = []
    for start in range(0, len(BODY), size):
        events.extend(decoder.feed(BODY[start : start + size]))
    assert events == EXPECTED


def test_sse_decoder_emits_an_event_as_soon_as_it_is_complete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: a\ndata: 1\n") == []
    assert decoder.feed(b"\nevent: b\n") == [ServerSentEvent("a", "1")]


# --- accumulating stream events ------------------------------------------------------------------


def _feed(acc: StreamAccumulator, events: list[dict[str, Any]]) -> list[TextDelta | BlockComplete]:
    out: list[TextDelta | BlockComplete] = []
    for event in events:
        out.extend(acc.feed(event))
    return out


def _tool_events(index: int, raw_parts: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": "toolu_x", "name": "Read", "input": {}},
        },
        *[
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part},
            }
            for part in raw_parts
        ],
        {"type": "content_block_stop", "index": index},
    ]


def test_usage_from_message_delta_replaces_cumulative_counts() -> None:
    acc = StreamAccumulator(model="claude-sonnet-4-6")
    _feed(
        acc,
        [
            {
                "type": "message_start",
                "message": {
                    "model": "claude-sonnet-4-6",
                    "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 7},
                },
            },
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 42},
            },
            {"type": "message_stop"},
        ],
    )
    assert acc.stopped
    message = acc.finish(request_id="req_1")
    assert message.usage == Usage(input_tokens=10, output_tokens=42, cache_read_input_tokens=7)
    assert message.stop_reason == "end_turn"
    assert message.request_id == "req_1"
    assert message.cost_usd > 0


def test_tool_input_is_parsed_from_its_pieces() -> None:
    acc = StreamAccumulator(model="m")
    out = _feed(acc, _tool_events(0, ["", '{"file_', 'path": "/a', '"}']))
    assert out == [
        BlockComplete(0, ToolUseBlock(id="toolu_x", name="Read", input={"file_path": "/a"}))
    ]


def test_a_tool_without_input_deltas_gets_an_empty_input() -> None:
    out = _feed(StreamAccumulator(model="m"), _tool_events(0, []))
    [complete] = out
    assert isinstance(complete, BlockComplete)
    block = complete.block
    assert isinstance(block, ToolUseBlock) and block.input == {} and block.parse_error is None


@pytest.mark.parametrize(
    ("raw", "needle"),
    [('{"file_path": "/a", ', "not valid JSON"), ("[1, 2]", "not an object")],
)
def test_malformed_tool_input_becomes_a_parse_error(raw: str, needle: str) -> None:
    out = _feed(StreamAccumulator(model="m"), _tool_events(0, [raw]))
    [complete] = out
    assert isinstance(complete, BlockComplete)
    block = complete.block
    assert isinstance(block, ToolUseBlock)
    assert block.input == {}
    assert block.parse_error is not None and needle in block.parse_error
    assert raw in block.parse_error


def test_unknown_stop_reasons_and_block_types_are_dropped() -> None:
    acc = StreamAccumulator(model="m")
    out = _feed(
        acc,
        [
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {
                    "type": "server_tool_use",
                    "id": "s",
                    "name": "web_search",
                    "input": {},
                },
            },
            {"type": "content_block_stop", "index": 0},
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "text", "text": ""},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": "hi"},
            },
            {"type": "content_block_stop", "index": 1},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "some_new_reason"},
                "usage": {"output_tokens": 3},
            },
            {"type": "message_stop"},
        ],
    )
    assert out == [TextDelta(1, "hi"), BlockComplete(1, TextBlock(text="hi"))]
    message = acc.finish()
    assert message.stop_reason is None
    assert message.message.content == [TextBlock(text="hi")]


def _nested(depth: int) -> str:
    """`{"a": [{"a": [...]}]}` with `depth` levels of objects and arrays."""
    opens = "".join('{"a":' if i % 2 == 0 else "[" for i in range(depth))
    closes = "".join("}" if i % 2 == 0 else "]" for i in reversed(range(depth)))
    return opens + "1" + closes


def _block_for(raw: str) -> ToolUseBlock:
    started = time.thread_time()
    [complete] = _feed(StreamAccumulator(model="m"), _tool_events(0, [raw]))
    assert time.thread_time() - started < 0.1  # refused within 100 ms of CPU
    assert isinstance(complete, BlockComplete) and isinstance(complete.block, ToolUseBlock)
    return complete.block


@pytest.mark.parametrize("depth", [MAX_TOOL_INPUT_DEPTH + 1, 200, 5_000, 1_000_000])
def test_tool_input_nested_too_deep_is_a_parse_error(depth: int) -> None:
    block = _block_for(_nested(depth))
    assert block.input == {}
    assert block.parse_error is not None and "nested deeper than 64" in block.parse_error


def test_tool_input_at_the_depth_limit_is_accepted() -> None:
    block = _block_for(_nested(MAX_TOOL_INPUT_DEPTH))
    assert block.parse_error is None and block.input["a"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"content": "' + "x" * MAX_TOOL_INPUT_BYTES + '"}',
        '{"content": "' + "é" * (MAX_TOOL_INPUT_BYTES // 2) + '"}',  # bytes, not characters
        "[" * (MAX_TOOL_INPUT_BYTES + 1),
    ],
)
def test_tool_input_larger_than_10_mib_is_a_parse_error(raw: str) -> None:
    block = _block_for(raw)
    assert block.input == {}
    assert block.parse_error is not None and "larger than 10485760 bytes" in block.parse_error
    assert len(block.parse_error) < 500  # the input is not echoed back


def test_a_non_streamed_tool_input_is_checked_too() -> None:
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    events = _tool_events(0, [])
    events[0]["content_block"]["input"] = {"a": deep}
    [complete] = _feed(StreamAccumulator(model="m"), events)
    assert isinstance(complete, BlockComplete) and isinstance(complete.block, ToolUseBlock)
    assert complete.block.input == {} and complete.block.parse_error is not None
