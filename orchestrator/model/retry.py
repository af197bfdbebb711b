"""When a failed model request is retried, and after how long: pure functions and one policy.

The Anthropic client retries around the whole stream (a failure after partial output restarts
the request), so the decision is made here from plain values (status, error type, headers)
that both a status error and an SSE `error` event provide. Keeping it pure makes the schedule
table-testable (tests/orchestrator/model/test_retry.py) and lets the client inject its sleep.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.errors import ModelFailureReason

__all__ = [
    "ApiFailure",
    "RetryPolicy",
    "classify_api_error",
    "is_retryable_status",
    "retry_after_s",
    "status_for_error_type",
]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a model request is retried.

    The delay before retry n (n = 1 for the second attempt) is `base_delay_s * 2**(n-1)`,
    capped at `max_delay_s`, minus up to `jitter` of itself at random so that many clients
    that failed together do not come back together. A `retry-after` from the server wins over
    the schedule (capped at `max_retry_after_s`) and is not jittered.
    """

    max_attempts: int = 10
    """Attempts in all, the first one included."""
    base_delay_s: float = 0.5
    """Delay before the first retry, in seconds, before jitter."""
    max_delay_s: float = 32.0
    """Ceiling of the exponential schedule, in seconds."""
    jitter: float = 0.25
    """Fraction of the scheduled delay removed at random (0 disables jitter)."""
    max_retry_after_s: float = 300.0
    """Ceiling applied to a server's `retry-after`, in seconds."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(
                f"RetryPolicy.max_attempts must be at least 1, not {self.max_attempts}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must be between 0 and 1, not {self.jitter}")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError(
                "RetryPolicy needs 0 <= base_delay_s <= max_delay_s, got "
                f"base_delay_s={self.base_delay_s} and max_delay_s={self.max_delay_s}"
            )

    def delay_s(self, retry: int, *, retry_after: float | None = None, rand: float = 0.0) -> float:
        """Seconds to wait before retry number `retry` (1 for the second attempt).

        `rand` is a uniform draw from [0, 1) supplied by the caller, which keeps this pure.
        """
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after_s))
        scheduled = min(self.max_delay_s, self.base_delay_s * 2.0 ** max(0, retry - 1))
        return scheduled * (1.0 - self.jitter * rand)


def retry_after_s(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The server's requested wait in seconds, from `retry-after-ms` or `retry-after`.

    `retry-after` may be seconds or an HTTP date (compared with `now`, default the wall clock).
    Unparseable or negative values count as absent.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            value = -1.0
        if value >= 0:
            return value
    seconds = lowered.get("retry-after")
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(seconds)
        except (TypeError, ValueError):
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, value)
    return value if value >= 0 else None


def is_retryable_status(status: int) -> bool:
    """408, 409, 429 and every 5xx (529 overloaded included) are worth another attempt."""
    return status in (408, 409, 429) or status >= 500


_STATUS_BY_ERROR_TYPE: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def status_for_error_type(error_type: str | None) -> int | None:
    """The HTTP status the API uses for an error type, so an SSE `error` event (which arrives
    on a 200 response) is judged like the same error before the stream."""
    return None if error_type is None else _STATUS_BY_ERROR_TYPE.get(error_type)


@dataclass(frozen=True)
class ApiFailure:
    """One failed attempt, judged: retry it, or give up with `message` and `reason`."""

    message: str
    """One sentence for the user (and for the `Retry` event)."""
    retryable: bool
    status: int | None = None
    retry_after: float | None = None
    """The server's requested wait in seconds, when it sent one."""
    reason: ModelFailureReason = "model_error"


def classify_api_error(
    status: int | None,
    error_type: str | None,
    api_message: str,
    *,
    model: str,
    headers: Mapping[str, str] | None = None,
    mid_stream: bool = False,
) -> ApiFailure:
    """Judge an API error: a status error before the stream, or an SSE `error` event in it.

    `status` is the HTTP status (None for an SSE error event, which is judged by its type).
    `x-should-retry` from the server overrides the status rule, as the official SDKs do.
    """
    headers = headers or {}
    lowered = {name.lower(): value for name, value in headers.items()}
    effective = status if status is not None else status_for_error_type(error_type)
    label = ", ".join(str(part) for part in (status, error_type) if part is not None) or "error"
    detail = api_message.strip() or "no message"
    lowered_detail = detail.lower()
    wait = retry_after_s(headers)

    should_retry = lowered.get("x-should-retry")
    retryable = effective is not None and is_retryable_status(effective)
    if should_retry in ("true", "false"):
        retryable = should_retry == "true"
    if retryable:
        where = "The API stream failed" if mid_stream else "The API request failed"
        return ApiFailure(f"{where} ({label}): {detail}", True, status, wait)

    if "prompt is too long" in lowered_detail or effective == 413:
        return ApiFailure(
            f"The prompt is too long for {model} ({label}): {detail}",
            False,
            status,
            reason="prompt_too_long",
        )
    if effective == 402 or error_type == "billing_error" or "credit balance" in lowered_detail:
        return ApiFailure(
            f"The API refused the request for billing reasons ({label}): {detail} "
            "Check the account's credit balance and plan.",
            False,
            status,
        )
    if effective == 401:
        return ApiFailure(
            f"The API key was rejected ({label}: {detail}); set ANTHROPIC_API_KEY to a valid key.",
            False,
            status,
        )
    if effective == 403:
        return ApiFailure(
            f"The API key is not permitted to make this request ({label}): {detail}",
            False,
            status,
        )
    if effective == 404:
        return ApiFailure(
            f"The model {model!r} was not found ({label}: {detail}); check the model name.",
            False,
            status,
        )
    if effective == 400:
        return ApiFailure(f"The API rejected the request ({label}): {detail}", False, status)
    return ApiFailure(f"The API request failed ({label}): {detail}", False, status)
