"""The retry schedule and the judgement of API errors, as pure functions."""

from __future__ import annotations

import email.utils

import pytest

from orchestrator.model.retry import (
    RetryPolicy,
    classify_api_error,
    is_retryable_status,
    retry_after_s,
    status_for_error_type,
)


@pytest.mark.parametrize(
    ("retry", "expected"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 32.0), (8, 32.0), (20, 32.0)],
)
def test_backoff_doubles_up_to_the_ceiling(retry: int, expected: float) -> None:
    assert RetryPolicy(jitter=0.0).delay_s(retry) == expected


def test_jitter_only_shortens_and_stays_within_its_fraction() -> None:
    policy = RetryPolicy(jitter=0.25)
    assert policy.delay_s(3, rand=0.0) == 2.0
    assert policy.delay_s(3, rand=0.999) == pytest.approx(1.5, abs=0.01)
    assert 1.5 <= policy.delay_s(3, rand=0.5) <= 2.0


def test_retry_after_wins_over_the_schedule_and_is_capped() -> None:
    policy = RetryPolicy(max_retry_after_s=60.0)
    assert policy.delay_s(1, retry_after=7.0, rand=0.9) == 7.0
    assert policy.delay_s(1, retry_after=0.0) == 0.0
    assert policy.delay_s(1, retry_after=3600.0) == 60.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"jitter": 1.5}, "jitter"),
        ({"base_delay_s": 10.0, "max_delay_s": 1.0}, "base_delay_s"),
    ],
)
def test_contradictory_policies_are_rejected(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-1"}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers) == expected


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    header = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_s({"retry-after": header}, now=now) == pytest.approx(30.0)
    assert retry_after_s({"retry-after": header}, now=now + 100) == 0.0


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (409, True),
        (413, False),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (529, True),
    ],
)
def test_retryable_statuses(status: int, retryable: bool) -> None:
    assert is_retryable_status(status) is retryable


def test_sse_error_types_map_to_their_statuses() -> None:
    assert status_for_error_type("overloaded_error") == 529
    assert status_for_error_type("api_error") == 500
    assert status_for_error_type("invalid_request_error") == 400
    assert status_for_error_type("something_new") is None
    assert status_for_error_type(None) is None


@pytest.mark.parametrize(
    ("status", "error_type", "message", "reason", "needle"),
    [
        (401, "authentication_error", "invalid x-api-key", "model_error", "ANTHROPIC_API_KEY"),
        (
            400,
            "invalid_request_error",
            "prompt is too long: 250000 tokens > 200000 maximum",
            "prompt_too_long",
            "250000 tokens",
        ),
        (
            413,
            "request_too_large",
            "Request exceeds the maximum size",
            "prompt_too_long",
            "too long",
        ),
        (400, "invalid_request_error", "messages.1: bad thing", "model_error", "messages.1: bad"),
        (
            400,
            "invalid_request_error",
            "Your credit balance is too low",
            "model_error",
            "credit balance",
        ),
        (402, "billing_error", "Payment required", "model_error", "billing"),
        (403, "permission_error", "not allowed", "model_error", "not permitted"),
        (404, "not_found_error", "model: claude-x", "model_error", "'claude-x' was not found"),
    ],
)
def test_non_retryable_errors_say_what_to_do(
    status: int, error_type: str, message: str, reason: str, needle: str
) -> None:
    failure = classify_api_error(status, error_type, message, model="claude-x")
    assert not failure.retryable
    assert failure.reason == reason
    assert failure.status == status
    assert needle in failure.message


def test_retryable_errors_keep_the_servers_wait() -> None:
    failure = classify_api_error(
        429, "rate_limit_error", "slow down", model="m", headers={"retry-after": "4"}
    )
    assert failure.retryable
    assert failure.retry_after == 4.0
    assert "slow down" in failure.message


def test_mid_stream_errors_are_judged_by_type() -> None:
    assert classify_api_error(None, "overloaded_error", "Overloaded", model="m").retryable
    assert classify_api_error(None, "api_error", "Internal", model="m").retryable
    assert not classify_api_error(None, "invalid_request_error", "bad", model="m").retryable
    assert not classify_api_error(None, None, "garbled", model="m").retryable


def test_x_should_retry_overrides_the_status_rule() -> None:
    assert not classify_api_error(
        529, None, "x", model="m", headers={"x-should-retry": "false"}
    ).retryable
    assert classify_api_error(
        400, None, "x", model="m", headers={"X-Should-Retry": "true"}
    ).retryable
