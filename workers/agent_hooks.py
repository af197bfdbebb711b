"""A subagent's hooks, as its worker sees them: every one runs in the coordinator.

The worker's pipeline and loop fire hooks as the main agent's do (`ToolPipeline.hooks`, the
loop's SubagentStop), through this `HookRunner` whose per-event methods send a
`workers.protocol.HookAsk` and read the coordinator's `HookReply` back. It only knows the
events the coordinator named in `RunAgent.hook_events`; for the rest it answers at once with
no outcome, without a message. Imported only by a run that has hooks (it pulls in the hooks
layer, which an idle worker does not need).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestrator.calls.plan import CallPlan
from orchestrator.hooks.runner import NO_OUTCOME, HookOutcome, HookRunner
from policies.files import HookEvent
from workers import protocol as wire

__all__ = ["ForwardedHooks", "HookAsker"]

HookAsker = Callable[[wire.HookAsk], Awaitable[wire.HookReply]]
"""Sends an ask (its `id` is replaced by a fresh one) and waits for the reply."""


class ForwardedHooks(HookRunner):
    """The hooks of one subagent run, answered by the coordinator."""

    def __init__(
        self,
        ask: HookAsker,
        *,
        agent_id: str,
        events: list[wire.HookEventName],
        workspace: Path,
    ) -> None:
        super().__init__((), workspace=workspace)
        self._ask = ask
        self._agent_id = agent_id
        self._events: frozenset[str] = frozenset(events)

    def has(self, event: HookEvent) -> bool:
        return event in self._events

    async def pre_tool_use(self, plan: CallPlan, *, agent_id: str | None = None) -> HookOutcome:
        if "PreToolUse" not in self._events:
            return NO_OUTCOME
        return await self._forward(
            event="PreToolUse", tool=plan.block.name, input=_raw(plan), tool_use_id=plan.block.id
        )

    async def post_tool_use(
        self, plan: CallPlan, response: Any, *, agent_id: str | None = None
    ) -> HookOutcome:
        if "PostToolUse" not in self._events:
            return NO_OUTCOME
        return await self._forward(
            event="PostToolUse",
            tool=plan.block.name,
            input=_raw(plan),
            tool_use_id=plan.block.id,
            response=response,
        )

    async def stop(
        self, *, active: bool, agent_id: str | None = None, agent_transcript: str | None = None
    ) -> HookOutcome:
        if "SubagentStop" not in self._events:
            return NO_OUTCOME
        return await self._forward(event="SubagentStop", stop_hook_active=active)

    async def _forward(self, **fields: Any) -> HookOutcome:
        reply = await self._ask(wire.HookAsk(id="", agent=self._agent_id, **fields))
        outcome = HookOutcome(
            blocked=reply.blocked,
            reasons=tuple(reply.reasons),
            permission="deny" if reply.deny else None,
            permission_reason=reply.message,
            updated_input=None if reply.deny else reply.updated_input,
            context=tuple(reply.context),
            stop=reply.stop,
            stop_reason=reply.stop_reason,
            deciders=(reply.rule,) if reply.rule else (),
        )
        if outcome.stop and self.stop_requested is None:
            self.stop_requested = outcome.stop_reason or "A hook stopped the run (continue: false)."
        return outcome


def _raw(plan: CallPlan) -> dict[str, Any]:
    if plan.input is not None:
        return plan.input.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(plan.block.input)
