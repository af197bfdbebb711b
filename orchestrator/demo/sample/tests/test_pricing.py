import unittest

from shop.invoice import invoice
from shop.models import Line
from shop.pricing import order_total


class PricingTest(unittest.TestCase):
    def test_order_total(self) -> None:
        lines = [Line("apple", 3, 0.5), Line("pear", 2, 1.25)]
        self.assertAlmostEqual(order_total(lines), 4.0)

    def test_invoice(self) -> None:
        self.assertEqual(invoice([Line("apple", 2, 5.0)]), "net 10.00 tax 2.00 total 12.00")


if __name__ == "__main__":
    unittest.main()
