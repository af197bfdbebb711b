"""`FirstResponseStarts` (orchestrator/session/later.py): the parts start at the first event of the
first response, once, however many events and requests the run streams through it."""

from __future__ import annotations

from orchestrator.aio import closing_iter
from orchestrator.messages import Message, TextBlock
from orchestrator.model.base import ModelRequest
from orchestrator.session.later import FirstResponseStarts
from tests.kit.fake_api import FakeMessagesAPI, Reply, model_for


async def test_the_parts_start_once_at_the_first_event() -> None:
    started: list[int] = []
    seen: list[int] = []
    request = ModelRequest(
        system=["s"], messages=[Message(role="user", content=[TextBlock(text="q")])]
    )
    with FakeMessagesAPI([Reply.text("one two three " * 20), Reply.text("four " * 20)]) as api:
        model = model_for(api)
        wrapped = FirstResponseStarts(model, [lambda: started.append(len(seen))])
        for _ in range(2):  # two requests of one run, each of many events
            async with closing_iter(wrapped.stream(request)) as events:
                async for _event in events:
                    seen.append(1)
        await model.aclose()
    assert len(seen) > 4
    assert started == [0]  # once, before the first event was handed on
