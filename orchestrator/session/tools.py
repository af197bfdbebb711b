"""The tools a session offers: the built-in set (or the composition root's), narrowed by
`--tools`, and `dispatch_agent` over the worker pool with the agent types this workspace
defines.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.agents.types import SubagentRunner, SubagentUpdate, load_agent_types
from orchestrator.calls.permissions import Asker, PermissionFn
from orchestrator.calls.pipeline import ToolPipeline, ToolRunner
from orchestrator.calls.policy import SessionPolicy
from orchestrator.errors import ConfigError
from orchestrator.events import EventSink
from orchestrator.hooks.runner import HookRunner
from orchestrator.limits import Limits
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.tasks.registry import TaskRegistry
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from policies.claude_names import SUBAGENT_TOOL

if TYPE_CHECKING:
    from orchestrator.agents.dispatch_agent import DispatchAgentTool

__all__ = ["build_registry", "dispatch_tool", "session_pipeline"]


def build_registry(
    config: SessionConfig, parts: SessionParts, policy: SessionPolicy
) -> ToolRegistry:
    """The built-in tools (or the composition root's), only those `--tools` names.

    **Errors:** `ConfigError` for a `--tools` name that is no tool.
    """
    registry = (
        parts.tools()
        if parts.tools is not None
        else builtin_tools(bash_classifier=policy.bash_classifier())
    )
    if config.tools is not None:
        registry = _only_tools(registry, config.tools)
    return registry


def _only_tools(registry: ToolRegistry, names: tuple[str, ...]) -> ToolRegistry:
    """The built-in tools `--tools` names; a name that is no tool is an error naming it."""
    known = {*registry.names(), SUBAGENT_TOOL}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(
            f"no tool named {', '.join(unknown)} (known: {', '.join(sorted(known))})",
            source="--tools",
        )
    return registry.only(lambda tool: tool.name in names)


def dispatch_tool(
    pool: SubagentRunner,
    registry: ToolRegistry,
    policy: SessionPolicy,
    dirs: WarrenDirs,
    permission: PermissionFn,
    asker: Asker,
    *,
    context: str,
    on_update: Callable[[SubagentUpdate], None],
    hooks: HookRunner,
    max_stop_hook_blocks: int,
    output_cap: int,
    claude_sources: Collection[str] | None = None,
    sdk_agents: Mapping[str, Any] | None = None,
    tasks: TaskRegistry | None = None,
    session_id: str | None = None,
) -> DispatchAgentTool:
    """`dispatch_agent` over the worker pool, with the agent types this workspace defines
    (its `.warren/agents/` and `.claude/agents/` only when trusted), the session's tools and
    permissions, and the main agent's context text (git snapshot, memory files) for every
    subagent."""
    from orchestrator.agents.dispatch_agent import DispatchAgentTool

    return DispatchAgentTool(
        runner=pool,
        agent_types=load_agent_types(
            policy.engine.workspace,
            trusted=policy.effective.trust == "trusted",
            config_dir=dirs.config,
            known_tools=registry.names(),
            claude_sources=claude_sources,
            sdk_agents=sdk_agents,
        ),
        tools=registry,
        permission=permission,
        asker=asker,
        assessor=policy.assessor(),
        sidechain_root=dirs.sessions,
        on_update=on_update,
        context=context,
        hooks=hooks,
        max_stop_hook_blocks=max_stop_hook_blocks,
        output_cap=output_cap,
        protected=policy.protected(),
        tasks=tasks,
        session_id=session_id,
    )


def session_pipeline(
    runner: ToolRunner,
    tools: ToolRegistry,
    *,
    ctx: ToolContext,
    policy: SessionPolicy,
    permission: PermissionFn,
    asker: Asker,
    emit: EventSink,
    limits: Limits,
    hooks: HookRunner,
) -> ToolPipeline:
    """A pipeline of the session's: its policy, asker, hooks, audit and limits, over `tools`
    run by `runner` (the main agent's, or the workflows' that offers only dispatch_agent)."""
    return ToolPipeline(
        runner=runner,
        tools=tools,
        ctx=ctx,
        permission=permission,
        asker=asker,
        assessor=policy.assessor(),
        emit=emit,
        default_timeout_s=limits.tool_timeout_s,
        output_cap=limits.max_tool_output_chars,
        hooks=hooks,
    )
