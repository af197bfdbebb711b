"""The fake Messages API itself: its wire format, its log, and its use from another process."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import textwrap
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from pydantic import BaseModel

from tests.kit.fake_api import (
    FakeMessagesAPI,
    HttpError,
    MalformedToolJson,
    MidStreamError,
    Reply,
)


def post(api: FakeMessagesAPI, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    url = urlsplit(api.base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    text = raw.decode()
    assert text.endswith("\n\n"), "an SSE body ends with a blank line"
    events = []
    for frame in text.strip("\n").split("\n\n"):
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        events.append(
            (name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: ")))
        )
    return events


STREAM = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": []}


def test_a_reply_streams_like_the_real_api() -> None:
    reply = Reply(
        content=[
            {"type": "text", "text": "Hello, world"},
            {"type": "tool_use", "name": "Grep", "input": {"pattern": "def main", "path": "/repo"}},
        ],
        usage={"input_tokens": 7, "output_tokens": 9},
    )
    with FakeMessagesAPI([reply]) as api:
        status, headers, raw = post(api, STREAM)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"] == "req_fake_0000"
    events = sse_events(raw)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_stop") == 2
    for name, data in events:
        assert data["type"] == name
    start = events[0][1]["message"]
    assert start["model"] == "claude-test" and start["usage"]["input_tokens"] == 7
    tool_start = next(d for n, d in events if n == "content_block_start" and d["index"] == 1)
    assert tool_start["content_block"]["id"].startswith("toolu_")
    pieces = [
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert len(pieces) > 3, "tool input arrives in several small chunks"
    assert json.loads("".join(pieces)) == {"pattern": "def main", "path": "/repo"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"output_tokens": 9}


def test_the_log_records_bodies_headers_and_times() -> None:
    with FakeMessagesAPI([Reply.text("a"), HttpError(429)]) as api:
        post(api, {**STREAM, "system": [{"type": "text", "text": "sys"}]})
        status, headers, raw = post(api, STREAM)
        [first, second] = api.requests
    assert status == 429 and headers["retry-after"] == "0"
    assert json.loads(raw)["error"]["type"] == "rate_limit_error"
    assert first.system == [{"type": "text", "text": "sys"}]
    assert first.headers["content-type"] == "application/json"
    assert first.ended_at is not None and first.started_at <= first.ended_at
    assert first.event_time("message_start") <= first.event_time("message_stop")
    assert (first.response, second.response) == ("Reply", "HttpError(429)")
    assert api.max_in_flight() == 1
    with pytest.raises(LookupError):
        second.event_time("message_start")


def test_running_out_of_script_answers_500_and_says_so() -> None:
    with FakeMessagesAPI([Reply.text("only")]) as api:
        post(api, STREAM)
        status, headers, raw = post(api, STREAM)
        assert api.unanswered == 1 and api.remaining == 0
        assert api.requests[1].response == "unanswered"
    assert status == 500 and headers["x-should-retry"] == "false"
    assert "no scripted response left" in json.loads(raw)["error"]["message"]


def test_error_events_and_malformed_json() -> None:
    with FakeMessagesAPI(
        [MidStreamError(after_events=2), MalformedToolJson(raw_json="{oops")]
    ) as api:
        _, _, first = post(api, STREAM)
        _, _, second = post(api, STREAM)
    names = [name for name, _ in sse_events(first)]
    assert names == ["message_start", "content_block_start", "error"]
    assert sse_events(first)[-1][1]["error"]["type"] == "overloaded_error"
    pieces = "".join(
        d["delta"]["partial_json"] for n, d in sse_events(second) if n == "content_block_delta"
    )
    assert pieces == "{oops"


def test_a_non_streaming_request_gets_the_whole_message() -> None:
    with FakeMessagesAPI([Reply.tool_use("LS", {"path": "/repo"})]) as api:
        status, _, raw = post(api, {**STREAM, "stream": False})
    message = json.loads(raw)
    assert status == 200 and message["stop_reason"] == "tool_use"
    assert message["content"][0]["input"] == {"path": "/repo"}


def test_replies_from_scripted_turns() -> None:
    turn = {
        "latency_ms": 20,
        "block_latency_ms": 5,
        "content": [
            {"type": "text", "text": "Looking in {{workspace}}."},
            {
                "type": "tool_use",
                "name": "Read",
                "input": {"file_path": "{{workspace}}/a"},
                "id": "toolu_x",
            },
        ],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    reply = Reply.from_turn(turn, workspace="/w")
    assert reply.latency_s == pytest.approx(0.02) and reply.block_delay_s == pytest.approx(0.005)
    assert reply.content[0]["text"] == "Looking in /w."
    assert reply.content[1] == {
        "type": "tool_use",
        "name": "Read",
        "input": {"file_path": "/w/a"},
        "id": "toolu_x",
    }
    assert reply.usage == {"input_tokens": 3, "output_tokens": 4}
    assert reply.stop_reason is None


class _Turn(BaseModel):
    """Shaped like orchestrator.model.scripted.ScriptedTurn: from_turn takes any `model_dump`."""

    content: list[dict[str, Any]]
    latency_ms: float = 0.0
    stop_reason: str | None = None
    usage: dict[str, int] | None = None


def test_replies_from_turn_objects() -> None:
    turn = _Turn(content=[{"type": "text", "text": "hi"}], latency_ms=1500, stop_reason="end_turn")
    reply = Reply.from_turn(turn)
    assert reply.content == [{"type": "text", "text": "hi"}]
    assert reply.stop_reason == "end_turn" and reply.latency_s == 1.5 and reply.usage is None


def test_a_subprocess_can_use_the_server() -> None:
    script = textwrap.dedent(
        """
        import json, os, urllib.request
        request = urllib.request.Request(
            os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
            data=json.dumps({"model": "m", "stream": True, "messages": []}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            print(response.read().decode().count("event: message_stop"))
        """
    )
    with FakeMessagesAPI([Reply.text("from afar")]) as api:
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={"ANTHROPIC_BASE_URL": api.base_url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert len(api.requests) == 1
    assert done.stdout.strip() == "1"


def test_base_url_needs_a_running_server() -> None:
    api = FakeMessagesAPI()
    with pytest.raises(RuntimeError, match="with"):
        _ = api.base_url


def test_a_route_answers_by_content_and_falls_back_to_the_script() -> None:
    def route(request: Any) -> Reply | None:
        prompt = request.messages[0]["content"]
        return Reply.text(f"routed {prompt}") if prompt.startswith("agent") else None

    with FakeMessagesAPI([Reply.text("scripted")], route=route) as api:
        answers = []
        for prompt in ("agent B", "main", "agent A"):
            body = {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": prompt}],
            }
            status, _, raw = post(api, body)
            assert status == 200
            answers.append(json.loads(raw)["content"][0]["text"])
        assert answers == ["routed agent B", "scripted", "routed agent A"]
        assert api.remaining == 0 and [r.response for r in api.requests] == ["Reply"] * 3


def test_each_request_names_its_connection() -> None:
    with FakeMessagesAPI([Reply.text("a"), Reply.text("b"), Reply.text("c")]) as api:
        url = urlsplit(api.base_url)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
        try:
            for _ in range(2):  # one keep-alive connection, two requests
                conn.request("POST", "/v1/messages", json.dumps(STREAM))
                conn.getresponse().read()
        finally:
            conn.close()
        post(api, STREAM)  # a connection of its own
        assert [r.connection for r in api.requests] == [0, 0, 1]


def test_answered_bodies_can_be_dropped() -> None:
    seen: list[int] = []

    def route(request: Any) -> Reply:
        seen.append(len(request.messages))
        return Reply.text("ok")

    body = {**STREAM, "messages": [{"role": "user", "content": "hi"}]}
    with FakeMessagesAPI(route=route, keep_bodies=False) as api:
        post(api, body)
        # The client has the whole answer a moment before the server thread is done with it.
        deadline = time.monotonic() + 10
        while api.requests[0].body and time.monotonic() < deadline:
            time.sleep(0.01)
        [request] = api.requests
    assert seen == [1], "the route still sees the body"
    assert request.body == {} and request.response == "Reply"
