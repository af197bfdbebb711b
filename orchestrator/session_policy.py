"""The policy layer, adapted to the loop's permission seam for one session.

`policies` decides on plain values (a tool name and its input); this module loads the
effective policy for a workspace, builds the engine once the floor is known, and hands the
loop a `PermissionFn`, the Bash tool a classifier, and the sandbox the policy's additions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.permissions import Allow, Ask, Deny, PermissionFn, PermissionResult
from orchestrator.tools.base import Tool, ToolContext, ToolInput
from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyDecision, PolicyEngine
from policies.files import (
    EffectivePolicy,
    Mode,
    PolicyError,
    command_line_policy,
    load_effective_policy,
)

__all__ = ["SessionPolicy", "load_session_policy"]


@dataclass(frozen=True)
class SessionPolicy:
    effective: EffectivePolicy
    engine: PolicyEngine

    @property
    def mode(self) -> Mode:
        return self.engine.mode

    def bash_classifier(self) -> Callable[[str], bool]:
        """Command -> may run as a read-only, concurrency-safe call (in the read-only host)."""
        analyser = self.engine.analyser
        floor = self.engine.floor_proven
        workspace = self.engine.workspace

        def read_only(command: str) -> bool:
            return analyser.classify(command, floor=floor, workspace=workspace).concurrency_safe

        return read_only

    def permission_fn(self) -> PermissionFn:
        engine = self.engine

        async def decide(tool: Tool[Any], input: ToolInput, ctx: ToolContext) -> PermissionResult:
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            decision = engine.decide(tool.name, raw, tool_read_only=tool.is_read_only(input))
            return _as_permission(decision)

        return decide

    def deny_read(self) -> tuple[str, ...]:
        return tuple(pattern for pattern, _ in self.effective.deny_read)

    def protected(self) -> tuple[str, ...]:
        return tuple(pattern for pattern, _ in self.effective.protected)

    def writable_roots(self) -> tuple[Path, ...]:
        return tuple(root for root, _ in self.effective.writable_roots)

    def limit(self, name: str) -> int | float | None:
        return self.effective.limit(name)


def _as_permission(decision: PolicyDecision) -> PermissionResult:
    rule = f"{decision.rule or 'no rule'} [{decision.source}]"
    match decision.decision:
        case "allow":
            return Allow(rule=rule)
        case "deny":
            return Deny(decision.reason, rule=rule)
        case _:
            return Ask(decision.reason, rule=rule)


def load_session_policy(
    workspace: Path,
    *,
    floor_proven: bool,
    permission_mode: Mode | None = None,
    allowed_tools: frozenset[str] = frozenset(),
    disallowed_tools: frozenset[str] = frozenset(),
    no_sandbox_consent: bool = False,
) -> SessionPolicy:
    """Every policy level for `workspace`, merged, with the command line's flags on top.

    **Errors:** `ConfigError` naming the file, line and key of a broken policy (nothing may
    run on a policy that failed to load), or explaining why `bypass` was refused.
    """
    try:
        command_line = command_line_policy(
            allowed_tools=sorted(allowed_tools),
            disallowed_tools=sorted(disallowed_tools),
            permission_mode=permission_mode,
        )
        effective = load_effective_policy(workspace, command_line=command_line)
        engine = PolicyEngine(
            effective,
            workspace=workspace,
            floor_proven=floor_proven,
            analyser=BashAnalyser(),
            no_sandbox_consent=no_sandbox_consent,
        )
    except PolicyError as exc:
        raise ConfigError(str(exc), source="policy") from exc
    return SessionPolicy(effective, engine)
