"""The sandbox package's own exception tree (it imports nothing of Warren's, not even errors).

    SandboxError
     +-- SandboxUnavailable   no usable bwrap (missing, too old, setuid, inside a workspace)
     +-- SandboxConfigError   a spec that contradicts itself or the host (names both sides)

A sandboxed command that fails, times out or hits a limit is not an exception: it is a
`SandboxResult`. These errors mean the sandbox could not be built at all. Callers above the
sandbox package translate them once, at their boundary.
"""

from __future__ import annotations

__all__ = ["SandboxConfigError", "SandboxError", "SandboxUnavailable"]


class SandboxError(Exception):
    """Base of every error the sandbox package raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxUnavailable(SandboxError):
    """No bwrap we are willing to run. `tried` lists each candidate and why it was refused."""

    def __init__(self, message: str, *, tried: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tried = tried


class SandboxConfigError(SandboxError):
    """A spec that cannot be honoured; `fields` names the spec fields (or host paths) involved."""

    def __init__(self, message: str, *, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = fields
