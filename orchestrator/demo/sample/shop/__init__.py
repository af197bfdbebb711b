"""A tiny order-pricing library."""
