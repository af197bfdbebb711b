"""What Warren knows about each model, in one table: its aliases, context window, output limit
and prices.

- The context window (input plus output tokens one request may hold) lets the loop tell how
  full the conversation is and compact before the API refuses it
  (`orchestrator.conversation.compaction`); `[limits] context_window` overrides the table, and a
  refusal that names the limit ("N tokens > M maximum") teaches the session M.
- The output limit is the most `max_tokens` a request may ask for: the broker clamps every
  request to it (no agent, a subagent's worker least of all, can ask for more), a reply cut
  inside a tool call is retried up to it (`orchestrator.conversation.continuation`), and the default
  `max_tokens` of a request is `default_max_tokens` (the limit, at most 32,000).
- Prices (US dollars per million tokens, list prices; cache writes at the 5-minute-TTL rate)
  give the `cost_usd` the client stamps on every `AssistantMessage`; budgets
  (`--max-budget-usd`) and the `result` event add them up.

Rows are matched by longest prefix, so dated ids (`claude-sonnet-4-5-20250929`) share a row and
`claude-opus-4-5` does not fall back to the older `claude-opus-4` row. Aliases (`sonnet`,
`opus`, `haiku`, as Claude Code spells them) name the current model of each family:
`resolve_model` turns them into the real id, which is what requests carry (Claude Code's
`ANTHROPIC_DEFAULT_SONNET_MODEL`, `..._OPUS_MODEL`, `..._HAIKU_MODEL` and
`ANTHROPIC_SMALL_FAST_MODEL` repoint them, as they do there).

A model the table does not know (a newer id, another provider behind `ANTHROPIC_BASE_URL`,
`scripted`) gets `UNKNOWN_MODEL`: a 200,000-token window and 32,000 output tokens, what every
Claude model since Opus 4 has at least (older, smaller models are listed), and no price, so it
costs 0 rather than failing a run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.messages import Usage

__all__ = [
    "ALIASES",
    "ALIAS_ENV",
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_OUTPUT_LIMIT",
    "MAX_DEFAULT_OUTPUT_TOKENS",
    "UNKNOWN_MODEL",
    "ModelInfo",
    "ModelPrice",
    "clamp_max_tokens",
    "context_window",
    "cost_usd",
    "default_max_tokens",
    "model_info",
    "output_limit",
    "price_for",
    "resolve_model",
]

DEFAULT_CONTEXT_WINDOW = 200_000
"""Tokens assumed for a model the table does not know (every current Claude model has at
least this; a smaller real window is learnt from the first refusal)."""

DEFAULT_OUTPUT_LIMIT = 32_000
"""Output tokens allowed for a model the table does not know."""

MAX_DEFAULT_OUTPUT_TOKENS = 32_000
"""The default `max_tokens` of a request is the model's output limit, at most this: higher
limits stay for the retry of a cut tool call and for `[limits] max_output_tokens`, since a
budget reserves `max_tokens` of output for every request in flight."""

ALIASES: Mapping[str, str] = {
    "sonnet": "claude-sonnet-4-6",
    "opus": "claude-opus-4-6",
    "haiku": "claude-haiku-4-5",
}
"""Short names (`--model sonnet`, an agent type's `model: haiku`) and the id each stands for."""


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float


@dataclass(frozen=True)
class ModelInfo:
    """One row of the table."""

    context_window: int
    """Input plus output tokens one request may hold."""
    output_limit: int
    """The most `max_tokens` a request may ask for."""
    price: ModelPrice | None
    """None: unknown, costs 0."""


UNKNOWN_MODEL = ModelInfo(DEFAULT_CONTEXT_WINDOW, DEFAULT_OUTPUT_LIMIT, None)
"""What a model the table does not know gets (see the module docstring)."""

_OPUS_4 = ModelPrice(input=15.0, output=75.0, cache_write=18.75, cache_read=1.50)
_OPUS_4_5 = ModelPrice(input=5.0, output=25.0, cache_write=6.25, cache_read=0.50)
_SONNET = ModelPrice(input=3.0, output=15.0, cache_write=3.75, cache_read=0.30)
_HAIKU_4_5 = ModelPrice(input=1.0, output=5.0, cache_write=1.25, cache_read=0.10)
_HAIKU_3_5 = ModelPrice(input=0.80, output=4.0, cache_write=1.0, cache_read=0.08)
_HAIKU_3 = ModelPrice(input=0.25, output=1.25, cache_write=0.30, cache_read=0.03)

_MODELS: Mapping[str, ModelInfo] = {
    "claude-opus-4": ModelInfo(200_000, 32_000, _OPUS_4),  # claude-opus-4-0, -4-20250514
    "claude-opus-4-1": ModelInfo(200_000, 32_000, _OPUS_4),
    "claude-4-opus": ModelInfo(200_000, 32_000, _OPUS_4),
    "claude-opus-4-5": ModelInfo(200_000, 64_000, _OPUS_4_5),
    "claude-opus-4-6": ModelInfo(200_000, 128_000, _OPUS_4_5),
    "claude-opus-4-7": ModelInfo(200_000, 128_000, _OPUS_4_5),
    "claude-opus-4-8": ModelInfo(200_000, 128_000, _OPUS_4_5),
    "claude-sonnet-4": ModelInfo(200_000, 64_000, _SONNET),  # 4, 4-5, 4-6
    "claude-4-sonnet": ModelInfo(200_000, 64_000, _SONNET),
    "claude-haiku-4": ModelInfo(200_000, 64_000, _HAIKU_4_5),
    "claude-3-7-sonnet": ModelInfo(200_000, 64_000, _SONNET),
    "claude-3-5-sonnet": ModelInfo(200_000, 8_192, _SONNET),
    "claude-3-5-haiku": ModelInfo(200_000, 8_192, _HAIKU_3_5),
    "claude-3-opus": ModelInfo(200_000, 4_096, _OPUS_4),
    "claude-3-sonnet": ModelInfo(200_000, 4_096, _SONNET),
    "claude-3-haiku": ModelInfo(200_000, 4_096, _HAIKU_3),
}


ALIAS_ENV: Mapping[str, tuple[str, ...]] = {
    "sonnet": ("ANTHROPIC_DEFAULT_SONNET_MODEL",),
    "opus": ("ANTHROPIC_DEFAULT_OPUS_MODEL",),
    "haiku": ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"),
}
"""Claude Code's environment variables that repoint an alias (first set wins): a gateway or
another provider names its models differently. `ANTHROPIC_SMALL_FAST_MODEL`, Claude Code's
older name for its cheap model, is what `haiku` (the cheap agent types' model) stands for."""


def resolve_model(name: str, env: Mapping[str, str] | None = None) -> str:
    """The model id `name` stands for: an alias's id (any case; `ALIAS_ENV` may repoint it),
    else `name` unchanged. `env` defaults to the process environment."""
    alias = name.strip().lower()
    if alias not in ALIASES:
        return name
    env = os.environ if env is None else env
    for variable in ALIAS_ENV[alias]:
        if value := env.get(variable, "").strip():
            return value
    return ALIASES[alias]


def model_info(model: str) -> ModelInfo:
    """The row of `model` (an id or an alias; longest matching prefix), else `UNKNOWN_MODEL`."""
    model = resolve_model(model)
    best: str | None = None
    for prefix in _MODELS:
        if model.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return UNKNOWN_MODEL if best is None else _MODELS[best]


def context_window(model: str) -> int:
    """The context window of `model` in tokens (longest matching prefix, else the default)."""
    return model_info(model).context_window


def output_limit(model: str) -> int:
    """The most output tokens `model` may be asked for (longest matching prefix)."""
    return model_info(model).output_limit


def default_max_tokens(model: str) -> int:
    """The `max_tokens` of `model`'s requests unless configured: its output limit, at most
    `MAX_DEFAULT_OUTPUT_TOKENS`."""
    return min(output_limit(model), MAX_DEFAULT_OUTPUT_TOKENS)


def clamp_max_tokens(model: str, max_tokens: int) -> int:
    """`max_tokens`, lowered to `model`'s output limit when above it."""
    return min(max_tokens, output_limit(model))


def price_for(model: str) -> ModelPrice | None:
    """The price row of `model` (longest matching prefix), or None when unknown."""
    return model_info(model).price


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
