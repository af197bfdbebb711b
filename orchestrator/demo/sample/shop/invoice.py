"""Invoices: the text a customer receives."""

from shop.models import Line
from shop.pricing import calc

TAX_RATE = 0.2


def invoice(lines: list[Line]) -> str:
    net = calc(lines)
    return f"net {net:.2f} tax {net * TAX_RATE:.2f} total {net * (1 + TAX_RATE):.2f}"
