"""The demo's sample repository, generated: a small shop package in three areas (billing,
catalog, shipping) whose code still calls `legacy_round`, which the tests already expect to be
named `round_money`. Generated rather than stored so the demo repository can be as large as
the survey needs, and identical on every run (the demo's script quotes its code)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["AREAS", "CALL_SITES", "generate"]

AREAS = ("billing", "catalog", "shipping")

CALL_SITES = {
    "shop/billing/invoice.py": '''"""Invoices."""

from shop.money import legacy_round

TAX_RATE = 0.2


def invoice_total(amounts: list[float]) -> float:
    return legacy_round(sum(amounts) * (1 + TAX_RATE))
''',
    "shop/billing/refunds.py": '''"""Refunds."""

from shop.money import legacy_round


def refund(paid: float, share: float) -> float:
    return legacy_round(paid * share)
''',
    "shop/catalog/pricing.py": '''"""Catalogue prices."""

from shop.money import legacy_round


def unit_price(base: float, markup: float) -> float:
    return legacy_round(base * (1 + markup))
''',
    "shop/catalog/discounts.py": '''"""Discounts."""

from shop.money import legacy_round


def discounted(price: float, percent: float) -> float:
    return legacy_round(price * (100 - percent) / 100)
''',
    "shop/shipping/rates.py": '''"""Shipping rates."""

from shop.money import legacy_round

PER_KG = 1.15


def shipping_cost(weight_kg: float) -> float:
    return legacy_round(weight_kg * PER_KG)
''',
}

_FIXED = {
    "README.md": "# shop\n\nA small shop library. Run the tests with `python -m unittest`.\n",
    "shop/__init__.py": '"""A small shop library."""\n',
    "shop/money.py": '''"""Money helpers."""


def legacy_round(amount: float) -> float:
    """Round to cents, halves away from zero."""
    cents = int(abs(amount) * 100 + 0.5)
    return (cents if amount >= 0 else -cents) / 100
''',
    "tests/__init__.py": "",
    "tests/test_shop.py": """import unittest

from shop.billing.invoice import invoice_total
from shop.billing.refunds import refund
from shop.catalog.discounts import discounted
from shop.catalog.pricing import unit_price
from shop.money import round_money
from shop.shipping.rates import shipping_cost


class ShopTest(unittest.TestCase):
    def test_round_money(self) -> None:
        self.assertEqual(round_money(2.125), 2.13)
        self.assertEqual(round_money(-1.125), -1.13)

    def test_billing(self) -> None:
        self.assertEqual(invoice_total([10.0, 5.0]), 18.0)
        self.assertEqual(refund(9.99, 0.5), 5.0)

    def test_catalog(self) -> None:
        self.assertEqual(unit_price(10.0, 0.25), 12.5)
        self.assertEqual(discounted(80.0, 12.5), 70.0)

    def test_shipping(self) -> None:
        self.assertEqual(shipping_cost(3.0), 3.45)


if __name__ == "__main__":
    unittest.main()
""",
}

_FILLER_PER_AREA = 12


def _filler(area: str, index: int) -> str:
    return (
        f'"""{area.title()} helper {index}: unrelated to money rounding."""\n\n\n'
        f"def {area}_step_{index}(values: list[int]) -> list[int]:\n"
        f"    return [value * {index + 2} for value in values if value % {index + 2}]\n"
    )


def generate(root: Path) -> Path:
    """Write the repository under `root` (which must not exist yet) and return it."""
    root.mkdir(parents=True)
    files = dict(_FIXED)
    files.update(CALL_SITES)
    for area in AREAS:
        files[f"shop/{area}/__init__.py"] = f'"""The {area} area."""\n'
        for index in range(_FILLER_PER_AREA):
            files[f"shop/{area}/step_{index:02d}.py"] = _filler(area, index)
    for relative, text in sorted(files.items()):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
