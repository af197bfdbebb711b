"""Small pure text helpers shared by the pipeline and the tools."""

from __future__ import annotations

__all__ = ["join_elided", "truncate_middle"]


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
    return join_elided(text[:head], text[len(text) - tail :], removed, removed_lines, what=what)


def join_elided(
    head: str, tail: str, removed: int, removed_lines: int, *, what: str = "characters"
) -> str:
    """`head` and `tail` around the note `truncate_middle` leaves where it cut.

    For producers that drop the middle themselves and never hold the whole text (the shell
    keeps only a bounded head and tail of a command's output), so the model sees one shape.
    """
    return (
        f"{head}\n\n[... {removed} {what} ({removed_lines} lines) removed from the "
        f"middle of this output ...]\n\n{tail}"
    )
