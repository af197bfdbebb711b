"""The OS floor: bubblewrap sandboxes built from a `SandboxSpec` (see README.md)."""

from sandbox.errors import SandboxConfigError, SandboxError, SandboxUnavailable
from sandbox.host import SandboxHost, detect_host
from sandbox.probe import FloorCheck, FloorReport, probe_floor
from sandbox.run import (
    RunAs,
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
