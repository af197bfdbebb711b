"""Cost accounting from token counts."""

from __future__ import annotations

import pytest

from orchestrator.messages import Usage
from orchestrator.model.pricing import cost_usd, price_for

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
