"""The Think tool: a place for the model to reason between tool calls, with no effect.

The thought is recorded where every tool call is, in the transcript (the tool_use input), so
the call itself has nothing to do. It is read-only and concurrency-safe, so it never holds up
a batch of parallel calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from pydantic import Field

from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from policies.facts import ToolFacts

__all__ = ["ThinkInput", "ThinkTool"]


class ThinkInput(ToolInput):
    thought: str = Field(description="Your thought.")


class ThinkTool(Tool[ThinkInput]):
    name: ClassVar[str] = "Think"
    facts: ClassVar[ToolFacts] = ToolFacts(family="meta")
    input_model: ClassVar[type[ToolInput]] = ThinkInput
    read_only: ClassVar[bool] = True
    description: ClassVar[str] = """Use this tool to think about something. It does not fetch \
new information or change anything; it only logs the thought.

Use it when complex reasoning helps: after tool results, to check what they mean for the plan; \
before a multi-file change, to list the files and the order of edits; when several approaches \
are possible, to weigh them; when a test fails, to work out the cause before changing code."""

    async def call(
        self, input: ThinkInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        first = input.thought.strip().splitlines()[0][:80] if input.thought.strip() else ""
        yield ToolOutput.text("Your thought has been logged.", summary=first or "(empty thought)")

    def render_use(self, input: ThinkInput) -> str:
        return "Think"
