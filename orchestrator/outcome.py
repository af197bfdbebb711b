"""How a run ends: a closed set of terminal reasons, each with a documented exit code."""

from __future__ import annotations

from typing import Literal, assert_never

__all__ = ["EXIT_IO_ERROR", "EXIT_OUTPUT_TRUNCATED", "EXIT_USAGE", "TerminalReason", "exit_code"]

TerminalReason = Literal[
    "completed",
    "interrupted",
    "max_turns",
    "prompt_too_long",
    "model_error",
    "budget_exceeded",
    "hook_blocked",
    "permission_denied",
    "io_error",
    "output_truncated",
]

EXIT_USAGE = 2
"""Bad command line or configuration, or state that cannot be written at start-up: nothing
ran."""

EXIT_IO_ERROR = 8
"""`io_error`: the transcript, audit log or log could not be written mid-run (a full or
read-only state directory); what ran stays as far as it could be written."""

EXIT_OUTPUT_TRUNCATED = 9
"""`output_truncated`: the model's reply was still cut at its output token limit after the
continuations (a text) or the retry with a higher limit (a tool call); the result holds what
was written (orchestrator/conversation/continuation.py)."""


def exit_code(reason: TerminalReason) -> int:
    """The process exit code for a terminal reason (README "Exit codes" lists them)."""
    match reason:
        case "completed":
            return 0
        case "model_error":
            return 1
        case "max_turns":
            return 3
        case "prompt_too_long":
            return 4
        case "budget_exceeded":
            return 5
        case "hook_blocked":
            return 6
        case "permission_denied":
            return 7
        case "io_error":
            return EXIT_IO_ERROR
        case "output_truncated":
            return EXIT_OUTPUT_TRUNCATED
        case "interrupted":
            return 130
        case _:
            assert_never(reason)
