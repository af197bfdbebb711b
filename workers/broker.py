"""The model broker: the coordinator's one model client, shared by the main agent and every
subagent, with the session's global limits.

Subagents run in sandboxes without the API key or network; their workers send model requests
over the wire protocol and the pool streams them through here. The main agent can use the
broker as its `ModelClient` too, so the limits hold for the whole session:

- at most `max_concurrent_requests` subagent requests stream at once (a `CapacityLimiter`),
  and the main agent's one request beside them in a slot of its own: ten background subagents
  streaming (`dispatch_agent` with `run_in_background`) held every shared slot, so each of the
  main agent's turns waited for one of their responses to end (seconds with a real model;
  +29 ms median, p90 121 ms, with tests/bench/bench_background.py's 0.3 s replies);
- a session budget of cost, of tokens and of output tokens, checked before each request is
  sent: the spend so far, plus what requests streaming now have reserved, plus this request's
  estimate must stay within it, or the request is not sent and fails with
  `ModelError(reason="budget_exceeded")`, which ends the run that made it with
  `budget_exceeded`. The estimate is the request's input at the model's input price (about
  four characters a token, `CHARS_PER_TOKEN`, counted over the JSON of the system prompt,
  messages and tool specs, which overestimates a little) plus `max_tokens` of output at the
  output price; it is reserved while the request streams and replaced by the real usage when
  it completes, so concurrent requests cannot together pass the budget;
- a shared backoff: when one request is told to retry after a 429 or 529, requests that start
  meanwhile wait until that retry is due, so ten agents do not hammer a rate-limited API
  together;
- `max_tokens` of every request is clamped to its model's output limit
  (`orchestrator.model.catalog`), whoever asked for more.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

import trio
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.aio import closing_iter
from orchestrator.errors import ModelError
from orchestrator.messages import Message, Usage
from orchestrator.model.base import MessageComplete, ModelClient, ModelEvent, ModelRequest, Retry
from orchestrator.model.catalog import clamp_max_tokens, price_for

__all__ = ["CHARS_PER_TOKEN", "BrokerLimits", "ModelBroker", "estimate_input_tokens"]

CHARS_PER_TOKEN = 4
"""Characters per input token when estimating a request before it is sent (Anthropic's rule
of thumb for English text and code; the JSON framing makes the estimate a little high)."""


def estimate_input_tokens(request: ModelRequest, sizes: _MessageSizes | None = None) -> int:
    """Input tokens `request` will be billed, estimated from its characters. `sizes` (one per
    conversation) makes a request that only appended to the last one cost what it appended."""
    chars = sum(len(block) for block in request.system)
    if sizes is not None:
        chars += sizes.total(request.messages)
    else:
        chars += sum(message.api_size for message in request.messages)  # cached per message
    chars += sum(spec.api_size for spec in request.tools)
    return math.ceil(chars / CHARS_PER_TOKEN)


_CONVERSATIONS_REMEMBERED = 16


class _MessageSizes:
    """The characters of the last conversation estimated, by identity of its messages: a
    conversation that grew since adds only the new ones (a 1,000-turn session re-sends its
    whole history every turn; tests/bench/bench_long_session.py)."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._chars = 0

    def total(self, messages: Sequence[Message]) -> int:
        known = len(self._messages)
        if known <= len(messages) and all(map(operator.is_, messages[:known], self._messages)):
            chars = self._chars + sum(m.api_size for m in messages[known:])
        else:
            chars = sum(m.api_size for m in messages)
        self._messages, self._chars = list(messages), chars
        return chars


@dataclass(frozen=True)
class _Estimate:
    """What one request may use at most, reserved while it streams."""

    tokens: int
    output_tokens: int
    cost_usd: float


