"""A workflow's agents as ordinary subagents: each `agent()` call is a `dispatch_agent` call
through the session's own `ToolPipeline`, so it is planned, hooked (PreToolUse, PostToolUse,
SubagentStop), decided by the session's policy (an ask goes to the session's asker, denied
headless), audited, run in a pool worker under the floor (local or `--pool ray`), and a writer's
changes are recorded for `warren undo`: a workflow can do nothing a model's own `dispatch_agent`
call could not.

The call's id is the run's and the position's (`toolu_wf_<run>_<key>`), so its audit line, its
sidechain transcript and stream-json's `parent_tool_use_id` name the workflow call it served.
The outcome comes back from `DispatchAgentTool.take_outcome` (the final text, or the object a
schema asked for, checked by the `StructuredOutput` tool), not parsed from the result's text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.messages import ToolUseBlock
from orchestrator.workflows.engine import AgentPlan
from orchestrator.workflows.journal import AgentAnswer
from orchestrator.workflows.script import AgentCall
from policies.claude_names import SUBAGENT_TOOL

if TYPE_CHECKING:
    from orchestrator.agents.dispatch_agent import DispatchAgentTool
    from orchestrator.calls.pipeline import ToolPipeline

__all__ = ["PipelineAgents", "dispatch_input"]


def dispatch_input(call: AgentCall, workflow: str) -> dict[str, Any]:
    """The `dispatch_agent` input of one workflow call."""
    value: dict[str, Any] = {
        "description": (call.label or f"{workflow} agent {call.key}")[:80],
        "prompt": call.prompt,
        "subagent_type": call.type or "general",
    }
    if call.write_paths is not None:
        value["write_paths"] = list(call.write_paths)
    if call.model is not None:
        value["model"] = call.model
    if call.schema is not None:
        value["output_schema"] = call.schema
    return value


class PipelineAgents:
    """`AgentRunner` over the session's pipeline and its `dispatch_agent`."""

    def __init__(self, pipeline: ToolPipeline, dispatch: DispatchAgentTool, workflow: str) -> None:
        self._pipeline = pipeline
        self._dispatch = dispatch
        self._workflow = workflow

    def _block(self, call: AgentCall, call_id: str) -> ToolUseBlock:
        return ToolUseBlock(
            id=call_id, name=SUBAGENT_TOOL, input=dispatch_input(call, self._workflow)
        )

    def plan(self, call: AgentCall, call_id: str) -> AgentPlan:
        """The call's `CallPlan`, made once (its one classification): its scope decides
        what it waits for, and the same plan runs."""
        prepared = self._pipeline.prepare(self._block(call, call_id))
        if prepared.sandbox == "ro":
            return AgentPlan(call, call_id, "ro", prepared)
        return AgentPlan(call, call_id, prepared.write_scope, prepared)

    async def run(self, plan: AgentPlan) -> AgentAnswer:
        call_id = plan.call_id
        result = await self._pipeline.execute(plan.prepared)
        outcome = self._dispatch.take_outcome(call_id)
        if outcome is None:  # refused before it ran: denied, invalid, a hook's no
            return AgentAnswer(False, reason=result.text() or "the agent did not run", final=False)
        tokens = outcome.usage.input_tokens + outcome.usage.output_tokens
        if result.is_error or outcome.failed is not None:
            return AgentAnswer(
                False,
                reason=outcome.failed or result.text(),
                agent_id=outcome.agent_id,
                tokens=tokens,
                cost_usd=outcome.cost_usd or 0.0,
                # It ran to its end and still failed (its output never fit its schema):
                # for good. Anything else (a limit, the budget, a lost worker) may pass.
                final=outcome.reason == "completed",
            )
        value = outcome.value if outcome.has_value else outcome.text
        cost = outcome.cost_usd or 0.0
        return AgentAnswer(True, value, agent_id=outcome.agent_id, tokens=tokens, cost_usd=cost)
