"""Rows in aligned columns for the live areas (the REPL's subagent panel, `-p` progress).

A live area is redrawn ten times a second in the coordinator's trio thread, the thread that
forwards every subagent's model requests. `rich.table.Table` measures and wraps every cell
on every draw, and even a `Text` is divided and wrapped line by line: milliseconds for ten
subagent rows, time the loop would wait. `Columns` lays its cells out by character count
once and hands rich its segments as they are (cells are cut, never wrapped), a fraction of
that (tests/bench/bench_repl.py, (c)).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions
from rich.segment import Segment
from rich.style import Style

__all__ = ["Cell", "Columns"]

Cell = str | tuple[str, str]
"""A cell's text, or its text and a rich style. Cells hold no wide characters (escaped names
and numbers), so a character is a column."""


@dataclass(frozen=True)
class Columns:
    """`header` (dim; none when empty) over `rows`, columns left-aligned one space apart, each
    line cut to the console's width."""

    header: Sequence[str]
    rows: Sequence[Sequence[Cell]]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        width = options.max_width
        rows = [[(c, "") if isinstance(c, str) else c for c in row] for row in self.rows]
        widths = [len(name) for name in self.header] or [0] * max(map(len, rows), default=0)
        for row in rows:
            for index, (text, _) in enumerate(row):
                widths[index] = max(widths[index], len(text))
        if self.header:
            header = " ".join(n.ljust(w) for n, w in zip(self.header, widths, strict=True))
            yield Segment(header.rstrip()[:width], Style(dim=True))
            yield Segment.line()
        styles: dict[str, Style] = {}
        for row in rows:
            used = 0
            last = len(row) - 1
            for index, (text, style) in enumerate(row):
                shown = text if index == last else text.ljust(widths[index]) + " "
                shown = shown[: max(0, width - used)]
                if shown:
                    if style and style not in styles:
                        styles[style] = console.get_style(style)
                    yield Segment(shown, styles.get(style))
                used += len(shown)
            yield Segment.line()
