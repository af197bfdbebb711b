"""The SendMessage tool: continue a subagent that has finished, with its whole conversation.

`SendMessage(to, message)` (`to`: the agent's id or the name it was dispatched with) runs the
agent again in a fresh worker of its type and write scope: its earlier conversation (its
prompts, turns and tool results, kept by `DispatchAgentTool`) followed by `message`, so it
answers a follow-up with everything it read still in context. Its reply is this call's result;
with `run_in_background` (the default for an agent that ran in the background), the call
returns at once and the reply comes as a `<task-notification>`.

The call is what continuing the agent is: read-only exactly when its type cannot write, and a
writer's call carries its write scope, so the scheduler checks the scope's overlap with the
writers running then, and the change recorder records it as a scoped writer's. A running agent
cannot be sent a message (its report is coming). An agent of an earlier process of a resumed
session is continued from its transcript (orchestrator/agents/recall.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

from pydantic import Field

from orchestrator.agents.dispatch_agent import AgentRun, AgentRunTool, DispatchAgentTool
from orchestrator.agents.recall import AgentRecord
from orchestrator.aio import closing_iter
from orchestrator.errors import ToolError
from orchestrator.tools.base import ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.registry import DISPATCH_AGENT_FACTS
from policies.facts import ToolFacts

__all__ = ["SendMessageInput", "SendMessageTool"]

DESCRIPTION = """\
Sends a follow-up message to a subagent that has finished (one you dispatched earlier in this \
session), by its id or its name. The agent continues with its whole earlier conversation: \
everything it read and found is still in its context, so ask it a follow-up instead of \
dispatching a new agent to read the same files again. Its reply is this call's result. With \
run_in_background (the default when the agent ran in the background), the call returns at \
once and the reply comes as a <task-notification> at your next turn. An agent that is still \
running cannot be sent a message: wait for its report."""


class SendMessageInput(ToolInput):
    to: str = Field(min_length=1, description="The agent's id (agent-...) or its name.")
    message: str = Field(min_length=1, description="What to tell or ask the agent.")
    run_in_background: bool | None = Field(
        default=None,
        description="Return at once; the reply comes as a <task-notification>. Default: "
        "how the agent ran.",
    )


class SendMessageTool(AgentRunTool[SendMessageInput]):
    name: ClassVar[str] = "SendMessage"
    facts: ClassVar[ToolFacts] = DISPATCH_AGENT_FACTS
    input_model: ClassVar[type[ToolInput]] = SendMessageInput
    description: ClassVar[str] = DESCRIPTION

    def __init__(self, dispatch: DispatchAgentTool) -> None:
        """`dispatch`: the session's dispatch_agent, which knows its agents and runs them."""
        self._dispatch = dispatch

    def _record(self, input: SendMessageInput) -> AgentRecord | None:
        return self._dispatch.agent(input.to)

    def _known(self, input: SendMessageInput) -> AgentRecord:
        """The agent `input` is for; `ToolError` when none is (`validate` refused it first)."""
        record = self._record(input)
        if record is None:
            raise ToolError(f"No agent is known by {input.to!r}.")
        return record

    def _background(self, input: SendMessageInput, record: AgentRecord) -> bool:
        return record.background if input.run_in_background is None else input.run_in_background

    def _agent_run(self, input: SendMessageInput) -> AgentRun | None:
        record = self._record(input)
        return None if record is None else AgentRun(record.agent_type, record.write_paths)

    async def validate(self, input: SendMessageInput, ctx: ToolContext) -> str | None:
        record = self._record(input)
        if record is None:
            known = ", ".join(
                r.agent_id + (f" ({r.name})" if r.name else "") for r in self._dispatch.agents()
            )
            return f"No agent is known by {input.to!r}. " + (
                f"This session's agents: {known}." if known else "No agent has run yet."
            )
        return self._dispatch.refuse_continuing(record, self._background(input, record))

    async def call(
        self, input: SendMessageInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        record = self._known(input)
        continued = self._dispatch.continue_agent(
            record, input.message, ctx, background=self._background(input, record)
        )
        async with closing_iter(continued) as items:
            async for item in items:
                yield item

    def render_use(self, input: SendMessageInput) -> str:
        return f"SendMessage({input.to})"
