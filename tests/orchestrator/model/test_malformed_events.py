"""A stream event that is valid JSON but breaks the protocol is a retryable stream failure.

The real SDK over a real socket against the fake Messages API, which sends the scripted events
as given (`ScriptedEvents`). Each malformed stream is followed by a good reply: the client
retries, discards the broken attempt and returns the good message. Always malformed, the run
gives up after `max_attempts` with one line, as `model_error`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import pytest

from orchestrator.errors import ModelError
from orchestrator.messages import Message, TextBlock
from orchestrator.model.base import MessageComplete, ModelEvent, ModelRequest, Retry, TextDelta
from orchestrator.model.convert import StreamAccumulator, StreamProtocolError
from orchestrator.model.retry import RetryPolicy
from tests.kit.fake_api import FakeMessagesAPI, RecordingSleep, Reply, ScriptedEvents, model_for

REQUEST = ModelRequest(system=["You are a test."], messages=[Message.user_text("hi")])

Events = list[tuple[str, Any]]


def good_events() -> Events:
    """A whole, well-formed stream of one text block "broken" and one tool call."""
    return [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [],
                    "usage": {"input_tokens": 10, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "broken"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"file_path": "/a"}'},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 5},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _set(position: int, *path: str | int, value: Any) -> Callable[[Events], Events]:
    def change(events: Events) -> Events:
        events = copy.deepcopy(events)
        target: Any = events[position][1]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return events

    return change


def _drop(position: int, *keys: str) -> Callable[[Events], Events]:
    def change(events: Events) -> Events:
        events = copy.deepcopy(events)
        target: Any = events[position][1]
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
        return events

    return change


def _insert(position: int, event: tuple[str, Any]) -> Callable[[Events], Events]:
    def change(events: Events) -> Events:
        return [*events[:position], event, *events[position:]]

    return change


def _remove(position: int) -> Callable[[Events], Events]:
    def change(events: Events) -> Events:
        return [*events[:position], *events[position + 1 :]]

    return change


STOP_0 = ("content_block_stop", {"type": "content_block_stop", "index": 0})
DELTA_7 = (
    "content_block_delta",
    {"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "x"}},
)

MALFORMED: dict[str, Callable[[Events], Events]] = {
    "delta for a block never started": _insert(2, DELTA_7),
    "delta after its block stopped": _insert(4, copy.deepcopy(good_events()[2])),
    "content_block_stop twice": _insert(4, STOP_0),
    "stop for a block never started": _set(3, "index", value=9),
    "block started twice": _insert(2, copy.deepcopy(good_events()[1])),
    "message_delta without usage": _drop(7, "usage"),
    "message_delta usage without output_tokens": _set(7, "usage", value={}),
    "index is a string": _set(2, "index", value="0"),
    "index is a bool": _set(2, "index", value=True),
    "index is negative": _set(1, "index", value=-1),
    "text is a number": _set(2, "delta", "text", value=42),
    "partial_json is a list": _set(5, "delta", "partial_json", value=["{}"]),
    "delta is a string": _set(2, "delta", value="text"),
    "content_block is null": _set(1, "content_block", value=None),
    "tool_use without an id": _drop(4, "content_block", "id"),
    "tool_use input is a list": _set(4, "content_block", "input", value=[]),
    "stop_reason is a number": _set(7, "delta", "stop_reason", value=1),
    "usage count is a string": _set(7, "usage", "output_tokens", value="5"),
    "message_start usage is a list": _set(0, "message", "usage", value=[]),
    "model is a number": _set(0, "message", "model", value=3),
    "event is a JSON array": _insert(1, ("content_block_start", [1, 2])),
    "event without a type": _insert(1, ("content_block_start", {"index": 0})),
    "text delta into a tool_use block": _set(5, "delta", value={"type": "text_delta", "text": "x"}),
    "message_stop with a block open": _remove(6),
}


async def collect(api: FakeMessagesAPI, **options: Any) -> list[ModelEvent]:
    model = model_for(api, **options)
    events: list[ModelEvent] = []
    try:
        async with aclosing(model.stream(REQUEST)) as stream:
            async for event in stream:
                events.append(event)
    finally:
        await model.aclose()
    return events


def test_the_well_formed_stream_is_accepted() -> None:
    """The baseline each malformed case departs from is itself fine."""
    acc = StreamAccumulator(model="m")
    for _name, data in good_events():
        acc.feed(data)
    assert acc.stopped


@pytest.mark.parametrize("case", list(MALFORMED))
def test_the_accumulator_names_the_broken_rule(case: str) -> None:
    acc = StreamAccumulator(model="m")
    with pytest.raises(StreamProtocolError):
        for _name, data in MALFORMED[case](good_events()):
            acc.feed(data)


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_event_is_retried(case: str) -> None:
    with FakeMessagesAPI(
        [ScriptedEvents(MALFORMED[case](good_events())), Reply.text("whole")]
    ) as api:
        events = await collect(api)
        assert [r.response for r in api.requests] == ["ScriptedEvents", "Reply"]
    [retry] = [e for e in events if isinstance(e, Retry)]
    assert retry.attempt == 2 and "malformed" in retry.error and "\n" not in retry.error
    kept = events[events.index(retry) + 1 :]
    assert "".join(e.text for e in kept if isinstance(e, TextDelta)) == "whole"
    complete = events[-1]
    assert isinstance(complete, MessageComplete)
    assert complete.message.message.content == [TextBlock(text="whole")]


async def test_always_malformed_gives_up_as_model_error_with_one_line() -> None:
    broken = ScriptedEvents(MALFORMED["content_block_stop twice"](good_events()))
    sleep = RecordingSleep()
    with FakeMessagesAPI([broken] * 3) as api:
        with pytest.raises(ModelError) as caught:
            await collect(api, sleep=sleep, retry=RetryPolicy(max_attempts=3, jitter=0.0))
        assert len(api.requests) == 3
    message = str(caught.value)
    assert caught.value.reason == "model_error"
    assert "after 3 attempts" in message and "malformed content_block_stop event" in message
    assert "\n" not in message
    assert len(sleep.delays) == 2


async def test_unknown_event_and_delta_types_are_ignored_not_retried() -> None:
    """Forward compatibility: the API may add event types; only known ones are checked."""
    events = good_events()
    events.insert(1, ("future_event", {"type": "future_event", "anything": [1]}))
    events.insert(
        3,
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta"}},
        ),
    )
    with FakeMessagesAPI([ScriptedEvents(events)]) as api:
        got = await collect(api)
        assert len(api.requests) == 1
    assert not any(isinstance(e, Retry) for e in got)
    complete = got[-1]
    assert isinstance(complete, MessageComplete)
    assert complete.message.message.content[0] == TextBlock(text="broken")
