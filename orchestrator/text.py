"""Small pure text helpers shared by the pipeline and the tools."""

from __future__ import annotations

__all__ = ["duration", "escape_controls", "join_elided", "truncate_middle"]


def _escapes() -> dict[int, str]:
    table = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]}
    table.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})
    invisible = [0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0xFEFF]
    invisible += [*range(0x202A, 0x202F), *range(0x2060, 0x2065), *range(0x2066, 0x206A)]
    table.update({c: f"\\u{c:04x}" for c in invisible})
    return table


_ESCAPES = _escapes()
"""Control characters (C0, DEL, C1) and bidi/invisible format characters, each to a visible
escape. Backslashes are left alone: a command under review must read as it will run."""
_ESCAPES_KEEPING_LINES = {k: v for k, v in _ESCAPES.items() if k not in (0x0A, 0x09)}


def escape_controls(text: str, *, keep_lines: bool = False) -> str:
    """`text` safe to print on a terminal: no character in it can move the cursor, change
    colours, set the title (OSC), erase, reorder what is shown (bidi overrides) or hide
    itself; each such character is shown as `\\xNN` / `\\uNNNN`. `keep_lines` keeps newlines
    and tabs (for multi-line text such as an answer); CR is always escaped.

    For every model-controlled string printed to a terminal: commands, paths, reasons, tool
    summaries (tests/orchestrator/test_text.py and test_terminal_asker.py pin this).
    """
    return text.translate(_ESCAPES_KEEPING_LINES if keep_lines else _ESCAPES)


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


def duration(seconds: float) -> str:
    """A duration as the terminal displays show it: `340 ms`, `4.2 s`, `3m07s`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
