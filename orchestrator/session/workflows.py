"""The session's workflow runs and the `Workflow` tool, when subagents can run: workflows
start nothing but subagents (orchestrator/workflows/).

Their agents go through a pipeline of their own that offers only `dispatch_agent` and is
otherwise the session's: the same policy, asker, hooks, audit log and tool context, and the
change recorder around the same tool runner, so a workflow's writer is recorded for `warren
undo` as the model's own scoped writers are.
"""

from __future__ import annotations

import functools
import glob
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from orchestrator.calls.permissions import Asker, PermissionFn
from orchestrator.calls.pipeline import ToolRunner
from orchestrator.calls.policy import SessionPolicy
from orchestrator.changes.recorder import ChangeRecorder, RecordingRunner
from orchestrator.events import EventSink
from orchestrator.hooks.runner import HookRunner
from orchestrator.limits import Limits
from orchestrator.paths import WarrenDirs
from orchestrator.session.tools import session_pipeline
from orchestrator.tasks.registry import TaskRegistry
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from policies.claude_names import SUBAGENT_TOOL

if TYPE_CHECKING:
    from orchestrator.tools.base import Tool
    from orchestrator.workflows.runs import WorkflowRuns
    from orchestrator.workflows.script import ScriptSandbox

__all__ = ["build_workflows", "saved_workflow_dirs", "workflow_tool"]


def saved_workflow_dirs(workspace: Path, dirs: WarrenDirs, trusted: bool) -> list[Path]:
    """Where saved workflows are, first found wins: the trusted repository's
    `.warren/workflows/` (an untrusted repository's are not read), then the user's."""
    found = [workspace / ".warren" / "workflows"] if trusted else []
    return [*found, dirs.config / "workflows"]


def build_workflows(
    registry: ToolRegistry,
    *,
    ctx: ToolContext,
    runner: ToolRunner,
    changes: ChangeRecorder,
    policy: SessionPolicy,
    permission: PermissionFn,
    asker: Asker,
    hooks: HookRunner,
    emit: EventSink,
    limits: Limits,
    tasks: TaskRegistry,
    dirs: WarrenDirs,
) -> Callable[[], WorkflowRuns] | None:
    """The session's `WorkflowRuns`, made when first asked for (most sessions never run a
    workflow: its modules are not even imported at start-up); None when `dispatch_agent` is
    not offered."""
    from orchestrator.agents.dispatch_agent import DispatchAgentTool

    dispatch = registry.get(SUBAGENT_TOOL)
    if not isinstance(dispatch, DispatchAgentTool):
        return None

    @functools.cache
    def runs() -> WorkflowRuns:
        from orchestrator.workflows.agents import PipelineAgents
        from orchestrator.workflows.journal import WorkflowStore
        from orchestrator.workflows.rollback import keep_scope
        from orchestrator.workflows.runs import WorkflowRuns
        from orchestrator.workflows.script import script_sandbox
        from sandbox.guard import find_denied

        pipeline = session_pipeline(
            RecordingRunner(runner, changes), ToolRegistry([dispatch]), ctx=ctx, policy=policy,
            permission=permission, asker=asker, emit=emit, limits=limits, hooks=hooks,
        )  # fmt: skip
        workspace = ctx.workspace
        roots = [workspace, *ctx.extra_roots]

        async def sandbox() -> ScriptSandbox:
            """The script's floor: the session's, all read-only, its read deny rules masked."""
            denied: tuple[str, ...] = ()
            read_denied = policy.read_denied()
            if read_denied is not None:
                found = await trio.to_thread.run_sync(find_denied, roots, read_denied)
                denied = tuple(glob.escape(str(p)) for p in found)
            return script_sandbox(policy.sandbox_spec(), roots, limits, denied=denied)

        return WorkflowRuns(
            store=WorkflowStore(dirs.workflows),
            workspace=workspace,
            session_id=ctx.session_id,
            runner=lambda name: PipelineAgents(pipeline, dispatch, name),
            sandbox=sandbox,
            emit=emit,
            tasks=tasks if tasks.max_tasks > 0 else None,
            saved_dirs=saved_workflow_dirs(
                workspace, dirs, trusted=policy.effective.trust == "trusted"
            ),
            cap=min(limits.max_subagents, limits.max_concurrency),
            max_agents=limits.workflow_agents,
            keeper=lambda key, scope: keep_scope(key, scope, workspace, dirs.objects),
            objects=dirs.objects,
        )

    return runs


def workflow_tool(runs: Callable[[], WorkflowRuns]) -> Tool[Any]:
    """The `Workflow` tool over the session's runs (made when first used)."""
    from orchestrator.workflows.tool import WorkflowTool

    return WorkflowTool(runs)