class BrokerLimits(BaseModel):
    """The session's global limits on model use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent_requests: int = Field(default=10, ge=1)
    """Subagents' requests streaming at once, across all of them. The main agent's request
    does not wait for these: it has one slot of its own. Default 10."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Tokens the session may use (input, output and cache tokens together). Default None:
    no limit."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Dollars the session may spend. Default None: no limit."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Output tokens the session may generate. Default None: no limit."""
    backoff_statuses: frozenset[int] = frozenset({429, 529})
    """HTTP statuses whose retry delay pauses every request that starts meanwhile."""


class ModelBroker:
    """A `ModelClient` over `client` that applies `limits` to every request through it.

    `client_for(name)` makes the client for an agent type that names another model (made once
    per name, closed with the broker); without it such requests use `client`.

    `stream` is the main agent's (the session's `ModelClient`): one request at a time, in a
    slot of its own; the worker pool streams its subagents' requests with `subagent=True`,
    through the `max_concurrent_requests` shared slots, so subagents never hold up the main
    agent's turns.

    **Cancellation:** as the underlying client's; a request waiting for a slot or a backoff
    stops waiting.
    **Errors:** `ModelError(reason="budget_exceeded")` once the budget is used up; otherwise
    the client's `ModelError`s.
    """

    def __init__(
        self,
        client: ModelClient,
        *,
        limits: BrokerLimits | None = None,
        client_for: Callable[[str], ModelClient] | None = None,
    ) -> None:
        self._client = client
        self._sizes: dict[int, _MessageSizes] = {}
        """Per conversation (by its first message, which `_MessageSizes` keeps alive, so the
        id is not reused): the sizes of its last request."""
        self._limits = limits or BrokerLimits()
        self._client_for = client_for
        self._clients: dict[str, ModelClient] = {client.model: client}
        self._limiter = trio.CapacityLimiter(self._limits.max_concurrent_requests)
        self._main_slot = trio.CapacityLimiter(1)
        self._backoff = self._limits.backoff_statuses
        self._paused_until = -float("inf")
        self.usage = Usage()
        """Tokens used through the broker so far."""
        self.cost_usd = 0.0
        """Dollars spent through the broker so far."""
        self.in_flight = 0
        """Requests streaming right now."""
        self._reserved = _Estimate(0, 0, 0.0)

    @property
    def model(self) -> str:
        return self._client.model

    @property
    def limits(self) -> BrokerLimits:
        return self._limits

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def stream(
        self, request: ModelRequest, *, model: str | None = None, subagent: bool = False
    ) -> AsyncGenerator[ModelEvent, None]:
        """Stream one response from `model` (default: the broker's), within the limits.
        `subagent`: a subagent's request, in one of the shared slots; else the main agent's,
        in its own (tests/workers/test_broker.py)."""
        request = self._clamped(request, model)
        self._refuse_over_budget(_Estimate(0, 0, 0.0))
        async with self._limiter if subagent else self._main_slot:
            # The pause may be extended while we sleep (another 429): look again after it.
            while self._paused_until > trio.current_time():  # noqa: ASYNC110
                await trio.sleep_until(self._paused_until)
            estimate = self._reserve(request, model or self.model)
            self.in_flight += 1
            try:
                async with closing_iter(self._model_client(model).stream(request)) as events:
                    async for event in events:
                        if isinstance(event, Retry) and event.status in self._backoff:
                            due = trio.current_time() + event.delay_s
                            self._paused_until = max(self._paused_until, due)
                        elif isinstance(event, MessageComplete):
                            self.usage += event.message.usage
                            self.cost_usd += event.message.cost_usd
                        yield event
            finally:
                self.in_flight -= 1
                self._release(estimate)

    def _clamped(self, request: ModelRequest, model: str | None) -> ModelRequest:
        """`request` with `max_tokens` at most the output limit of the model it goes to."""
        limit = clamp_max_tokens(model or self._client.model, request.max_tokens)
        if limit == request.max_tokens:
            return request
        return dataclasses.replace(request, max_tokens=limit)

    def _model_client(self, name: str | None) -> ModelClient:
        # The broker's own client may change its model (`SwitchableModel`): None is always it.
        if name is None:
            return self._client
        if name in self._clients:
            return self._clients[name]
        if self._client_for is None:
            return self._client
        client = self._clients[name] = self._client_for(name)
        return client

    def _estimate(self, request: ModelRequest, model: str) -> _Estimate:
        """The most `request` can use: its estimated input plus `max_tokens` of output."""
        first = id(request.messages[0]) if request.messages else 0
        sizes = self._sizes.pop(first, None) or _MessageSizes()
        input_tokens = estimate_input_tokens(request, sizes)
        self._sizes[first] = sizes  # most recent last; a few conversations are remembered
        while len(self._sizes) > _CONVERSATIONS_REMEMBERED:
            del self._sizes[next(iter(self._sizes))]
        price = price_for(model)
        cost = (
            0.0
            if price is None
            else (input_tokens * price.input + request.max_tokens * price.output) / 1_000_000
        )
        return _Estimate(input_tokens + request.max_tokens, request.max_tokens, cost)

    def _reserve(self, request: ModelRequest, model: str) -> _Estimate:
        """Check the budget for `request` and hold its estimate until `_release`.

        **Errors:** `ModelError(reason="budget_exceeded")`, nothing reserved, when the spend so
        far plus every reservation plus this estimate would pass a budget.
        """
        estimate = self._estimate(request, model)
        self._refuse_over_budget(estimate)
        held = self._reserved
        self._reserved = _Estimate(
            held.tokens + estimate.tokens,
            held.output_tokens + estimate.output_tokens,
            held.cost_usd + estimate.cost_usd,
        )
        return estimate

    def _release(self, estimate: _Estimate) -> None:
        held = self._reserved
        self._reserved = _Estimate(
            held.tokens - estimate.tokens,
            held.output_tokens - estimate.output_tokens,
            held.cost_usd - estimate.cost_usd,
        )

    def _refuse_over_budget(self, estimate: _Estimate) -> None:
        limits = self._limits
        used = self.usage
        held = self._reserved
        tokens = (
            used.input_tokens
            + used.output_tokens
            + used.cache_creation_input_tokens
            + used.cache_read_input_tokens
        )
        if limits.max_tokens is not None and (
            tokens + held.tokens + estimate.tokens > limits.max_tokens
            or tokens >= limits.max_tokens
        ):
            raise ModelError(
                f"The session's budget of {limits.max_tokens} tokens would be passed by the "
                f"next request ({tokens} used, about {estimate.tokens} more needed), so it was "
                "not sent.",
                reason="budget_exceeded",
            )
        if limits.max_output_tokens is not None and (
            used.output_tokens + held.output_tokens + estimate.output_tokens
            > limits.max_output_tokens
            or used.output_tokens >= limits.max_output_tokens
        ):
            raise ModelError(
                f"The session's budget of {limits.max_output_tokens} output tokens would be "
                f"passed by the next request ({used.output_tokens} used, up to "
                f"{estimate.output_tokens} more), so it was not sent.",
                reason="budget_exceeded",
            )
        if limits.max_cost_usd is not None and (
            self.cost_usd + held.cost_usd + estimate.cost_usd > limits.max_cost_usd
            or self.cost_usd >= limits.max_cost_usd
        ):
            raise ModelError(
                f"The session's budget of ${limits.max_cost_usd:.2f} would be passed by the "
                f"next request (${self.cost_usd:.4f} spent, up to ${estimate.cost_usd:.4f} "
                "more), so it was not sent.",
                reason="budget_exceeded",
            )
