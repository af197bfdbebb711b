"""What Warren knows about each model: its context window (input plus output tokens one request
may hold), so the loop can tell how full the conversation is and compact before the API
refuses it (`orchestrator.compaction`).

Matched by longest prefix like `pricing.py` and `output_limits.py`, so dated ids
(`claude-sonnet-4-5-20250929`) share a row. A model the table does not know gets
`DEFAULT_CONTEXT_WINDOW`; `[limits] context_window` overrides the table, and a refusal that
names the limit ("N tokens > M maximum") teaches the session M.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFAULT_CONTEXT_WINDOW", "context_window"]

DEFAULT_CONTEXT_WINDOW = 200_000
"""Tokens assumed for a model the table does not know (every current Claude model has at
least this; a smaller real window is learnt from the first refusal)."""

_CONTEXT_WINDOWS: Mapping[str, int] = {
    "claude-opus-4": 200_000,
    "claude-4-opus": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-4-sonnet": 200_000,
    "claude-haiku-4": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-3-5-sonnet": 200_000,
    "claude-3-5-haiku": 200_000,
    "claude-3-opus": 200_000,
    "claude-3-sonnet": 200_000,
    "claude-3-haiku": 200_000,
}


def context_window(model: str) -> int:
    """The context window of `model` in tokens (longest matching prefix, else the default)."""
    best: str | None = None
    for prefix in _CONTEXT_WINDOWS:
        if model.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return DEFAULT_CONTEXT_WINDOW if best is None else _CONTEXT_WINDOWS[best]
