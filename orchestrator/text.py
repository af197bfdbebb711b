"""Small pure text helpers shared by the pipeline and the tools."""

from __future__ import annotations

__all__ = ["truncate_middle"]


def truncate_middle(text: str, limit: int, *, what: str = "characters") -> str:
    """Keep the head and tail of `text` within `limit` characters, noting what was cut.

    The note says how much was removed so the model can ask for the middle another way
    (tests/orchestrator/test_text.py pins the exact shape).
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    removed = len(text) - head - tail
    removed_lines = text.count("\n", head, len(text) - tail)
    return (
        f"{text[:head]}\n\n[... {removed} {what} ({removed_lines} lines) removed from the "
        f"middle of this output ...]\n\n{text[len(text) - tail :]}"
    )
