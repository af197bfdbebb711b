"""The per-call pipeline: from a model's `tool_use` block to exactly one `tool_result`.

    unknown tool -> input JSON -> schema -> read-only verdict (the `CallPlan`) ->
    tool.validate -> PreToolUse hooks -> permission -> ask -> call (under the tool's time
    limit) -> cap and render -> PostToolUse hooks

Where validation costs a trip of its own (a tool host: `ToolRunner.merged_checks`) and no
PreToolUse hook is set, the policy's decision is taken first, without being reported; when it
allows the call as it is, validation travels with the call (`call(validate=True)`, one trip
instead of two) and the decision is reported once the runner says the call is valid. Any other
decision takes the order above, so nobody is asked about a call that is not valid.

Every failure on that path becomes an `is_error` result whose text tells the model how to fix
the call; nothing here raises into the loop except cancellation. `prepare` makes each call's
`CallPlan` (orchestrator/calls/plan.py) once; the executor, the permission function, the audit
events and the runner read it. Where the call runs is the `ToolRunner` seam, handed the plan:
in-process (`InProcessRunner`) or the sandboxed tool hosts (workers/toolhost_runner.py),
which run a plan in the sandbox it names.

Hooks (orchestrator/hooks) may narrow a decision, never widen it past a deny rule or the
floor: a PreToolUse block or `deny` ends the call; `ask` turns the policy's allow into an ask;
`allow` answers an ask (a deny stays a deny); an `updatedInput` is another call, parsed,
planned, validated and decided again. The session's `HookRunner` lives here because every
place that fires hooks (the loop's Stop, the compactor, the session) already holds the
pipeline.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pydantic
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.permissions import Allow, Ask, Asker, Deny, PermissionFn
from orchestrator.calls.plan import (
    Assessor,
    CallPlan,
    PlanDecision,
    Verdict,
    plan_call,
    tool_assessor,
)
from orchestrator.errors import ToolError
from orchestrator.events import EventSink, PermissionDecided, ToolFinished, ToolStarted
from orchestrator.messages import TextBlock, ToolResultBlock, ToolUseBlock
from orchestrator.text import truncate_middle
from orchestrator.tools.base import (
    DEFAULT_TOOL_TIMEOUT_S,
    Checked,
    Tool,
    ToolContext,
    ToolInput,
    ToolOutput,
    ToolProgress,
    running_for,
)
from orchestrator.tools.registry import ToolRegistry

if TYPE_CHECKING:  # a worker's pipeline has no hooks: it does not import them
    from orchestrator.hooks.output import PermissionVerdict
    from orchestrator.hooks.runner import HookOutcome, HookRunner

__all__ = [
    "DEFAULT_OUTPUT_CAP",
    "INTERRUPTED_RUNNING",
    "INTERRUPTED_WAITING",
    "REJECTED_EARLIER",
    "InProcessRunner",
    "RunnerLayer",
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
REJECTED_EARLIER = (
    "Not run: the user rejected an earlier tool call in this batch, so the calls queued after "
    "it were stopped. It had no effect. Wait for the user's direction before retrying."
)


_SCOPE_CHANGED = (
    "The write scope of this call was changed after it was scheduled (by a hook or the "
    "permission answer); other writers may be running beside it, so it was not run. Call it "
    "again with the write_paths you mean."
)
"""A scoped writer was scheduled beside others by its scope: a rewrite may not change it."""


class ToolRunner(Protocol):
    """Where validation and calls execute, as the plan says: the sandboxed tool hosts run a
    plan in the sandbox it names (`plan.sandbox`) or, for a tool that runs in the
    coordinator, here. Runners are handed runnable plans only (`plan.runnable()`)."""

    @property
    def merged_checks(self) -> bool:
        """Whether `validate` costs a trip of its own that `call(validate=True)` saves."""
        ...

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None: ...

    def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        """The call's progress, then one output. With `validate`, `validate` runs first and
        its answer comes first (`Checked`): a refusal ends the call there."""
        ...


class RunnerLayer:
    """A `ToolRunner` layered over another, `inner`, that every call goes through: its checks
    are `inner`'s (merged when `inner`'s are); a layer changes what happens around the calls
    it cares about (`RecordingRunner` records writers, `BackgroundShells` starts background
    commands as tasks) and passes the rest on with `inner_call`."""

    def __init__(self, inner: ToolRunner) -> None:
        self.inner = inner

    @property
    def merged_checks(self) -> bool:
        return bool(getattr(self.inner, "merged_checks", False))

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        result: str | None = await self.inner.validate(plan, ctx)
        return result

    def inner_call(
        self, plan: CallPlan, ctx: ToolContext, validate: bool
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        """`plan` run by `inner`, validated first when `validate` says so."""
        if validate:
            return self.inner.call(plan, ctx, validate=True)
        return self.inner.call(plan, ctx)


class InProcessRunner:
    """Runs tools in this process (tests, and `--sandbox=off`): there is no sandbox to pick."""

    merged_checks = False

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        tool, input = plan.runnable()
        return await tool.validate(input, ctx)

    async def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        tool, input = plan.runnable()
        if validate:
            refusal = await self.validate(plan, ctx)
            yield Checked(refusal)
            if refusal is not None:
                return
        async with closing_iter(tool.call(input, ctx)) as items:
            async for item in items:
                yield item


def _schema_error_text(tool: Tool[Any], exc: pydantic.ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(input)"
        problems.append(f"- {where}: {err['msg']}")
    shown = tool.input_schema().get("properties", {})  # what the model was told of
    expected = ", ".join(
        f"{name}{'' if field.is_required() else '?'}"
        for name, field in ((f.alias or n, f) for n, f in tool.input_model.model_fields.items())
        if name in shown
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
        hooks: HookRunner | None = None,
        recheck_rewrites: bool = True,
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
        self.hooks = hooks
        """The session's hooks; None: no hook code path at all (tests, benchmarks)."""
        self.recheck_rewrites = recheck_rewrites
        """Whether an input rewritten by whoever allowed it is decided by `permission` again
        (deny rules win). False where `permission`'s answer is final and was checked so
        already: a subagent's, which the coordinator decides (`DispatchAgentTool`)."""

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
        return plan_call(block, tool, parsed, self.assessor, workspace=self.ctx.workspace)

    async def execute(
        self, plan: CallPlan, *, on_rejected: Callable[[], None] | None = None
    ) -> ToolResultBlock:
        """Validation, permission, the call itself, all by `plan`. Returns the call's one
        tool_result. `on_rejected` is called when the user rejects the call at a prompt (the
        executor then stops the calls queued after it).

        **Cancellation:** propagates; the executor fills in the interruption result.
        """
        block = plan.block
        if plan.error is not None or plan.tool is None or plan.input is None:
            return self._error(block, plan.error or "internal error: unprepared call")
        tool = plan.tool
        hooks = self.hooks
        early: Allow | Deny | Ask | None = None
        if getattr(self.runner, "merged_checks", False) and not (
            hooks is not None and hooks.has("PreToolUse")
        ):
            early = await self._policy(plan)
            if isinstance(early, Allow) and early.updated_input is None:
                result, ran = await self._call(plan, allowed=early)
                if ran and hooks is not None and hooks.has("PostToolUse"):
                    result = _with_feedback(result, await hooks.post_tool_use(plan, result.content))
                return result
        refusal = await self._refusal(plan, tool)
        if refusal is not None:
            return self._error(block, refusal)

        verdict: PermissionVerdict | None = None
        if hooks is not None and hooks.has("PreToolUse"):
            outcome = await hooks.pre_tool_use(plan)
            verdict = outcome.permission
            if verdict == "deny":
                message = _hook_denial(tool.name, outcome)
                self._audit(plan, Deny(message, rule=_hook_rule(outcome)), "hook")
                return self._error(block, message)
            if outcome.updated_input is not None:
                try:
                    changed = tool.parse_input(outcome.updated_input)
                except pydantic.ValidationError as exc:
                    return self._error(
                        block,
                        "A PreToolUse hook changed the input: " + (_schema_error_text(tool, exc)),
                    )
                scheduled = plan.write_scope
                plan = plan_call(block, tool, changed, self.assessor, workspace=self.ctx.workspace)
                if scheduled is not None and plan.write_scope != scheduled:
                    return self._error(block, _SCOPE_CHANGED)
                refusal = await self._refusal(plan, tool)
                if refusal is not None:
                    return self._error(block, refusal)

        decided, plan = await self._decide(plan, verdict, early)
        if isinstance(decided, Deny):
            if decided.by_user and on_rejected is not None:
                on_rejected()
            return self._error(block, decided.message)
        if decided.updated_input is not None:
            try:
                rewritten = tool.parse_input(decided.updated_input)
            except pydantic.ValidationError as exc:
                return self._error(block, _schema_error_text(tool, exc))
            # Another input is another call: it gets its own verdict (and so its own sandbox),
            # under the decision that allowed it; but whoever rewrote it (a dialog, an SDK
            # host's `updatedInput`) cannot take it past a deny rule: the policy sees it again
            # (tests/orchestrator/test_sdk_control.py).
            decision, original, scheduled = plan.decision, plan.input, plan.write_scope
            plan = plan_call(block, tool, rewritten, self.assessor, workspace=self.ctx.workspace)
            if scheduled is not None and plan.write_scope != scheduled:
                return self._error(block, _SCOPE_CHANGED)
            plan = plan if decision is None else plan.decided(decision)
            if rewritten != original and self.recheck_rewrites:
                again = await self._policy(plan)
                if isinstance(again, Deny):
                    self._audit(plan, again, "policy")
                    return self._error(block, again.message)
        result, _ = await self._call(plan)
        if hooks is not None and hooks.has("PostToolUse"):
            result = _with_feedback(result, await hooks.post_tool_use(plan, result.content))
        return result

    async def run_typed(self, block: ToolUseBlock) -> ToolResultBlock:
        """A call the user typed (the REPL's `!command`): it runs as one that may write (the
        read-write host, the persistent shell), the policy's denials apply, and nothing asks:
        the user has just said what to run.

        **Cancellation:** propagates (the caller shows the interruption).
        """
        plan = self.prepare(block)
        if plan.error is not None or plan.tool is None or plan.input is None:
            return self._error(block, plan.error or "internal error: unprepared call")
        tool = plan.tool
        detail = None if plan.verdict is None else plan.verdict.detail
        plan = replace(plan, verdict=Verdict(False, "typed by the user", False, detail))
        refusal = await self._refusal(plan, tool)
        if refusal is not None:
            return self._error(block, refusal)
        try:
            result = await self.permission(plan, self.ctx)
        except Exception as exc:
            result = Deny(f"The permission check failed ({exc}); the command was not run.")
        plan = self._audit(plan, result, "policy")
        if isinstance(result, Deny):
            return self._error(block, result.message)
        if isinstance(result, Ask):
            plan = self._audit(plan, Allow(rule="typed by the user"), "asker")
        done, _ = await self._call(plan)
        return done

    async def _refusal(self, plan: CallPlan, tool: Tool[Any]) -> str | None:
        """The tool's validation of the call: its refusal for the model, or None; a validation
        that raises refuses the call with what it raised."""
        try:
            return await self.runner.validate(plan, self.ctx)
        except Exception as exc:
            return f"{tool.name} could not validate this call: {exc}"

    async def _policy(self, plan: CallPlan) -> Allow | Deny | Ask:
        """The permission function's decision (a failure denies), not reported."""
        try:
            return await self.permission(plan, self.ctx)
        except Exception as exc:
            return Deny(f"The permission check failed ({exc}); the call was not run.")

    async def _decide(
        self,
        plan: CallPlan,
        hook: PermissionVerdict | None = None,
        early: Allow | Deny | Ask | None = None,
    ) -> tuple[Allow | Deny, CallPlan]:
        """The policy's decision (`early`: taken before validation, of this same plan),
        narrowed by a PreToolUse hook's `ask`, or an ask answered by its `allow` (never past
        a deny)."""
        tool, input = plan.runnable()
        result = early if early is not None else await self._policy(plan)
        plan = self._audit(plan, result, "policy")
        if hook == "ask" and isinstance(result, Allow):
            result = Ask("A PreToolUse hook asks for confirmation.", rule="PreToolUse hook")
            plan = self._audit(plan, result, "hook")
        elif hook == "allow" and isinstance(result, Ask):
            allowed = Allow(rule="PreToolUse hook: allow")
            return allowed, self._audit(plan, allowed, "hook")
        if isinstance(result, Ask):
            try:
                with running_for(plan.block.id):  # an SDK host is told which call it decides
                    answer = await self.asker(tool, input, result)
            except Exception as exc:
                answer = Deny(f"Asking for permission failed ({exc}); the call was not run.")
            return answer, self._audit(plan, answer, "asker")
        return result, plan

    def _audit(
        self,
        plan: CallPlan,
        result: Allow | Deny | Ask,
        by: Literal["policy", "asker", "hook"],
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

    async def _call(
        self, plan: CallPlan, *, allowed: Allow | None = None
    ) -> tuple[ToolResultBlock, bool]:
        """The call's result, and whether it ran.

        `allowed`: the policy's decision, not reported yet; the runner validates the call
        first, and the decision and the start are reported once it is valid. A refusal is
        the result then, as when validation runs on its own, and the call did not run.
        """
        tool, input = plan.runnable()
        block = plan.block
        started = time.monotonic()
        checking = allowed is not None
        if not checking:
            self.emit(ToolStarted(block.id, tool.name, self._render_use(tool, input)))
        output: ToolOutput | None = None
        own = tool.timeout_s(input)
        limit = self.default_timeout_s if own is None else own
        deadline = trio.move_on_after(limit if math.isfinite(limit) else math.inf)
        with deadline as scope, running_for(block.id):
            try:
                calling = (
                    self.runner.call(plan, self.ctx, validate=True)
                    if checking
                    else self.runner.call(plan, self.ctx)
                )
                async with closing_iter(calling) as events:
                    async for event in events:
                        if checking:
                            checking = False
                            if isinstance(event, Checked) and event.refusal is not None:
                                return self._error(block, event.refusal), False
                            assert allowed is not None
                            plan = self._audit(plan, allowed, "policy")
                            started = time.monotonic()
                            self.emit(
                                ToolStarted(block.id, tool.name, self._render_use(tool, input))
                            )
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
        if checking:  # no word from the runner at all (timed out, or it failed at once)
            assert allowed is not None
            self._audit(plan, allowed, "policy")
            self.emit(ToolStarted(block.id, tool.name, self._render_use(tool, input)))
        summary = self._render_result(tool, output)
        self.emit(
            ToolFinished(block.id, tool.name, summary, output.is_error, time.monotonic() - started)
        )
        result = ToolResultBlock(
            tool_use_id=block.id, content=self._capped(output), is_error=output.is_error
        )
        return result, True

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


def _hook_rule(outcome: HookOutcome) -> str:
    return "PreToolUse hook " + " ".join(outcome.deciders)


def _hook_denial(tool: str, outcome: HookOutcome) -> str:
    """The tool_result of a call a PreToolUse hook stopped: each blocking hook's stderr or
    reason, as Claude Code reports it."""
    if outcome.reasons:
        return f"{tool} operation blocked by hook:\n" + "\n".join(
            f"- {reason}" for reason in outcome.reasons
        )
    return f"{tool} operation denied by a PreToolUse hook: " + (
        outcome.permission_reason or "no reason given"
    )


def _with_feedback(result: ToolResultBlock, outcome: HookOutcome) -> ToolResultBlock:
    """The result with PostToolUse feedback beside it: a block's reasons, then any
    additional context."""
    notes: list[str] = []
    if outcome.blocked:
        notes.append("PostToolUse hook feedback:\n" + outcome.reason_text)
    notes.extend(outcome.context)
    if not notes:
        return result
    text = "\n\n".join(notes)
    content = result.content
    if isinstance(content, str):
        return result.model_copy(update={"content": f"{content}\n\n{text}"})
    return result.model_copy(update={"content": [*content, TextBlock(text=text)]})
