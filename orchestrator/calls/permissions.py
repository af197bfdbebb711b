"""The permission seam: decisions as typed values, and the functions the loop is given.

The loop never decides permissions itself. It is handed a `PermissionFn` (policy: allow, deny
or ask for one call) and an `Asker` (resolves an ask: the user at a prompt, a headless deny, or
later the coordinator answering a worker). Interactive, headless and subagent runs use the
same loop with different functions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, assert_never

from orchestrator.tools.base import Tool, ToolContext, ToolInput

if TYPE_CHECKING:
    from orchestrator.calls.plan import CallPlan

__all__ = [
    "Allow",
    "Ask",
    "Asker",
    "Deny",
    "PermissionFn",
    "PermissionMode",
    "PermissionResult",
    "default_permission",
    "headless_asker",
]


@dataclass(frozen=True)
class Allow:
    updated_input: dict[str, Any] | None = None
    """A rewritten input to run instead of the model's (re-validated against the schema)."""
    rule: str | None = None
    """What allowed it, for the audit log."""


@dataclass(frozen=True)
class Deny:
    message: str
    """Shown to the model as the tool_result; says why and what to do instead."""
    rule: str | None = None
    by_user: bool = False
    """The user rejected the call at a prompt: the calls queued after it in the same batch
    do not run either (a policy's denial stops only its own call)."""


@dataclass(frozen=True)
class Ask:
    reason: str
    """Why a human must decide (shown at the prompt)."""
    rule: str | None = None
    agent: str | None = None
    """Who is asking when it is not the main agent: a subagent's id and description, which
    the dialog names."""


PermissionResult = Allow | Deny | Ask
PermissionFn = Callable[["CallPlan", ToolContext], Awaitable[PermissionResult]]
"""Decides one planned call. It reads the plan's verdict (and the assessor's `detail`); it
never classifies the call again."""
Asker = Callable[[Tool[Any], ToolInput, Ask], Awaitable[Allow | Deny]]

PermissionMode = Literal["default", "bypass"]


def default_permission(
    mode: PermissionMode = "default",
    *,
    allowed_tools: frozenset[str] = frozenset(),
    disallowed_tools: frozenset[str] = frozenset(),
) -> PermissionFn:
    """A permission function without policy files, for tests and embedders of the loop.

    Warren's own runs use the policy engine (`orchestrator.calls.policy`). Here disallowed
    tools are denied, allowed tools allowed; then read-only calls are allowed and everything
    else asks, unless `mode` is `bypass`, which allows all.
    """

    async def decide(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
        tool, _ = plan.runnable()
        if tool.name in disallowed_tools:
            return Deny(
                f"{tool.name} is disallowed in this session (--disallowed-tools). "
                "Use another tool or ask the user.",
                rule=f"--disallowed-tools {tool.name}",
            )
        if tool.name in allowed_tools:
            return Allow(rule=f"--allowed-tools {tool.name}")
        match mode:
            case "bypass":
                return Allow(rule="--permission-mode bypass")
            case "default":
                if plan.read_only:
                    return Allow(rule="read-only")
                return Ask(f"{tool.name} can change files or run commands")
            case _:
                assert_never(mode)

    return decide


async def headless_asker(tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
    """No human to ask: deny, and tell the model (and the user reading the log) how to allow."""
    return Deny(
        f"Permission to use {tool.name} was not granted: this is a non-interactive run and "
        f"{ask.reason}. The user can allow it with --allowed-tools {tool.name} or "
        "--permission-mode bypass. Do not retry this call; continue without it or explain "
        "what you need.",
        rule="headless: ask becomes deny",
    )
