"""A session's limits as one typed value, each default written once.

Limits come from three places, highest first: the command line (`--max-turns`,
`--max-budget-usd`, ...), the policy files' `[limits]` table (merged by `policies.files`), and
the defaults below. `Limits.build` merges them; everything that enforces a limit (the loop, the
pipeline, the worker pool, the model broker) receives the field it needs from this value, so a
default is never repeated at a call site.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.calls.pipeline import DEFAULT_OUTPUT_CAP
from orchestrator.tools.base import DEFAULT_TOOL_TIMEOUT_S

__all__ = ["Limits"]


class Limits(BaseModel):
    """The limits of one session (main agent and subagents together)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(default=100, ge=1)
    """Model requests of the main agent per run before it ends `max_turns`. Default 100."""
    max_concurrency: int = Field(default=10, ge=1, le=64)
    """Concurrency-safe tool calls run at once. Default 10."""
    tool_timeout_s: float = Field(default=DEFAULT_TOOL_TIMEOUT_S, gt=0)
    """Seconds a tool call may run unless the tool sets its own limit. Default 300."""
    max_tool_output_chars: int = Field(default=DEFAULT_OUTPUT_CAP, ge=1_000)
    """Characters of one tool result the model sees; longer ones keep their head and tail.
    Default: the pipeline's cap (`DEFAULT_OUTPUT_CAP`)."""
    max_subagents: int = Field(default=10, ge=0, le=64)
    """Subagents at once; 0 turns `dispatch_agent` off. At most 10 in the local pool, 64 on a
    Ray cluster (`session.build_pool` checks the policy's value against the pool). Default
    10."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """`max_tokens` of each model request (output tokens per response), clamped to the
    model's output limit. Default None: the model's own default
    (`orchestrator.model.catalog.default_max_tokens`: its output limit, at most 32,000)."""
    max_thinking_tokens: int | None = Field(default=None, ge=1024)
    """Extended thinking: the token budget of the model's thinking per response
    (`--max-thinking-tokens`; the API's minimum is 1,024). `max_tokens` is raised above it
    when needed. Default None: no extended thinking."""
    max_concurrent_requests: int = Field(default=10, ge=1)
    """Subagents' model requests streaming at once, across all of them (the broker's shared
    slots); the main agent's request has a slot of its own, so background subagents never
    hold up its turns. Default 10."""
    max_budget_usd: float | None = Field(default=None, gt=0)
    """US dollars the session may spend on the model, subagents included. A request whose
    estimate would pass it is not sent and the run ends `budget_exceeded`. Default None: no
    limit."""
    compact_threshold: float = Field(default=0.8, ge=0.5, le=0.95)
    """Fraction of the context window a request may fill before the conversation is compacted
    (orchestrator/conversation/compaction.py). Default 0.8."""
    context_window: int | None = Field(default=None, ge=1_000)
    """Tokens of the model's context window; None: the model table's (a refusal that names a
    smaller limit still teaches it)."""
    max_stop_hook_blocks: int = Field(default=5, ge=0)
    """Times Stop/SubagentStop hooks may keep one run going; one more block ends it
    `hook_blocked` (exit 6). Default 5."""
    max_output_tokens_total: int | None = Field(default=None, ge=1)
    """Output tokens the session may generate, subagents included (each request reserves its
    `max_output_tokens`). Default None: no limit."""
    max_tasks: int = Field(default=16, ge=0, le=64)
    """Background tasks (agents, shells, monitors) running at once; 0 turns them off
    (orchestrator/tasks/). Default 16."""
    task_output_bytes: int = Field(default=1 << 20, ge=4096)
    """Bytes of output one background shell or monitor keeps. Default 1 MiB."""
    task_time_s: float = Field(default=3600.0, gt=0)
    """Seconds a background task may run before it is stopped. Default 3,600."""
    workflow_agents: int = Field(default=100, ge=1, le=10_000)
    """Agents one workflow run may start (orchestrator/workflows/; answers from a resumed
    run's journal do not count). Default 100."""
    workflow_cpu_s: int = Field(default=60, ge=1)
    """CPU seconds a workflow's script may use in its sandbox (its agents' work is not
    counted: they run elsewhere); past it the script is stopped and the workflow fails.
    Default 60."""
    workflow_memory_mb: int = Field(default=512, ge=64)
    """Megabytes (MiB) of memory a workflow's script may use in its sandbox. Default 512."""
    workflow_time_s: float = Field(default=3600.0, gt=0)
    """Seconds a workflow's script may run, waiting on its agents included, before it is
    stopped and the workflow fails. Default 3,600."""

    @classmethod
    def build(
        cls,
        policy: Mapping[str, int | float],
        overrides: Mapping[str, int | float | None] | None = None,
    ) -> Limits:
        """The policy's `[limits]` values (names as in the policy file), then the command
        line's `overrides` (None: not given), over the defaults. Unknown policy names are
        ignored (the policy schema validated them)."""
        values: dict[str, int | float] = {
            name: value for name, value in policy.items() if name in cls.model_fields
        }
        values.update(
            {name: value for name, value in (overrides or {}).items() if value is not None}
        )
        return cls.model_validate(values)
