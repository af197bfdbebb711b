"""What a run spent, counted at the broker: the main agent's and every subagent's usage and
cost, and `modelUsage` by model as Claude Code's result has it.
"""

from __future__ import annotations

import dataclasses

from orchestrator.conversation.loop import ModelUsage, RunResult
from orchestrator.messages import Usage
from orchestrator.model.base import ModelClient
from orchestrator.session.config import MeteredModel

__all__ = ["spent", "with_session_spend", "with_subagent_models"]


def spent(model: ModelClient) -> tuple[Usage, float] | None:
    return (model.usage, model.cost_usd) if isinstance(model, MeteredModel) else None


def with_session_spend(
    result: RunResult, model: ModelClient, before: tuple[Usage, float] | None
) -> RunResult:
    """The run's usage and cost counted at the broker: the main agent's and every
    subagent's (the loop alone sees only the main agent's)."""
    after = spent(model)
    if before is None or after is None:
        return result
    (used, _), (was, _) = after, before
    usage = Usage(
        input_tokens=used.input_tokens - was.input_tokens,
        output_tokens=used.output_tokens - was.output_tokens,
        cache_creation_input_tokens=used.cache_creation_input_tokens
        - was.cache_creation_input_tokens,
        cache_read_input_tokens=used.cache_read_input_tokens - was.cache_read_input_tokens,
    )
    return dataclasses.replace(result, usage=usage, cost_usd=after[1] - before[1])


def with_subagent_models(result: RunResult, spend: dict[str, ModelUsage]) -> RunResult:
    """`modelUsage` counts subagents' turns too, as Claude Code's does (their cost is in
    `total_cost_usd` already, counted at the broker)."""
    if not spend:
        return result
    merged = dict(result.model_usage)
    for model, entry in spend.items():
        was = merged.get(model, ModelUsage())
        merged[model] = ModelUsage(
            was.usage + entry.usage, was.cost_usd + entry.cost_usd, was.requests + entry.requests
        )
    return dataclasses.replace(result, model_usage=merged)
