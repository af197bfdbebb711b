"""The model table: aliases, context windows, output limits, prices (longest prefix)."""

from __future__ import annotations

import pytest

from orchestrator.messages import Usage
from orchestrator.model.catalog import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_OUTPUT_LIMIT,
    UNKNOWN_MODEL,
    clamp_max_tokens,
    context_window,
    cost_usd,
    default_max_tokens,
    model_info,
    output_limit,
    price_for,
    resolve_model,
)

MILLION = Usage(
    input_tokens=1_000_000,
    output_tokens=1_000_000,
    cache_creation_input_tokens=1_000_000,
    cache_read_input_tokens=1_000_000,
)


@pytest.mark.parametrize(
    ("model", "total"),
    [
        ("claude-opus-4-20250514", 15 + 75 + 18.75 + 1.5),
        ("claude-opus-4-1-20250805", 15 + 75 + 18.75 + 1.5),
        ("claude-opus-4-5-20251101", 5 + 25 + 6.25 + 0.5),
        ("claude-opus-4-6", 5 + 25 + 6.25 + 0.5),
        ("claude-sonnet-4-6", 3 + 15 + 3.75 + 0.3),
        ("claude-sonnet-4-5-20250929", 3 + 15 + 3.75 + 0.3),
        ("claude-sonnet-4-20250514", 3 + 15 + 3.75 + 0.3),
        ("claude-haiku-4-5-20251001", 1 + 5 + 1.25 + 0.1),
        ("claude-3-7-sonnet-20250219", 3 + 15 + 3.75 + 0.3),
        ("claude-3-5-haiku-20241022", 0.8 + 4 + 1 + 0.08),
        ("claude-3-haiku-20240307", 0.25 + 1.25 + 0.3 + 0.03),
    ],
)
def test_prices_by_longest_prefix(model: str, total: float) -> None:
    assert cost_usd(model, MILLION) == pytest.approx(total)


def test_each_kind_of_token_has_its_own_price() -> None:
    usage = Usage(
        input_tokens=1000,
        output_tokens=500,
        cache_creation_input_tokens=200,
        cache_read_input_tokens=3000,
    )
    expected = (1000 * 3 + 500 * 15 + 200 * 3.75 + 3000 * 0.3) / 1_000_000
    assert cost_usd("claude-sonnet-4-6", usage) == pytest.approx(expected)


def test_unknown_models_cost_nothing() -> None:
    assert price_for("scripted") is None
    assert cost_usd("scripted", MILLION) == 0.0
    assert cost_usd("gpt-9", Usage()) == 0.0


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("sonnet", "claude-sonnet-4-6"),
        ("Opus", "claude-opus-4-6"),
        ("haiku", "claude-haiku-4-5"),
        ("claude-3-haiku-20240307", "claude-3-haiku-20240307"),
        ("sonnet-5", "sonnet-5"),
        ("scripted:/tmp/x.json", "scripted:/tmp/x.json"),
    ],
)
def test_aliases_resolve_to_the_current_ids(name: str, model: str) -> None:
    assert resolve_model(name) == model


def test_an_alias_has_the_row_of_its_model() -> None:
    assert model_info("opus") == model_info("claude-opus-4-6")
    assert model_info("opus").output_limit == 128_000
    assert cost_usd("haiku", MILLION) == cost_usd("claude-haiku-4-5", MILLION)


@pytest.mark.parametrize(
    ("model", "limit", "default"),
    [
        ("claude-opus-4-20250514", 32_000, 32_000),
        ("claude-opus-4-6", 128_000, 32_000),
        ("claude-sonnet-4-5-20250929", 64_000, 32_000),
        ("claude-3-5-haiku-20241022", 8_192, 8_192),
        ("claude-3-haiku-20240307", 4_096, 4_096),
    ],
)
def test_output_limits_and_default_max_tokens(model: str, limit: int, default: int) -> None:
    assert output_limit(model) == limit
    assert default_max_tokens(model) == default
    assert clamp_max_tokens(model, 10**9) == limit
    assert clamp_max_tokens(model, 100) == 100
    assert context_window(model) == 200_000


@pytest.mark.parametrize("model", ["scripted", "claude-fable-9", "gpt-9", ""])
def test_an_unknown_model_gets_the_conservative_defaults(model: str) -> None:
    assert model_info(model) == UNKNOWN_MODEL
    assert context_window(model) == DEFAULT_CONTEXT_WINDOW == 200_000
    assert output_limit(model) == DEFAULT_OUTPUT_LIMIT == 32_000
    assert default_max_tokens(model) == 32_000
    assert price_for(model) is None


def test_claude_codes_environment_repoints_the_aliases() -> None:
    env = {"ANTHROPIC_SMALL_FAST_MODEL": "small-1", "ANTHROPIC_DEFAULT_OPUS_MODEL": " big-2 "}
    assert resolve_model("haiku", env) == "small-1"
    assert resolve_model("Opus", env) == "big-2"
    assert resolve_model("sonnet", env) == "claude-sonnet-4-6"
    assert resolve_model("claude-haiku-4-5", env) == "claude-haiku-4-5"  # ids stay as given
    env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = "haiku-3"  # the newer name wins
    assert resolve_model("haiku", env) == "haiku-3"
