"""The Anthropic Messages API as a `ModelClient`: streaming, retries, errors, cost.

The coordinator holds the one instance that has the API key and network; subagents reach it
through the broker. Each `stream()` call is one request, streamed event by event so the loop can
start concurrency-safe tools at each `content_block_stop`, and retried *around the whole
stream*: a failure after partial output (an SSE `error` event, a dropped connection, a read
timeout) restarts the request, after a `Retry` event telling the consumer to discard what it
got. The SDK's own retries are off so that there is one schedule (retry.py) and one place that
tells the user what is happening.

The SDK sends the request (auth, headers, timeouts) and raises status errors; convert.py builds
the JSON body and decodes the response, read as bytes through httpx2. Two SDK conveniences are
skipped on purpose: `messages.create` deep-copies and re-encodes the whole conversation every
turn (several ms at 1,000 messages; the body is built from cached per-message JSON instead), and
its event iterator leaves nested async generators unclosed when an `error` event arrives, which
trio reports as a leak.

`anthropic` takes about a second to import, so it is imported on first use, in a thread
(`warm_up`), never at module import.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from orchestrator.errors import ModelError
from orchestrator.model.base import (
    BlockComplete,
    MessageComplete,
    ModelEvent,
    ModelRequest,
    Retry,
    TextDelta,
)
from orchestrator.model.convert import (
    MessageJsonCache,
    SSEDecoder,
    StreamAccumulator,
    StreamProtocolError,
    encode_request,
    request_params,
)
from orchestrator.model.retry import ApiFailure, RetryPolicy, classify_api_error

if TYPE_CHECKING:
    import httpx2
    from anthropic import AsyncAnthropic, AsyncStream
    from anthropic.types import RawMessageStreamEvent

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "DEFAULT_READ_TIMEOUT_S", "AnthropicModel", "warm_up"]

DEFAULT_READ_TIMEOUT_S = 120.0
"""Longest silence tolerated on an open stream (the API pings well within it)."""
DEFAULT_CONNECT_TIMEOUT_S = 10.0
_CLOSE_TIMEOUT_S = 2.0
"""Bound on closing a response, shielded from cancellation."""
_DRAIN_CHUNKS = 64
"""Most chunks read from a closed response while its generators wind down."""


async def warm_up() -> None:
    """Import the SDK in a worker thread, so start-up work can overlap the ~1 s import.

    **Cancellation:** the import finishes in its thread even if the caller is cancelled.
    """
    await trio.to_thread.run_sync(_import_sdk)


def _import_sdk() -> None:
    import anthropic  # noqa: F401
    import httpx2  # noqa: F401


class _AttemptFailed(Exception):
    """One attempt failed; `failure` says whether to retry. Never escapes `stream`."""

    def __init__(self, failure: ApiFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class AnthropicModel:
    """A `ModelClient` for the Anthropic Messages API.

    `api_key` defaults to `ANTHROPIC_API_KEY`, `base_url` to `ANTHROPIC_BASE_URL` (then the
    public API). `http_client` (an `httpx2.AsyncClient`) is the transport seam; the model closes
    it in `aclose`. `sleep` waits between attempts (tests inject one that records delays) and
    `rng` draws the jitter.

    **Cancellation:** cancelling the consumer closes the response at once (the close is shielded
    and bounded by 2 s); cancelling during a backoff sleep ends it.
    **Errors:** `ModelError` when a request failed for good: not retryable (its `reason` is
    `prompt_too_long` for an over-long prompt, else `model_error`), or still failing after
    `retry.max_attempts` attempts.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        retry: RetryPolicy | None = None,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        http_client: httpx2.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = trio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._model = model
        self._api_key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        self._base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self._retry = retry or RetryPolicy()
        self._read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._http_client = http_client
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._client: AsyncAnthropic | None = None
        self._json_cache = MessageJsonCache()
        self._closed = False

    @property
    def model(self) -> str:
        return self._model

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._retry

    async def warm_up(self) -> None:
        """Make the SDK client ahead of the first request, in a thread: the SDK import (when
        it is not loaded yet) and its TLS context (reading the CA bundle, 40-70 ms) overlap
        the session's start-up, which waits on its sandboxes meanwhile. Later calls are
        free. Without a key it only imports (the first request says what is missing).

        **Cancellation:** the thread finishes its work; the client is kept for the request.
        """
        if self._client is not None or self._closed:
            return
        if not self._has_key():
            await warm_up()
            return
        client = await trio.to_thread.run_sync(self._new_client)
        if self._client is None:
            self._client = client

    async def aclose(self) -> None:
        """Close the SDK client and its connections; idempotent.

        **Cancellation:** shielded and bounded, so a cancelled caller still releases sockets.
        """
        self._closed = True
        client, self._client = self._client, None
        if client is None:
            if self._http_client is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT_S):
                    await self._http_client.aclose()
            return
        with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT_S):
            await client.close()

    async def _sdk_client(self) -> AsyncAnthropic:
        if self._closed:
            raise ModelError("The Anthropic model client was used after it was closed.")
        if self._client is not None:
            return self._client
        if not self._has_key():
            raise ModelError("No API key was found: set ANTHROPIC_API_KEY.")
        await warm_up()
        if self._client is None:  # another task may have made it while we imported
            self._client = self._new_client()
        return self._client

    def _has_key(self) -> bool:
        return bool(self._api_key or os.environ.get("ANTHROPIC_AUTH_TOKEN"))

    def _new_client(self) -> AsyncAnthropic:
        """The SDK client; its HTTP client is the SDK's default one, on the TLS context the
        warm server made when that is the same as the SDK's own (`orchestrator.model.tls`)."""
        import anthropic
        import httpx2

        from orchestrator.model import tls

        timeout = httpx2.Timeout(self._read_timeout_s, connect=self._connect_timeout_s)
        http_client = self._http_client
        if http_client is None and (context := tls.preloaded()) is not None:
            http_client = anthropic.DefaultAsyncHttpxClient(verify=context, timeout=timeout)
        return anthropic.AsyncAnthropic(
            api_key=self._api_key or None,
            base_url=self._base_url,
            max_retries=0,
            timeout=timeout,
            http_client=http_client,
        )

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The input tokens of `request` by the API's `count_tokens` endpoint (free, no
        output): what context accounting asks when its estimate is near the limit. None when
        the endpoint cannot answer (the estimate stands then); never raises."""
        try:
            client = await self._sdk_client()
            params = request_params(self._model, request)
            params.pop("max_tokens", None)
            counted = await client.messages.count_tokens(**params)
            return int(counted.input_tokens)
        except Exception:  # any failure: the caller keeps its estimate
            return None

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        """Stream one response, retrying the whole stream on transient failures.

        Yields `TextDelta`s and `BlockComplete`s as they arrive, a `Retry` before each new
        attempt (everything before it is void), and one `MessageComplete` at the end. Typed as
        an async generator (narrower than the protocol) so callers can `aclosing` it.
        """
        client = await self._sdk_client()
        body = encode_request(self._model, request, self._json_cache)
        failure: ApiFailure | None = None
        for attempt in range(1, self._retry.max_attempts + 1):
            if failure is not None:
                delay = self._retry.delay_s(
                    attempt - 1, retry_after=failure.retry_after, rand=self._rng.random()
                )
                yield Retry(
                    attempt=attempt,
                    delay_s=delay,
                    error=failure.message,
                    status=failure.status,
                    max_retries=self._retry.max_attempts - 1,
                )
                await self._sleep(delay)
            try:
                stream = await self._open(client, body)
                # Each attempt accumulates from scratch: a retry never mixes two responses.
                accumulator = StreamAccumulator(model=self._model)
                decoder = SSEDecoder()
                chunks = stream.response.aiter_bytes()
                try:
                    while not accumulator.stopped:
                        chunk = await _next_chunk(chunks)
                        if chunk is None:
                            raise _AttemptFailed(
                                ApiFailure(
                                    "The API stream ended before the message was complete.",
                                    retryable=True,
                                )
                            )
                        for sse in decoder.feed(chunk):
                            if sse.event == "error":
                                raise _AttemptFailed(self._stream_error(sse.data))
                            if sse.event == "ping" or not sse.data:
                                continue
                            for event in _feed(accumulator, sse.event, sse.data):
                                yield event
                    message = accumulator.finish(
                        request_id=stream.response.headers.get("request-id")
                    )
                    # Read to the end *before* handing the message over, so the connection
                    # goes back to the pool: every consumer stops at `MessageComplete`, and a
                    # response closed before its last chunk closes its connection, so each
                    # turn would open a new one (a TLS handshake against the real API; on
                    # loopback, a TIME_WAIT socket per turn that makes every later connect
                    # slower). Pinned by test_anthropic.py::test_one_connection_serves_every_turn.
                    with trio.move_on_after(_CLOSE_TIMEOUT_S):
                        while await _next_chunk(chunks, quiet=True) is not None:
                            pass
                    yield MessageComplete(message)
                    return
                finally:
                    await _close(chunks, stream)
            except _AttemptFailed as failed:
                if not failed.failure.retryable:
                    raise ModelError(
                        failed.failure.message,
                        reason=failed.failure.reason,
                        status=failed.failure.status,
                    ) from failed.__cause__
                failure = failed.failure
        assert failure is not None
        raise ModelError(
            f"The model request failed after {self._retry.max_attempts} attempts; "
            f"the last error was: {failure.message}",
            status=failure.status,
        )

    async def _open(
        self, client: AsyncAnthropic, body: bytes
    ) -> AsyncStream[RawMessageStreamEvent]:
        """Send the request; status and connection errors become `_AttemptFailed`.

        The body is already JSON: `messages.create` would deep-copy and re-encode the whole
        conversation on every turn (several ms at 1,000 messages), so the request goes through
        the SDK's generic `post`, which still brings auth, headers, timeouts and status errors.
        """
        import anthropic
        from anthropic.types import Message as ApiMessage
        from anthropic.types import RawMessageStreamEvent

        try:
            return await client.post(
                "/v1/messages",
                cast_to=ApiMessage,
                content=body,
                options={"headers": {"content-type": "application/json"}},
                stream=True,
                stream_cls=anthropic.AsyncStream[RawMessageStreamEvent],
            )
        except anthropic.APIStatusError as exc:
            raise _AttemptFailed(
                classify_api_error(
                    exc.status_code,
                    exc.type,
                    exc.api_message or exc.message,
                    model=self._model,
                    headers=exc.response.headers,
                )
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise _AttemptFailed(
                ApiFailure("The API request timed out before the response began.", retryable=True)
            ) from exc
        except anthropic.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise _AttemptFailed(
                ApiFailure(f"Could not reach the API ({cause}).", retryable=True)
            ) from exc
        except anthropic.AnthropicError as exc:
            raise _AttemptFailed(
                ApiFailure(f"The API request failed: {exc}", retryable=False)
            ) from exc

    def _stream_error(self, data: str) -> ApiFailure:
        """Judge an SSE `error` event by its error type, as the same error before the stream."""
        error_type: str | None = None
        message = data
        try:
            body = _json_object(data)
        except ValueError:
            body = {}
        error = body.get("error")
        if isinstance(error, dict):
            error_type = str(error.get("type")) if error.get("type") else None
            message = str(error.get("message") or data)
        return classify_api_error(None, error_type, message, model=self._model, mid_stream=True)


def _json_object(data: str) -> dict[str, Any]:
    value = json.loads(data)
    return value if isinstance(value, dict) else {}


def _feed(accumulator: StreamAccumulator, name: str, data: str) -> list[TextDelta | BlockComplete]:
    """One SSE event through the accumulator. An event that is not JSON, or is JSON but breaks
    the stream's protocol (a delta for a block never started, a field of the wrong type, ...),
    fails the attempt, retryably, rather than the run: it is translated here, once
    (tests/orchestrator/model/test_anthropic.py::test_a_malformed_event_is_retried)."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise _AttemptFailed(
            ApiFailure(f"The API sent an event that is not JSON: {data[:200]!r}", retryable=True)
        ) from exc
    try:
        return accumulator.feed(value)
    except StreamProtocolError as exc:
        raise _AttemptFailed(
            ApiFailure(f"The API sent a malformed {name} event: {exc}.", retryable=True)
        ) from exc


