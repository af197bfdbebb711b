"""The policy layer, adapted to the loop's permission seam for one session.

`policies` decides on plain values (a tool name, its input and the facts the tool declares);
this module loads the effective policy for a workspace, builds the engine once the floor is
known, and hands the pipeline an `Assessor` (each call classified once, into its `CallPlan`),
a `PermissionFn` that decides from the plan without classifying again, the Bash tool a
classifier (for runs without the sandboxed hosts), and the sandbox the policy's additions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.calls.permissions import Allow, Ask, Deny, PermissionFn, PermissionResult
from orchestrator.calls.plan import Assessor, CallPlan, Verdict
from orchestrator.claude_code.settings import settings_flag
from orchestrator.errors import ConfigError
from orchestrator.tools.base import Tool, ToolContext, ToolInput
from orchestrator.tools.registry import builtin_facts
from policies.bash_analysis import BashAnalyser
from policies.engine import CallAssessment, PolicyDecision, PolicyEngine
from policies.files import (
    EffectivePolicy,
    Mode,
    PolicyError,
    command_line_policy,
    load_effective_policy,
)
from policies.mcp import McpJson, McpJsonError, parse_mcp_json, read_mcp_json
from policies.mode import PermissionMode
from policies.rules import PathPattern, compile_path_pattern

if TYPE_CHECKING:
    from sandbox.spec import Limits as SandboxLimits
    from sandbox.spec import SandboxSpec

__all__ = ["SessionPolicy", "load_session_policy"]


_VERDICTS_KEPT = 1024
"""Verdicts the assessor keeps for the in-process Bash tool before it forgets them all."""


@dataclass(frozen=True)
class SessionPolicy:
    effective: EffectivePolicy
    engine: PolicyEngine
    _verdicts: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)
    """Command -> read-only, as the assessor found it: an in-process Bash call (no sandboxed
    host to route it) takes its one-shot/persistent choice from here instead of classifying
    the command again. Taken (popped) on use; cleared past `_VERDICTS_KEPT`."""
    shared_read_only: list[Path] = field(default_factory=list, compare=False)
    """Host directories every sandbox of the session sees read-only at the same path (the
    background tasks' output files, orchestrator/tasks/outputs.py), added before the first
    sandbox starts."""

    @property
    def mode(self) -> Mode:
        """The mode in force now."""
        return self.engine.mode

    @property
    def permission_mode(self) -> PermissionMode:
        """The session's mode, live: hooks, the audit log and the REPL hold it and read it
        when they need it; `set` is the one way to switch it (policies/mode.py)."""
        return self.engine.permission_mode

    def bash_classifier(self) -> Callable[[str], bool]:
        """Command -> may run as a read-only, concurrency-safe call (in the read-only host)."""
        analyser = self.engine.analyser
        floor = self.engine.floor_proven
        workspace = self.engine.workspace

        def read_only(command: str) -> bool:
            known = self._verdicts.pop(command, None)
            if known is not None:
                return known
            return analyser.classify(command, floor=floor, workspace=workspace).concurrency_safe

        return read_only

    def assessor(self) -> Assessor:
        """The session's one classification per call: the engine's assessment (the Bash
        analyser for a tool with a command field, whose read-only verdict is the analyser's;
        the tool's own `is_read_only` for the rest), kept in the verdict for `permission_fn`."""
        engine = self.engine

        def assess(tool: Tool[Any], input: ToolInput) -> Verdict:
            facts = tool.facts
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            own = False if facts.command_field is not None else _tool_read_only(tool, input)
            assessed = engine.assess(tool.name, raw, tool_read_only=own, facts=facts)
            bash = assessed.bash
            if bash is not None:
                if len(self._verdicts) >= _VERDICTS_KEPT:
                    self._verdicts.clear()
                self._verdicts[assessed.command or ""] = bash.concurrency_safe
                reason = bash.hint_reason if bash.read_only else "; ".join(bash.reasons)
                return Verdict(
                    bash.read_only, reason or bash.hint_reason, bash.concurrency_safe, assessed
                )
            safe = own and _tool_concurrency_safe(tool, input)
            reason = "the tool reads only" if own else "the tool may change files"
            return Verdict(own, reason, safe, assessed)

        return assess

    def permission_fn(self) -> PermissionFn:
        """Decides a planned call with the plan's assessment (no second classification); a
        plan made by another assessor is assessed here."""
        engine = self.engine

        async def decide(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
            tool, input = plan.runnable()
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            detail = None if plan.verdict is None else plan.verdict.detail
            assessed = detail if isinstance(detail, CallAssessment) else None
            decision = engine.decide(
                tool.name,
                raw,
                tool_read_only=plan.read_only,
                facts=tool.facts,
                assessed=assessed,
            )
            return _as_permission(decision)

        return decide

    def deny_read(self) -> tuple[str, ...]:
        return tuple(pattern for pattern, _ in self.effective.deny_read)

    def read_deny_rules(self) -> tuple[tuple[str, str], ...]:
        """(path specifier, anchor directory) of every active deny rule covering `Read` (the
        read family), for `ToolContext.read_deny`."""
        out: list[tuple[str, str]] = []
        for entry in self.effective.rules:
            if entry.kind != "deny" or not entry.active or entry.parsed.kind != "path":
                continue
            # `Read(...)` names the read family; a rule on Grep or Glob alone is no file mask.
            if entry.parsed.tool == "Read" and entry.parsed.specifier:
                out.append((entry.parsed.specifier, str(entry.anchor)))
        return tuple(out)

    def read_deny_patterns(self) -> tuple[PathPattern, ...]:
        """The `Read` deny rules compiled (memory files and their imports obey them too)."""
        home = Path(os.environ.get("HOME") or Path.home()).resolve()
        workspace = self.engine.workspace
        return tuple(
            compile_path_pattern(spec, anchor=Path(anchor), workspace=workspace, home=home)
            for spec, anchor in self.read_deny_rules()
        )

    def read_denied(self) -> Callable[[str], bool] | None:
        """Absolute path -> does a deny rule on `Read` cover it; None when no rule does. The
        sandbox masks the workspace files it covers (`SandboxedSpawner`)."""
        patterns = self.read_deny_patterns()
        if not patterns:
            return None
        return lambda path: any(pattern.matches(path) for pattern in patterns)

    def protected(self) -> tuple[str, ...]:
        return tuple(pattern for pattern, _ in self.effective.protected)

    def home_allow(self) -> tuple[str, ...]:
        """`[sandbox] home_allow`: home paths the sandbox sees (read-only) besides the defaults."""
        return tuple(path for path, _ in self.effective.home_allow)

    def sandbox_spec(self, limits: SandboxLimits | None = None) -> SandboxSpec:
        """The floor the policy adds to every sandbox of the session (tool hosts, pool
        workers, MCP servers, hooks): its read deny rules masked, its protected paths, its
        home allowances, the directories shared read-only; with `limits` (default: the
        spec's)."""
        from sandbox.spec import Bind, SandboxSpec

        return SandboxSpec(
            **({} if limits is None else {"limits": limits}),
            extra_deny_read=self.deny_read(),
            extra_protected=self.protected(),
            extra_home_allow=self.home_allow(),
            extra_binds=tuple(Bind(path=path, mode="ro") for path in self.shared_read_only),
        )

    def writable_roots(self) -> tuple[Path, ...]:
        return tuple(root for root, _ in self.effective.writable_roots)

    def limit(self, name: str) -> int | float | None:
        return self.effective.limit(name)


def _tool_read_only(tool: Tool[Any], input: ToolInput) -> bool:
    try:
        return tool.is_read_only(input)
    except Exception:
        return False  # a check that fails means "may write"


def _tool_concurrency_safe(tool: Tool[Any], input: ToolInput) -> bool:
    try:
        return tool.is_concurrency_safe(input)
    except Exception:
        return False


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
    add_dirs: tuple[Path, ...] = (),
    settings: str | None = None,
    setting_sources: Collection[str] | None = None,
    mcp_configs: tuple[str, ...] = (),
) -> SessionPolicy:
    """Every policy level for `workspace`, merged, with the command line's flags on top
    (`--add-dir` as writable roots, `--settings` as a Claude Code settings file and each
    `--mcp-config` as MCP servers at the command line's level, `--setting-sources` choosing
    the Claude Code files read).

    **Errors:** `ConfigError` naming the file, line and key of a broken policy (nothing may
    run on a policy that failed to load), or explaining why `bypass` was refused.
    """
    try:
        command_line = command_line_policy(
            allowed_tools=sorted(allowed_tools),
            disallowed_tools=sorted(disallowed_tools),
            permission_mode=permission_mode,
            writable_roots=add_dirs,
        )
        effective = load_effective_policy(
            workspace,
            command_line=command_line,
            command_line_settings=None if settings is None else settings_flag(settings),
            setting_sources=setting_sources,
            command_line_mcp=tuple(_mcp_config_flag(value) for value in mcp_configs),
        )
        engine = PolicyEngine(
            effective,
            workspace=workspace,
            floor_proven=floor_proven,
            analyser=BashAnalyser(),
            no_sandbox_consent=no_sandbox_consent,
            tool_facts=builtin_facts(),
        )
    except PolicyError as exc:
        raise ConfigError(str(exc), source="policy") from exc
    return SessionPolicy(effective, engine)


def _mcp_config_flag(value: str) -> tuple[str, McpJson]:
    """`--mcp-config`: `.mcp.json` text (it starts with `{`) or the path of such a file, as
    (its source for messages, its servers).

    **Errors:** `PolicyError` naming `--mcp-config` or the file.
    """
    try:
        if value.lstrip().startswith("{"):
            return "--mcp-config", parse_mcp_json(value, source="--mcp-config", sdk=True)
        path = Path(value).expanduser()
        found = read_mcp_json(path)
    except McpJsonError as exc:
        raise PolicyError(str(exc)) from None
    if found is None:
        raise PolicyError("no such file", file=str(path), key="--mcp-config")
    return str(path), found
