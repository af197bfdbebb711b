"""The model broker's global limits: concurrent requests, the session budget, the shared
backoff after a 429/529, and a client per model. Timing runs on trio's autojump clock, except
the last test, which drives the real SDK against the fake API over a socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from orchestrator.aio import closing_iter
from orchestrator.errors import ModelError
from orchestrator.messages import AssistantMessage, ContentBlock, Message, TextBlock, Usage
from orchestrator.model.base import MessageComplete, ModelEvent, ModelRequest, Retry
from tests.kit.fake_api import FakeMessagesAPI, HttpError, Reply
from workers.broker import BrokerLimits, ModelBroker, estimate_input_tokens

REQUEST = ModelRequest(system=[], messages=[Message.user_text("hi")])
USAGE = Usage(input_tokens=40, output_tokens=20)


class SlowModel:
    """Answers after `seconds`, optionally after a retry with `retry_status`."""

    def __init__(
        self,
        name: str = "slow",
        *,
        seconds: float = 1.0,
        usage: Usage = USAGE,
        cost: float = 0.25,
        retry_status: int | None = None,
    ) -> None:
        self._name = name
        self.seconds = seconds
        self.usage = usage
        self.cost = cost
        self.retry_status = retry_status
        self.started: list[float] = []
        self.closed = False

    @property
    def model(self) -> str:
        return self._name

    async def aclose(self) -> None:
        self.closed = True

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.started.append(trio.current_time())
        if self.retry_status is not None:
            yield Retry(attempt=2, delay_s=5.0, error="busy", status=self.retry_status)
            await trio.sleep(5.0)
        await trio.sleep(self.seconds)
        yield MessageComplete(
            AssistantMessage(
                message=Message(role="assistant", content=[TextBlock(text="ok")]),
                model=self._name,
                usage=self.usage,
                cost_usd=self.cost,
            )
        )


async def consume(
    broker: ModelBroker, model: str | None = None, subagent: bool = False
) -> list[ModelEvent]:
    async with closing_iter(broker.stream(REQUEST, model=model, subagent=subagent)) as events:
        return [event async for event in events]


async def test_concurrent_requests_are_capped(autojump_clock: trio.testing.MockClock) -> None:
    model = SlowModel(seconds=1.0)
    broker = ModelBroker(model, limits=BrokerLimits(max_concurrent_requests=2))
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(consume, broker, None, True)
    assert model.started == [0.0, 0.0, 1.0, 1.0, 2.0]


async def test_the_main_agent_has_a_slot_of_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Subagents holding every shared slot (background ones stream while the main agent
    works) do not hold up the main agent's request: it streams at once, in its own slot, and
    a second one waits only for the first (tests/bench/bench_background.py: ten background
    subagents had made each of its turns wait for one of their responses to end)."""
    model = SlowModel(seconds=1.0)
    broker = ModelBroker(model, limits=BrokerLimits(max_concurrent_requests=2))
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(consume, broker, None, True)
        await trio.sleep(0.5)
        nursery.start_soon(consume, broker)
        nursery.start_soon(consume, broker)
    assert model.started == [0.0, 0.0, 0.5, 1.0, 1.5]


SMALL = ModelRequest(system=[], messages=[Message.user_text("hi")], max_tokens=10)


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        (BrokerLimits(max_tokens=100), "budget of 100 tokens would be passed"),
        (BrokerLimits(max_output_tokens=30), "budget of 30 output tokens would be passed"),
        (BrokerLimits(max_cost_usd=0.5), "budget of $0.50 would be passed"),
    ],
)
async def test_a_request_that_would_pass_the_budget_is_not_sent(
    limits: BrokerLimits, says: str
) -> None:
    """Each request of 40 + 20 tokens, $0.25, estimated a few tokens in + 10 out: two fit each
    budget, the third would pass it and never reaches the model."""
    model = SlowModel("claude-sonnet-4-6", seconds=0)
    broker = ModelBroker(model, limits=limits)
    for _ in range(2):
        async with closing_iter(broker.stream(SMALL)) as events:
            [event async for event in events]
    with pytest.raises(ModelError) as failed:
        async with closing_iter(broker.stream(SMALL)) as events:
            [event async for event in events]
    assert failed.value.reason == "budget_exceeded"
    assert says in failed.value.message and "not sent" in failed.value.message
    assert len(model.started) == 2
    assert broker.usage.input_tokens == 80 and broker.cost_usd == 0.5


async def test_the_estimate_counts_input_at_the_input_price_and_max_tokens_of_output() -> None:
    """Sonnet: $3 per million input tokens, $15 per million output tokens. A request of
    400,000 characters (about 100,000 tokens, $0.30) with max_tokens 16,384 ($0.25) is refused
    under a $0.50 budget before it is sent; the same request with max_tokens 1,000 fits."""
    text = "x" * 400_000
    big = ModelRequest(system=[], messages=[Message.user_text(text)], max_tokens=16_384)
    assert 100_000 <= estimate_input_tokens(big) <= 100_100
    model = SlowModel("claude-sonnet-4-6", seconds=0, cost=0.31)
    broker = ModelBroker(model, limits=BrokerLimits(max_cost_usd=0.5))
    with pytest.raises(ModelError, match="not sent"):
        async with closing_iter(broker.stream(big)) as events:
            [event async for event in events]
    assert model.started == []
    fits = ModelRequest(system=[], messages=[Message.user_text(text)], max_tokens=1_000)
    async with closing_iter(broker.stream(fits)) as events:
        [event async for event in events]
    assert len(model.started) == 1 and broker.cost_usd == 0.31


