"""`--fallback-model` (issue 16): the real Anthropic client against the fake Messages API,
overloaded until its retries are spent, then the fallback answers, for the rest of the
session; any other failure stays the primary's."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from orchestrator.errors import ModelError
from orchestrator.messages import Message
from orchestrator.model.base import MessageComplete, ModelEvent, ModelRequest, Retry
from orchestrator.model.fallback import FallbackModel
from orchestrator.model.retry import RetryPolicy
from tests.kit.fake_api import FakeMessagesAPI, HttpError, RecordingSleep, Reply, model_for

REQUEST = ModelRequest(system=["You are a test."], messages=[Message.user_text("hi")])
TWO_ATTEMPTS = RetryPolicy(max_attempts=2, jitter=0.0)


async def _events(model: FallbackModel) -> list[ModelEvent]:
    async with aclosing(model.stream(REQUEST)) as stream:
        return [event async for event in stream]


async def test_an_overloaded_model_hands_over_to_the_fallback() -> None:
    replies = [HttpError(529), HttpError(529), Reply.text("from the fallback"), Reply.text("2")]
    with FakeMessagesAPI(replies) as api:
        sleep = RecordingSleep()
        primary = model_for(api, model="claude-opus-4-6", retry=TWO_ATTEMPTS, sleep=sleep)
        model = FallbackModel(primary, model_for(api, model="claude-sonnet-4-6", sleep=sleep))
        try:
            first = await _events(model)
            second = await _events(model)
        finally:
            await model.aclose()
        sent = [request.body["model"] for request in api.requests]
    assert sent == ["claude-opus-4-6", "claude-opus-4-6", "claude-sonnet-4-6", "claude-sonnet-4-6"]
    switch = [e for e in first if isinstance(e, Retry)][-1]
    assert switch.status == 529 and "fallback model claude-sonnet-4-6" in switch.error
    assert isinstance(first[-1], MessageComplete)
    assert first[-1].message.message.text() == "from the fallback"
    assert isinstance(second[-1], MessageComplete) and model.model == "claude-sonnet-4-6"


async def test_other_failures_stay_the_primarys() -> None:
    with FakeMessagesAPI([HttpError(400, message="bad request"), Reply.text("unused")]) as api:
        primary = model_for(api, retry=TWO_ATTEMPTS, sleep=RecordingSleep())
        model = FallbackModel(primary, model_for(api, model="claude-haiku-4-5"))
        try:
            with pytest.raises(ModelError):
                await _events(model)
        finally:
            await model.aclose()
        assert len(api.requests) == 1
