"""Test-only tools whose behaviour the input dictates: timing, failure, concurrency safety.

They record when each call starts and ends on a shared `ProbeLog`, so tests can check the
executor's ordering rules against the clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import trio

from orchestrator.errors import ToolError
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress


@dataclass
class ProbeLog:
    events: list[tuple[str, str, float]] = field(default_factory=list)
    """(call label, "start" | "end", trio time)."""

    def spans(self) -> dict[str, tuple[float, float]]:
        starts = {label: t for label, kind, t in self.events if kind == "start"}
        ends = {label: t for label, kind, t in self.events if kind == "end"}
        return {label: (starts[label], ends[label]) for label in starts if label in ends}

    def started(self) -> list[str]:
        return [label for label, kind, _ in self.events if kind == "start"]


class ProbeInput(ToolInput):
    label: str
    ms: float = 0
    safe: bool = True
    fail: Literal["raise", "tool_error", "hang", "huge"] | None = None


class ProbeTool(Tool[ProbeInput]):
    name = "Probe"
    input_model = ProbeInput
    description = "A test tool."

    def __init__(self, log: ProbeLog, *, timeout_s: float = 60.0) -> None:
        self.log = log
        self._timeout_s = timeout_s

    def is_read_only(self, input: ProbeInput) -> bool:
        return input.safe

    def timeout_s(self, input: ProbeInput) -> float:
        return self._timeout_s

    async def call(
        self, input: ProbeInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        self.log.events.append((input.label, "start", trio.current_time()))
        try:
            await trio.sleep(input.ms / 1000)
            match input.fail:
                case "raise":
                    raise RuntimeError("probe exploded")
                case "tool_error":
                    raise ToolError(f"probe {input.label} refused")
                case "hang":
                    await trio.sleep_forever()
                case "huge":
                    yield ToolOutput.text("x" * 1_000_000)
                    return
                case None:
                    pass
            yield ToolOutput.text(f"done {input.label}")
        finally:
            self.log.events.append((input.label, "end", trio.current_time()))
