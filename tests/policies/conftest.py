"""The sandbox fixtures (the detected host, scratch space under /var/tmp), shared with the
policy tests that prove an attack is real by running it in a sandbox."""

from tests.sandbox.conftest import host, scratch, scratch_root

__all__ = ["host", "scratch", "scratch_root"]
