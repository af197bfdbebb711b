"""The OS floor: bubblewrap sandboxes built from a `SandboxSpec` (see README.md).

The names below are loaded on first use (PEP 562), not when the package is: a pool worker
imports the process room alone (`sandbox.process.orphans`, `sandbox.process.handover`), and
importing the whole floor with it, the probe, the host and the spec models, cost every worker
start tens of milliseconds of CPU (tests/workers/test_worker_imports.py pins that it does not).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.errors import SandboxConfigError, SandboxError, SandboxUnavailable
    from sandbox.host import SandboxHost, detect_host
    from sandbox.launch import RunAs
    from sandbox.probe import FloorCheck, FloorReport, probe_floor
    from sandbox.run import (
        SandboxProcess,
        SandboxResult,
        open_sandboxed_process,
        run_sandboxed,
    )
    from sandbox.spec import (
        Bind,
        EnvPolicy,
        Limits,
        ProtectedPath,
        SandboxSpec,
        WorkspaceRoot,
    )

__all__ = [
    "Bind",
    "EnvPolicy",
    "FloorCheck",
    "FloorReport",
    "Limits",
    "ProtectedPath",
    "RunAs",
    "SandboxConfigError",
    "SandboxError",
    "SandboxHost",
    "SandboxProcess",
    "SandboxResult",
    "SandboxSpec",
    "SandboxUnavailable",
    "WorkspaceRoot",
    "detect_host",
    "open_sandboxed_process",
    "probe_floor",
    "run_sandboxed",
]

_HOME = {
    "Bind": "spec",
    "EnvPolicy": "spec",
    "FloorCheck": "probe",
    "FloorReport": "probe",
    "Limits": "spec",
    "ProtectedPath": "spec",
    "RunAs": "launch",
    "SandboxConfigError": "errors",
    "SandboxError": "errors",
    "SandboxHost": "host",
    "SandboxProcess": "run",
    "SandboxResult": "run",
    "SandboxSpec": "spec",
    "SandboxUnavailable": "errors",
    "WorkspaceRoot": "spec",
    "detect_host": "host",
    "open_sandboxed_process": "run",
    "probe_floor": "probe",
    "run_sandboxed": "run",
}
"""The submodule each public name lives in."""


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandbox.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
