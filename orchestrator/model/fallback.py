"""`--fallback-model`: Claude Code's switch to another model when the model is overloaded.

A `FallbackModel` streams from its primary client until a request fails for good with the
API's "overloaded" status (529, after the primary's own retries); from then on, for that
request and every later one of the session, it streams from the fallback. The switch is a
`Retry` event (attempt 2, no delay, the error naming both models), so whatever the primary had
streamed of that request is void for every consumer, as after any retry, and the output shows
it (`system/api_retry`). Any other failure is the primary's, unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog

from orchestrator.aio import closing_iter
from orchestrator.errors import ModelError
from orchestrator.model.base import ModelClient, ModelEvent, ModelRequest, Retry

__all__ = ["OVERLOADED", "FallbackModel"]

OVERLOADED = 529
"""The status of the API's `overloaded_error`."""


class FallbackModel:
    """A `ModelClient` that answers with `fallback` once `primary` is overloaded.

    **Cancellation:** as the client streaming at the time.
    **Errors:** the primary's `ModelError` unless it is an overload; the fallback's.
    """

    def __init__(self, primary: ModelClient, fallback: ModelClient) -> None:
        self._primary = primary
        self._fallback = fallback
        self._switched = False

    @property
    def model(self) -> str:
        """The model answering now: the primary's, or the fallback's after a switch."""
        return (self._fallback if self._switched else self._primary).model

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if not self._switched:
            try:
                async with closing_iter(self._primary.stream(request)) as events:
                    async for event in events:
                        yield event
                return
            except ModelError as exc:
                if exc.status != OVERLOADED:
                    raise
                self._switched = True
                structlog.get_logger().warning(
                    "model overloaded, switching", model=self._primary.model,
                    fallback=self._fallback.model,
                )  # fmt: skip
                yield Retry(
                    attempt=2,
                    delay_s=0.0,
                    error=f"{self._primary.model} is overloaded; answering with the fallback "
                    f"model {self._fallback.model}",
                    status=OVERLOADED,
                )
        async with closing_iter(self._fallback.stream(request)) as events:
            async for event in events:
                yield event

    async def aclose(self) -> None:
        try:
            await self._primary.aclose()
        finally:
            await self._fallback.aclose()
