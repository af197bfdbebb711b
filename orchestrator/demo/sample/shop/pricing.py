"""Prices of order lines and whole orders."""

from shop.models import Line


def line_price(line: Line) -> float:
    return line.unit_price * line.quantity


def calc(lines: list[Line]) -> float:
    """The order total before tax."""
    return sum(line_price(line) for line in lines)
