"""Warren's exception tree. Outside errors (SDK, OS) are translated once, at the boundary.

    WarrenError
     +-- ConfigError            bad options or files; .source names the file or flag
     +-- ModelError             a model call failed for good; .reason is the terminal reason
     +-- ToolError              raised by a tool; .message is written for the model
     |    +-- ToolTimeout       the call exceeded its time limit
     +-- SessionError           a transcript that cannot be read or resumed, a bad session id
     +-- TranscriptWriteError   a transcript that cannot be written (full or read-only disk)
     +-- WorkflowError          a workflow script that cannot run (orchestrator.workflows.meta)
     +-- AgentFailedError       a host failing one agent() of a workflow script
                                (orchestrator.workflows.script)

Tool failures never escape the pipeline as exceptions: they become `tool_result`s with
`is_error`. Only `Exception` is ever caught, so trio's `Cancelled` always propagates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

__all__ = [
    "ConfigError",
    "ModelError",
    "ModelFailureReason",
    "SessionError",
    "ToolError",
    "ToolTimeout",
    "TranscriptWriteError",
    "WarrenError",
]


class WarrenError(Exception):
    """Base of every error Warren raises on purpose."""


class ConfigError(WarrenError):
    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(f"{source}: {message}" if source else message)
        self.message = message
        self.source = source


ModelFailureReason = Literal["model_error", "prompt_too_long", "budget_exceeded"]


class ModelError(WarrenError):
    """A model request that failed for good (after retries, or not retryable).

    `reason` is the run's terminal reason; `str(err)` is one sentence for the user.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: ModelFailureReason = "model_error",
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason: ModelFailureReason = reason
        self.status = status


class ToolError(WarrenError):
    """Raised by a tool to refuse or fail a call; `message` goes to the model verbatim."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolTimeout(ToolError):
    pass


class SessionError(WarrenError):
    pass


class TranscriptWriteError(WarrenError):
    """A transcript could not be created or appended to (no space, a read-only or missing
    state directory). `str(err)` is one line for the user; `.path` is the transcript.

    Mid-run it ends the run with the `io_error` terminal reason; at start-up nothing ran.
    """

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