async def test_concurrent_requests_reserve_their_estimates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two subagents' requests of about $0.30 each under a $0.50 budget, started together: the first
    reserves its estimate, so the second is refused while the first streams; once the first
    finished (and cost less than reserved), a third that fits is sent."""
    request = ModelRequest(system=[], messages=[Message.user_text("hi")], max_tokens=20_000)
    model = SlowModel("claude-sonnet-4-6", seconds=1.0, cost=0.01)
    broker = ModelBroker(model, limits=BrokerLimits(max_cost_usd=0.5))
    outcomes: list[str] = []

    async def one() -> None:
        try:
            async with closing_iter(broker.stream(request, subagent=True)) as events:
                [event async for event in events]
            outcomes.append("sent")
        except ModelError as exc:
            outcomes.append(exc.reason)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)
    assert sorted(outcomes) == ["budget_exceeded", "sent"]
    assert len(model.started) == 1
    await one()
    assert outcomes[-1] == "sent" and len(model.started) == 2


@pytest.mark.parametrize(("status", "paused"), [(429, True), (529, True), (500, False)])
async def test_a_rate_limit_retry_pauses_requests_that_start_meanwhile(
    autojump_clock: trio.testing.MockClock, status: int, paused: bool
) -> None:
    limited = SlowModel("limited", seconds=1.0, retry_status=status)
    other = SlowModel("other", seconds=1.0)
    broker = ModelBroker(limited, client_for=lambda name: other)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume, broker)
        await trio.sleep(1.0)  # the first request is in its 5 s backoff now
        nursery.start_soon(consume, broker, "other", True)
    assert other.started == [5.0 if paused else 1.0]


async def test_each_model_gets_one_client_closed_with_the_broker() -> None:
    made: list[SlowModel] = []

    def client_for(name: str) -> SlowModel:
        made.append(SlowModel(name, seconds=0))
        return made[-1]

    main = SlowModel("main", seconds=0)
    broker = ModelBroker(main, client_for=client_for)
    events = await consume(broker, "haiku")
    await consume(broker, "haiku")
    await consume(broker)
    assert [m.model for m in made] == ["haiku"] and len(made[0].started) == 2
    assert len(main.started) == 1
    assert isinstance(events[-1], MessageComplete)
    assert broker.model == "main"
    await broker.aclose()
    assert main.closed and made[0].closed


async def test_a_429_from_the_real_api_holds_back_the_next_request() -> None:
    """The SDK over a socket: request A is told to retry after 0.3 s; request B, started while
    A waits, reaches the server only when A's retry is due."""
    from orchestrator.model.anthropic import AnthropicModel

    with FakeMessagesAPI(
        [HttpError(429, headers={"retry-after": "0.3"}), Reply.text("a"), Reply.text("b")]
    ) as api:
        model = AnthropicModel(
            "claude-sonnet-4-6", api_key="sk-ant-test", base_url=api.base_url, sleep=trio.sleep
        )
        broker = ModelBroker(model)
        retried = trio.Event()

        async def first() -> None:
            async with closing_iter(broker.stream(REQUEST)) as events:
                async for event in events:
                    if isinstance(event, Retry):
                        retried.set()

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await retried.wait()
                nursery.start_soon(consume, broker)
        await broker.aclose()
        limited, *later = api.requests
    assert limited.response == "HttpError(429)" and limited.ended_at is not None
    assert len(later) == 2
    assert all(r.started_at >= limited.ended_at + 0.3 for r in later)


@pytest.mark.parametrize(
    ("model", "asked", "sent"),
    [
        ("claude-3-haiku-20240307", 16_384, 4_096),
        ("claude-opus-4-1-20250805", 1_000_000_000, 32_000),
        ("claude-sonnet-4-5", 16_384, 16_384),
        ("a-model-nobody-knows", 10**9, 32_000),
    ],
)
async def test_max_tokens_is_clamped_to_the_models_output_limit(
    model: str, asked: int, sent: int
) -> None:
    """Whoever asks (the main agent, or a subagent's worker through the pool), no request
    reaches the API asking for more output than the model can give."""
    from tests.workers.agent_kit import FunctionModel

    async def answer(request: ModelRequest) -> list[ContentBlock]:
        return [TextBlock(text="ok")]

    inner = FunctionModel(answer, name=model)
    broker = ModelBroker(inner)
    request = ModelRequest(system=[], messages=[Message.user_text("hi")], max_tokens=asked)
    async with closing_iter(broker.stream(request)) as events:
        async for _ in events:
            pass
    assert [r.max_tokens for r in inner.requests] == [sent]


def test_the_incremental_estimate_equals_the_whole_one_when_grown_or_rewritten() -> None:
    from workers.broker import _MessageSizes

    sizes = _MessageSizes()
    conversation = [Message.user_text("x" * 100)]
    for i in range(6):
        conversation.append(Message.user_text(f"turn {i} " * (i + 1)))
        request = ModelRequest(system=["s"], messages=list(conversation))
        assert estimate_input_tokens(request, sizes) == estimate_input_tokens(request)
    rewritten = [Message.user_text("summary"), *conversation[3:]]  # a compaction
    request = ModelRequest(system=["s"], messages=rewritten)
    assert estimate_input_tokens(request, sizes) == estimate_input_tokens(request)
