"""`needs_sandbox`: skip a test module where the sandbox cannot run. Proven once per test
process with a real bwrap `true`, however many modules ask."""

from __future__ import annotations

import pytest
import trio

from sandbox.errors import SandboxError
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec

__all__ = ["needs_sandbox", "sandbox_works"]


def sandbox_works() -> bool:
    try:
        return trio.run(run_sandboxed, SandboxSpec(), ["true"]).ok
    except (SandboxError, OSError):
        return False


needs_sandbox = pytest.mark.skipif(not sandbox_works(), reason="the sandbox cannot run here")
