"""How many output tokens each model may be asked for (`max_tokens`), so a request is clamped
to what the model can give instead of being refused by the API, and so no agent (a subagent's
worker least of all) can ask for more than the model's output limit.

Matched by longest prefix like `pricing.py`; a model this table does not know gets
`DEFAULT_OUTPUT_LIMIT`.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULT_OUTPUT_LIMIT", "clamp_max_tokens", "output_limit"]

DEFAULT_OUTPUT_LIMIT = 64_000
"""Output tokens allowed for a model the table does not know."""

_OUTPUT_LIMITS: Mapping[str, int] = {
    "claude-opus-4": 32_000,  # claude-opus-4-0, claude-opus-4-20250514
    "claude-opus-4-1": 32_000,
    "claude-4-opus": 32_000,
    "claude-opus-4-5": 64_000,
    "claude-opus-4-6": 128_000,
    "claude-opus-4-7": 128_000,
    "claude-opus-4-8": 128_000,
    "claude-sonnet-4": 64_000,
    "claude-4-sonnet": 64_000,
    "claude-haiku-4": 64_000,
    "claude-3-7-sonnet": 64_000,
    "claude-3-5-sonnet": 8_192,
    "claude-3-5-haiku": 8_192,
    "claude-3-opus": 4_096,
    "claude-3-sonnet": 4_096,
    "claude-3-haiku": 4_096,
}


def output_limit(model: str) -> int:
    """The most output tokens `model` may be asked for (longest matching prefix)."""
    best: str | None = None
    for prefix in _OUTPUT_LIMITS:
        if model.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return DEFAULT_OUTPUT_LIMIT if best is None else _OUTPUT_LIMITS[best]


def clamp_max_tokens(model: str, max_tokens: int) -> int:
    """`max_tokens`, lowered to `model`'s output limit when above it."""
    return min(max_tokens, output_limit(model))
