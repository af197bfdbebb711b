"""What a response cost, in US dollars, from its token counts.

The client stamps `cost_usd` on every `AssistantMessage`; budgets (`--max-budget-usd`) and the
headless `result` event add them up. Prices are list prices per million tokens; cache writes
are the 5-minute-TTL rate. A model this table does not know costs 0 rather than failing a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.messages import Usage

__all__ = ["ModelPrice", "cost_usd", "price_for"]


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float


_OPUS_4 = ModelPrice(input=15.0, output=75.0, cache_write=18.75, cache_read=1.50)
_OPUS_4_5 = ModelPrice(input=5.0, output=25.0, cache_write=6.25, cache_read=0.50)
_SONNET = ModelPrice(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30)
_HAIKU_4_5 = ModelPrice(input=1.0, output=5.0, cache_write=1.25, cache_read=0.10)
_HAIKU_3_5 = ModelPrice(input=0.80, output=4.0, cache_write=1.0, cache_read=0.08)
_HAIKU_3 = ModelPrice(input=0.25, output=1.25, cache_write=0.30, cache_read=0.03)

# Matched by longest prefix, so dated ids (claude-sonnet-4-5-20250929) and aliases share a row,
# and claude-opus-4-5 does not fall back to the older claude-opus-4 price.
_PRICES: Mapping[str, ModelPrice] = {
    "claude-opus-4": _OPUS_4,  # claude-opus-4-0, claude-opus-4-20250514
    "claude-opus-4-1": _OPUS_4,
    "claude-4-opus": _OPUS_4,
    "claude-opus-4-5": _OPUS_4_5,
    "claude-opus-4-6": _OPUS_4_5,
    "claude-opus-4-7": _OPUS_4_5,
    "claude-opus-4-8": _OPUS_4_5,
    "claude-sonnet-4": _SONNET,
    "claude-4-sonnet": _SONNET,
    "claude-haiku-4": _HAIKU_4_5,
    "claude-3-opus": _OPUS_4,
    "claude-3-7-sonnet": _SONNET,
    "claude-3-5-sonnet": _SONNET,
    "claude-3-sonnet": _SONNET,
    "claude-3-5-haiku": _HAIKU_3_5,
    "claude-3-haiku": _HAIKU_3,
}


def price_for(model: str) -> ModelPrice | None:
    """The price row of `model` (longest matching prefix), or None when unknown."""
    best: str | None = None
    for prefix in _PRICES:
        if model.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return None if best is None else _PRICES[best]


def cost_usd(model: str, usage: Usage) -> float:
    """Cost of `usage` on `model` in US dollars; 0.0 for a model without a known price."""
    price = price_for(model)
    if price is None:
        return 0.0
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_creation_input_tokens * price.cache_write
        + usage.cache_read_input_tokens * price.cache_read
    ) / 1_000_000
