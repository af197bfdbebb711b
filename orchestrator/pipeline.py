"""The per-call pipeline: from a model's `tool_use` block to exactly one `tool_result`.

    unknown tool -> input JSON -> schema -> read-only verdict (the `CallPlan`) ->
    tool.validate -> permission -> ask -> call (under the tool's time limit) -> cap and render

Every failure on that path becomes an `is_error` result whose text tells the model how to fix
the call; nothing here raises into the loop except cancellation. `prepare` makes each call's
`CallPlan` (orchestrator/plan.py) once; the executor, the permission function, the audit
events and the runner read it. Where the call runs is the `ToolRunner` seam, handed the plan:
in-process (`InProcessRunner`) or the sandboxed tool hosts (workers/toolhost_runner.py),
which run a plan in the sandbox it names.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

import pydantic
import trio

from orchestrator.aio import closing_iter
from orchestrator.errors import ToolError
from orchestrator.events import EventSink, PermissionDecided, ToolFinished, ToolStarted
from orchestrator.messages import ToolResultBlock, ToolUseBlock
from orchestrator.permissions import Allow, Ask, Asker, Deny, PermissionFn
from orchestrator.plan import Assessor, CallPlan, PlanDecision, plan_call, tool_assessor
from orchestrator.text import truncate_middle
from orchestrator.tools.base import (
    DEFAULT_TOOL_TIMEOUT_S,
    Tool,
    ToolContext,
    ToolInput,
    ToolOutput,
    ToolProgress,
)
from orchestrator.tools.registry import ToolRegistry

__all__ = [
    "DEFAULT_OUTPUT_CAP",
    "INTERRUPTED_RUNNING",
    "INTERRUPTED_WAITING",
    "InProcessRunner",
    "ToolPipeline",
    "ToolRunner",
]

DEFAULT_OUTPUT_CAP = 100_000
"""Characters of a tool result the model sees; longer output keeps its head and tail."""

INTERRUPTED_RUNNING = (
    "Interrupted: the run was cancelled while this tool call was running. It may have had "
    "partial effects; check the state before repeating it."
)
INTERRUPTED_WAITING = (
    "Interrupted: the run was cancelled before this tool call started. It had no effect."
)


class ToolRunner(Protocol):
    """Where validation and calls execute, as the plan says: the sandboxed tool hosts run a
    plan in the sandbox it names (`plan.sandbox`) or, for a tool that runs in the
    coordinator, here. Runners are handed runnable plans only (`plan.runnable()`)."""

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None: ...

    def call(
        self, plan: CallPlan, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]: ...


class InProcessRunner:
    """Runs tools in this process (tests, and `--sandbox=off`): there is no sandbox to pick."""

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        tool, input = plan.runnable()
        return await tool.validate(input, ctx)

    def call(self, plan: CallPlan, ctx: ToolContext) -> AsyncIterator[ToolProgress | ToolOutput]:
        tool, input = plan.runnable()
        return tool.call(input, ctx)


def _schema_error_text(tool: Tool[Any], exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(input)"
        problems.append(f"- {where}: {err['msg']}")
    expected = ", ".join(
        f"{name}{'' if field.is_required() else '?'}"
        for name, field in ((f.alias or n, f) for n, f in tool.input_model.model_fields.items())
    )
    return (
        f"InputValidationError: {tool.name} was called with invalid input:\n"
        + "\n".join(problems)
        + f"\nExpected parameters: {expected}. Fix the input and call {tool.name} again."
    )


class ToolPipeline:
    """Runs one tool_use through every check to its single tool_result."""

    def __init__(
        self,
        *,
        tools: ToolRegistry,
        ctx: ToolContext,
        permission: PermissionFn,
        asker: Asker,
        runner: ToolRunner | None = None,
        assessor: Assessor | None = None,
        emit: EventSink,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        default_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        self.tools = tools
        self.ctx = ctx
        self.permission = permission
        self.asker = asker
        self.runner: ToolRunner = runner or InProcessRunner()
        self.assessor: Assessor = assessor or tool_assessor
        """Classifies each call once, in `prepare` (the session's: the policy's analyser)."""
        self.emit = emit
        self.output_cap = output_cap
        self.default_timeout_s = default_timeout_s
        """The time limit of a tool that sets none of its own (Bash has its own rule)."""

    def prepare(self, block: ToolUseBlock) -> CallPlan:
        """The call's plan: unknown tool, unparsable JSON and schema checks, then the read-only
        verdict (the one classification of this call). Cheap enough to run while streaming."""
        tool = self.tools.get(block.name)
        if tool is None:
            names = ", ".join(self.tools.names())
            return CallPlan(
                block, None, None, f"No such tool: {block.name}. Available tools: {names}."
            )
        if block.parse_error is not None:
            return CallPlan(
                block,
                tool,
                None,
                f"The input of this {tool.name} call was not valid JSON ({block.parse_error}). "
                f"Call {tool.name} again with a complete JSON object.",
            )
        try:
            parsed = tool.parse_input(block.input)
        except pydantic.ValidationError as exc:
            return CallPlan(block, tool, None, _schema_error_text(tool, exc))
        return plan_call(block, tool, parsed, self.assessor)

    async def execute(self, plan: CallPlan) -> ToolResultBlock:
        """Validation, permission, the call itself, all by `plan`. Returns the call's one
        tool_result.

        **Cancellation:** propagates; the executor fills in the interruption result.
        """
        block = plan.block
        if plan.error is not None or plan.tool is None or plan.input is None:
            return self._error(block, plan.error or "internal error: unprepared call")
        tool = plan.tool
        try:
            refusal = await self.runner.validate(plan, self.ctx)
        except Exception as exc:
            return self._error(block, f"{tool.name} could not validate this call: {exc}")
        if refusal is not None:
            return self._error(block, refusal)

        decided, plan = await self._decide(plan)
        if isinstance(decided, Deny):
            return self._error(block, decided.message)
        if decided.updated_input is not None:
            try:
                rewritten = tool.parse_input(decided.updated_input)
            except pydantic.ValidationError as exc:
                return self._error(block, _schema_error_text(tool, exc))
            # Another input is another call: it gets its own verdict (and so its own sandbox),
            # under the decision that allowed it.
            decision = plan.decision
            plan = plan_call(block, tool, rewritten, self.assessor)
            plan = plan if decision is None else plan.decided(decision)
        return await self._call(plan)

    async def _decide(self, plan: CallPlan) -> tuple[Allow | Deny, CallPlan]:
        tool, input = plan.runnable()
        try:
            result = await self.permission(plan, self.ctx)
        except Exception as exc:
            result = Deny(f"The permission check failed ({exc}); the call was not run.")
        plan = self._audit(plan, result, "policy")
        if isinstance(result, Ask):
            try:
                answer = await self.asker(tool, input, result)
            except Exception as exc:
                answer = Deny(f"Asking for permission failed ({exc}); the call was not run.")
            return answer, self._audit(plan, answer, "asker")
        return result, plan

    def _audit(
        self, plan: CallPlan, result: Allow | Deny | Ask, by: Literal["policy", "asker"]
    ) -> CallPlan:
        """Record the decision in the plan and report it (with the plan's verdict)."""
        message: str | None
        match result:
            case Allow(rule=rule):
                decision: Literal["allow", "deny", "ask"] = "allow"
                message = None
            case Deny(message=message, rule=rule):
                decision = "deny"
            case Ask(reason=message, rule=rule):
                decision = "ask"
        plan = plan.decided(PlanDecision(decision, rule, by, message))
        verdict = plan.verdict
        self.emit(
            PermissionDecided(
                tool_use_id=plan.block.id,
                tool=plan.block.name,
                input=plan.block.input,
                decision=decision,
                rule=rule,
                answered_by=by,
                message=message,
                read_only=None if verdict is None else verdict.read_only,
                read_only_reason=None if verdict is None else verdict.reason,
                sandbox=plan.sandbox,
            )
        )
        return plan

    async def _call(self, plan: CallPlan) -> ToolResultBlock:
        tool, input = plan.runnable()
        block = plan.block
        started = time.monotonic()
        self.emit(ToolStarted(block.id, tool.name, self._render_use(tool, input)))
        output: ToolOutput | None = None
        own = tool.timeout_s(input)
        limit = self.default_timeout_s if own is None else own
        with trio.move_on_after(limit if math.isfinite(limit) else math.inf) as scope:
            try:
                async with closing_iter(self.runner.call(plan, self.ctx)) as events:
                    async for event in events:
                        if isinstance(event, ToolOutput):
                            output = event
                            break
            except ToolError as exc:
                output = ToolOutput(content=exc.message, is_error=True)
            except Exception as exc:
                output = ToolOutput(
                    content=f"{tool.name} failed unexpectedly: {type(exc).__name__}: {exc}. "
                    "This is likely a bug in the tool; try a different approach.",
                    is_error=True,
                )
        if scope.cancelled_caught:
            output = ToolOutput(
                content=f"{tool.name} timed out after {limit:g} s and was stopped. Break the "
                "work into smaller steps or raise the timeout if the tool has one.",
                is_error=True,
            )
        elif output is None:
            output = ToolOutput(content=f"{tool.name} returned no result.", is_error=True)
        summary = self._render_result(tool, output)
        self.emit(
            ToolFinished(block.id, tool.name, summary, output.is_error, time.monotonic() - started)
        )
        return ToolResultBlock(
            tool_use_id=block.id, content=self._capped(output), is_error=output.is_error
        )

    def _capped(self, output: ToolOutput) -> Any:
        content = output.content
        if isinstance(content, str):
            return truncate_middle(content, self.output_cap) if content else "(no output)"
        return [
            b.model_copy(update={"text": truncate_middle(b.text, self.output_cap)})
            if b.type == "text"
            else b
            for b in content
        ]

    @staticmethod
    def _render_use(tool: Tool[Any], input: ToolInput) -> str:
        try:
            return tool.render_use(input)
        except Exception:
            return tool.name

    @staticmethod
    def _render_result(tool: Tool[Any], output: ToolOutput) -> str:
        try:
            return tool.render_result(output)
        except Exception:
            return "(result)"

    def _error(self, block: ToolUseBlock, text: str) -> ToolResultBlock:
        self.emit(ToolFinished(block.id, block.name, text.splitlines()[0][:200], True, 0.0))
        return ToolResultBlock(
            tool_use_id=block.id, content=f"<tool_use_error>{text}</tool_use_error>", is_error=True
        )