async def _next_chunk(chunks: AsyncIterator[bytes], *, quiet: bool = False) -> bytes | None:
    """The next piece of the body, None at its end; transport failures become retryable
    `_AttemptFailed` (or None when `quiet`: after `message_stop` nothing is lost)."""
    import httpx2

    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None
    except httpx2.TimeoutException as exc:
        if quiet:
            return None
        raise _AttemptFailed(
            ApiFailure("The API stream went silent past the read timeout.", retryable=True)
        ) from exc
    except httpx2.TransportError as exc:
        if quiet:
            return None
        raise _AttemptFailed(
            ApiFailure(
                f"The API connection dropped mid-stream ({exc or type(exc).__name__}).",
                retryable=True,
            )
        ) from exc


async def _close(chunks: AsyncIterator[bytes], stream: AsyncStream[Any]) -> None:
    """Release the response even when cancelled: shielded, and bounded in time.

    httpx2's response stream is a chain of async generators, and one link does not close the
    next when closed from outside, which trio reports as a leak. So the response is closed
    first and the chain is then pumped until it ends: every generator finishes from the inside.
    """
    with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT_S):
        try:
            await stream.close()
            for _ in range(_DRAIN_CHUNKS):
                await chunks.__anext__()
        except StopAsyncIteration:
            pass
        except Exception:
            pass  # a failed close must not mask the stream's outcome
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
