"""The model broker: the coordinator's one model client, shared by the main agent and every
subagent, with the session's global limits.

Subagents run in sandboxes without the API key or network; their workers send model requests
over the wire protocol and the pool streams them through here. The main agent can use the
broker as its `ModelClient` too, so the limits hold for the whole session:

- at most `max_concurrent_requests` requests stream at once (a `CapacityLimiter`);
- a session budget of tokens and of cost: once used up, every new request fails with
  `ModelError(reason="budget_exceeded")`, which ends the run that made it with
  `budget_exceeded` (a request already streaming may finish and overshoot a little);
- a shared backoff: when one request is told to retry after a 429 or 529, requests that start
  meanwhile wait until that retry is due, so ten agents do not hammer a rate-limited API
  together.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import trio
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.aio import closing_iter
from orchestrator.errors import ModelError
from orchestrator.messages import Usage
from orchestrator.model.base import MessageComplete, ModelClient, ModelEvent, ModelRequest, Retry

__all__ = ["BrokerLimits", "ModelBroker"]


class BrokerLimits(BaseModel):
    """The session's global limits on model use."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent_requests: int = Field(default=10, ge=1)
    """Requests streaming at once, across the main agent and all subagents. Default 10."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Tokens the session may use (input, output and cache tokens together). Default None:
    no limit."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Dollars the session may spend. Default None: no limit."""
    backoff_statuses: frozenset[int] = frozenset({429, 529})
    """HTTP statuses whose retry delay pauses every request that starts meanwhile."""


class ModelBroker:
    """A `ModelClient` over `client` that applies `limits` to every request through it.

    `client_for(name)` makes the client for an agent type that names another model (made once
    per name, closed with the broker); without it such requests use `client`.

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
        self._limits = limits or BrokerLimits()
        self._client_for = client_for
        self._clients: dict[str, ModelClient] = {client.model: client}
        self._limiter = trio.CapacityLimiter(self._limits.max_concurrent_requests)
        self._backoff = self._limits.backoff_statuses
        self._paused_until = -float("inf")
        self.usage = Usage()
        """Tokens used through the broker so far."""
        self.cost_usd = 0.0
        """Dollars spent through the broker so far."""
        self.in_flight = 0
        """Requests streaming right now."""

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
        self, request: ModelRequest, *, model: str | None = None
    ) -> AsyncGenerator[ModelEvent, None]:
        """Stream one response from `model` (default: the broker's), within the limits."""
        self._check_budget()
        async with self._limiter:
            # The pause may be extended while we sleep (another 429): look again after it.
            while self._paused_until > trio.current_time():  # noqa: ASYNC110
                await trio.sleep_until(self._paused_until)
            self._check_budget()
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

    def _model_client(self, name: str | None) -> ModelClient:
        if name is None or name in self._clients:
            return self._clients[name or self._client.model]
        if self._client_for is None:
            return self._client
        client = self._clients[name] = self._client_for(name)
        return client

    def _check_budget(self) -> None:
        limits = self._limits
        used = self.usage
        tokens = (
            used.input_tokens
            + used.output_tokens
            + used.cache_creation_input_tokens
            + used.cache_read_input_tokens
        )
        if limits.max_tokens is not None and tokens >= limits.max_tokens:
            raise ModelError(
                f"The session's budget of {limits.max_tokens} tokens is used up ({tokens} used).",
                reason="budget_exceeded",
            )
        if limits.max_cost_usd is not None and self.cost_usd >= limits.max_cost_usd:
            raise ModelError(
                f"The session's budget of ${limits.max_cost_usd:.2f} is used up "
                f"(${self.cost_usd:.2f} spent).",
                reason="budget_exceeded",
            )
