"""The session's hooks, fired for one subagent's calls and its end, on the coordinator's side.

A subagent runs in a worker process, which is less trusted than the coordinator (model-chosen
code runs next to it), so its hooks run here, with the session's `HookRunner`: the worker
asks over the wire (`workers.protocol.HookAsk`, only for `events`), the pool hands the ask to
`AgentHooks`, and the hook input carries the subagent's `agent_id` (and its HookRan events
too). A matcher sees the call as the main agent's would be seen: planned with the session's
tool and assessor, so `Bash(git push:*)` matches inside a subagent exactly as outside.

A PreToolUse hook's `deny` and `updatedInput` are acted on in the worker's pipeline (the
changed input is parsed, validated and decided again there); its `allow`/`ask` is kept here
and applied by the coordinator's permission answer for that call (`take_verdict`), where the
policy decides: `ask` turns an allow into an ask, `allow` answers an ask, and a deny stays a
deny. A call whose PreToolUse hooks were never asked is refused, so a worker that skips them
gains nothing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pydantic

from orchestrator.agents.types import SubagentHookEvent
from orchestrator.calls.plan import Assessor, CallPlan, plan_call
from orchestrator.hooks.output import PermissionVerdict
from orchestrator.hooks.runner import HookOutcome, HookRunner
from orchestrator.messages import ToolUseBlock
from orchestrator.tools.registry import ToolRegistry

__all__ = ["SUBAGENT_EVENTS", "AgentHooks"]

SUBAGENT_EVENTS: tuple[SubagentHookEvent, ...] = ("PreToolUse", "PostToolUse", "SubagentStop")


class AgentHooks:
    """One subagent's hooks (`orchestrator.agents.types.SubagentHooks`)."""

    def __init__(
        self,
        runner: HookRunner,
        *,
        agent_id: str,
        tools: ToolRegistry,
        assessor: Assessor,
        max_stop_blocks: int,
        transcript: str | None = None,
    ) -> None:
        """`tools`: the session's tools that the agent's type may use (to plan its calls).
        `transcript`: the agent's sidechain transcript (SubagentStop's
        `agent_transcript_path`)."""
        self._runner = runner
        self._agent_id = agent_id
        self._tools = tools
        self._assessor = assessor
        self._max_stop_blocks = max_stop_blocks
        self._transcript = transcript
        self._events = frozenset(e for e in SUBAGENT_EVENTS if runner.has(e))
        self._verdicts: defaultdict[str, list[PermissionVerdict | None]] = defaultdict(list)
        """PreToolUse verdicts not yet used, by call (`_key`): one per asked call."""

    @property
    def events(self) -> frozenset[SubagentHookEvent]:
        return self._events

    @property
    def max_stop_blocks(self) -> int:
        return self._max_stop_blocks

    async def pre_tool_use(self, tool: str, input: dict[str, Any], tool_use_id: str) -> HookOutcome:
        plan = self._plan(tool, input, tool_use_id)
        outcome = await self._runner.pre_tool_use(plan, agent_id=self._agent_id)
        if outcome.permission != "deny":
            final = input if outcome.updated_input is None else outcome.updated_input
            if (key := self._key(tool, final)) is not None:
                self._verdicts[key].append(outcome.permission)
        return outcome

    async def post_tool_use(
        self, tool: str, input: dict[str, Any], tool_use_id: str, response: Any
    ) -> HookOutcome:
        plan = self._plan(tool, input, tool_use_id)
        return await self._runner.post_tool_use(plan, response, agent_id=self._agent_id)

    async def subagent_stop(self, *, active: bool) -> HookOutcome:
        return await self._runner.stop(
            active=active, agent_id=self._agent_id, agent_transcript=self._transcript
        )

    def take_verdict(
        self, tool: str, input: dict[str, Any]
    ) -> tuple[bool, PermissionVerdict | None]:
        """For the permission answer of a call: whether its PreToolUse hooks were asked (always
        True when the session has none), and their allow/ask. Each verdict serves one call."""
        if "PreToolUse" not in self._events:
            return True, None
        key = self._key(tool, input)
        pending = self._verdicts.get(key or "")
        if not pending:
            return False, None
        verdict = pending.pop(0)
        if not pending:
            del self._verdicts[key or ""]
        return True, verdict

    def _plan(self, name: str, raw: dict[str, Any], tool_use_id: str) -> CallPlan:
        """The call as the pipeline would plan it (a tool the agent lacks, or an input that
        does not parse, is matched by name only)."""
        block = ToolUseBlock(id=tool_use_id or f"{self._agent_id}:{name}", name=name, input=raw)
        tool = self._tools.get(name)
        if tool is None:
            return CallPlan(block, None, None, f"{name} is not one of this agent's tools.")
        try:
            parsed = tool.parse_input(raw)
        except pydantic.ValidationError:
            return CallPlan(block, tool, None, f"The input of this {name} call is invalid.")
        return plan_call(block, tool, parsed, self._assessor)

    def _key(self, name: str, raw: dict[str, Any]) -> str | None:
        """One call's identity: the tool and its parsed input, dumped as the worker's
        permission ask sends it (None when it does not parse: no call to allow)."""
        tool = self._tools.get(name)
        if tool is None:
            return None
        try:
            parsed = tool.parse_input(raw)
        except pydantic.ValidationError:
            return None
        dumped = parsed.model_dump(mode="json", by_alias=True)
        return name + "\0" + json.dumps(dumped, sort_keys=True, default=str)
