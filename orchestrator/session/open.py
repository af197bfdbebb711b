"""`open_session`: the builders run in order, one concern each, and the `Session` made from
what they built; every part closed on the way out.

The order is the start-up's critical path: the transcript and log first (a state directory
that cannot be written stops the session before anything runs), the model client made and
the SDK imported while the floor is proven and the policy and context load
(`session/startup.py`), then the parts that need the policy: limits, the model chain, tools,
the change recorder, event sinks, tool hosts, hooks, the asker, MCP servers and the pool.
What the first request does not need starts once it is on its way (`session/later.py`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import trio

from orchestrator.agents.types import SubagentRunner, SubagentUpdate
from orchestrator.calls.denials import DenialLog
from orchestrator.calls.permissions import Asker, PermissionFn, headless_asker
from orchestrator.calls.pipeline import InProcessRunner, ToolRunner
from orchestrator.calls.policy import SessionPolicy
from orchestrator.calls.terminal_asker import TerminalAsker
from orchestrator.changes.recorder import RecordingRunner
from orchestrator.claude_code.output import OutputPrinter
from orchestrator.conversation.context import system_prompt
from orchestrator.conversation.loop import ModelUsage
from orchestrator.errors import ConfigError
from orchestrator.hooks.runner import HookRunner, WarmHookHost
from orchestrator.limits import Limits
from orchestrator.mcp.deferred import DeferredMcp
from orchestrator.paths import WarrenDirs
from orchestrator.records.audit import AuditLog
from orchestrator.records.transcripts import Transcript
from orchestrator.session.config import SessionConfig, SessionParts, build_limits, build_pool
from orchestrator.session.hooks import build_hook_runner
from orchestrator.session.later import LaterSubagents, LaterToolHosts
from orchestrator.session.models import SessionModel, build_model, make_model
from orchestrator.session.recording import may_write, open_change_recorder
from orchestrator.session.session import Session, SessionKit
from orchestrator.session.sinks import build_sinks, subagent_sink
from orchestrator.session.startup import StartedUp, start_up
from orchestrator.session.state import (
    ENDED_WITH_PROCESS,
    IoGuard,
    open_audit,
    open_log,
    open_transcript,
)
from orchestrator.session.tools import build_registry, dispatch_tool, session_pipeline
from orchestrator.session.workflows import build_workflows, workflow_tool
from orchestrator.tasks.monitor import MonitorTool
from orchestrator.tasks.outputs import TaskOutputError, TaskOutputs
from orchestrator.tasks.registry import TaskRegistry
from orchestrator.tasks.shells import BackgroundShells
from orchestrator.tasks.task_stop import TaskStopTool
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.registry import ToolRegistry
from policies.claude_names import SUBAGENT_TOOL, WORKFLOW_TOOL
from policies.pool import PoolConfig

__all__ = ["open_session"]


@asynccontextmanager
async def open_session(
    config: SessionConfig, parts: SessionParts | None = None
) -> AsyncIterator[Session]:
    """Build a session's parts, yield the `Session`, and close every part on the way out.

    **Cancellation:** leaving the block closes the tool hosts, the pool and the model,
    shielded and bounded (15 s); the transcript keeps every complete message.
    **Errors:** `FloorNotProven` when the sandbox is required but unproven; `StateUnwritable`
    when the state directory cannot be written; `ConfigError` for a bad model script, policy,
    session, directory or pool. A `ConfigError` raised once the tool hosts run (the pool
    refusing to open) leaves their nursery wrapped in a group: it is unwrapped here, so every
    front end prints it as the one line it is.
    """
    try:
        async with _open_session(config, parts or SessionParts()) as session:
            yield session
    except BaseExceptionGroup as group:
        matched, rest = group.split(ConfigError)
        leaves = _leaves(matched) if matched is not None and rest is None else []
        if len(leaves) != 1:
            raise
        raise leaves[0] from None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@asynccontextmanager
async def _open_session(config: SessionConfig, parts: SessionParts) -> AsyncIterator[Session]:
    dirs = parts.dirs or WarrenDirs.from_env()
    cwd = config.cwd.resolve()
    if not cwd.is_dir():
        raise ConfigError(f"{cwd} is not a directory", source="--cwd")
    io_guard = IoGuard()
    async with AsyncExitStack() as stack:
        opening = _Opening(stack, config, parts, dirs, cwd, io_guard)
        kit, hooks = await opening.build()
        session = Session(kit)
        if parts.start_at_once:
            session.start_parts()
        if hooks.has("SessionEnd"):
            stack.push_async_callback(shielded, _session_end(hooks))
        await session.start()
        yield session


@dataclass
class _Opening:
    """One session being opened: what every builder needs, and the stack that closes what
    they open (in reverse)."""

    stack: AsyncExitStack
    config: SessionConfig
    parts: SessionParts
    dirs: WarrenDirs
    cwd: Path
    io_guard: IoGuard

    async def build(self) -> tuple[SessionKit, HookRunner]:
        config, parts, stack, io_guard = self.config, self.parts, self.stack, self.io_guard
        transcript, history, unended = open_transcript(config, self.dirs, self.cwd)
        stack.callback(io_guard.close, transcript.close)
        log_sink = open_log(self.dirs, transcript.session_id, config.verbose, io_guard)
        stack.callback(io_guard.close, log_sink.close)
        client = parts.model or make_model(config.model, self.cwd)
        # Closed here too: start-up may have made its SDK client (closing twice is harmless).
        stack.push_async_callback(shielded, client.aclose)
        up = await start_up(
            config, self.cwd, self.dirs, parts.runner, parts.known_floor, client, parts.spares
        )
        audit = self._audit(transcript, up)
        policy = up.policy
        limits = build_limits(config, policy)
        pool_config = build_pool(config, policy)
        model = build_model(config, parts, client, limits, self.cwd)
        stack.push_async_callback(shielded, model.model.aclose)
        registry = build_registry(config, parts, policy)
        printer = OutputPrinter(
            config.output_format,
            transcript.session_id,
            parts.stdout or sys.stdout,
            partial=config.include_partial_messages,
        )
        denials = DenialLog()
        changes = await open_change_recorder(
            stack, self.cwd, policy, self.dirs, transcript, io_guard
        )
        emit = build_sinks(
            config, parts, printer=printer, denials=denials, changes=changes,
            transcript=transcript, audit=audit, io_guard=io_guard,
        )  # fmt: skip
        outputs, no_outputs = self._task_outputs(policy, transcript.session_id, limits)
        ctx, runner = await self._tool_hosts(up, policy, transcript.session_id)
        hooks = build_hook_runner(
            policy,
            workspace=self.cwd,
            sandboxed=up.floor_state == "proven",
            session_id=transcript.session_id,
            transcript_path=str(transcript.path),
            extra_roots=ctx.extra_roots,
            emit=emit,
            warm=runner if isinstance(runner, WarmHookHost) else None,
            host_hooks=parts.host.hooks if parts.host is not None else (),
            recorder=changes,
        )
        asker = self._asker(policy, hooks)
        permission = policy.permission_fn()
        registry, servers = await self._mcp(ctx, policy, registry)
        spend: dict[str, ModelUsage] = {}
        tasks = TaskRegistry(
            max_tasks=limits.max_tasks, time_limit_s=limits.task_time_s, emit=emit
        )
        if unended:
            tasks.ended_before(unended, ENDED_WITH_PROCESS)
            listed = ", ".join(f"{t['task_id']} ({t['description']})" for t in unended)
            print(f"warren: background tasks that {ENDED_WITH_PROCESS}: {listed}", file=sys.stderr)
        registry, pool = await self._subagents(
            ctx, up, model, limits, pool_config, registry, hooks, permission, asker,
            subagent_sink(printer, io_guard.sink(audit), denials, spend, parts.on_subagent),
            tasks,
        )  # fmt: skip
        # Opened after the pool, so closed before it: a background agent's worker is stopped
        # while the pool still runs (orchestrator/tasks/registry.py).
        await stack.enter_async_context(tasks.running())
        shells = BackgroundShells(
            RecordingRunner(runner, changes),
            direct=runner,
            tasks=tasks,
            outputs=outputs,
            recorder=changes,
            unavailable=no_outputs,
        )
        registry = self._task_tools(registry, tasks, runner, outputs is not None)
        workflows = build_workflows(
            registry, ctx=ctx, runner=runner, changes=changes, policy=policy,
            permission=permission, asker=asker, hooks=hooks, emit=emit, limits=limits,
            tasks=tasks, dirs=self.dirs,
        ) if self._wanted(WORKFLOW_TOOL) else None  # fmt: skip
        if workflows is not None:
            registry = registry.with_tools([workflow_tool(workflows)])
        # What the first request does not need starts once it is on its way (Session.run).
        later = [p.start for p in (runner, pool) if isinstance(p, LaterToolHosts | LaterSubagents)]
        if may_write(policy.mode, registry, servers is not None, changes.tree.roots):
            later.append(changes.tree.start)  # the first scan overlaps the first request
        printer.init(
            cwd=str(self.cwd),
            model=model.model.model,
            tools=registry.names(),
            transcript=str(transcript.path),
            permission_mode=policy.mode,
            mcp_servers=[] if servers is None else [n for n, _, _ in policy.effective.mcp_servers],
            sandbox=up.floor_state,
        )
        pipeline = session_pipeline(
            shells, registry, ctx=ctx, policy=policy, permission=permission, asker=asker,
            emit=emit, limits=limits, hooks=hooks,
        )  # fmt: skip
        structlog.get_logger().bind(session_id=transcript.session_id).info(
            "session opened", model=model.model.model, cwd=str(self.cwd), resumed=bool(history)
        )
        io_guard.check_start()
        kit = SessionKit(
            config=config,
            policy=policy,
            limits=limits,
            transcript=transcript,
            model=model.model,
            switch=model.switch,
            pipeline=pipeline,
            printer=printer,
            emit=emit,
            system=system_prompt(
                up.snapshot, base=config.system_prompt, append=config.append_system_prompt
            ),
            history=history,
            io_guard=io_guard,
            denials=denials,
            subagent_spend=spend,
            changes=changes,
            mcp_source=servers,
            later=tuple(later),
            tasks=tasks,
            workflows=workflows,
        )
        return kit, hooks

    def _audit(self, transcript: Transcript, up: StartedUp) -> AuditLog:
        """The audit log, opened once the floor is known and the policy loaded (it reads the
        session's live mode), with the floor's record first."""
        audit = open_audit(transcript, up.policy.permission_mode, up.floor_state)
        self.stack.callback(self.io_guard.close, audit.close)
        floor = up.floor
        if floor is not None:
            self.io_guard.write(
                lambda: audit.record(
                    "floor",
                    proven=floor.proven,
                    bwrap=floor.bwrap_path,
                    bwrap_version=floor.bwrap_version,
                    bwrap_source=floor.bwrap_source,
                    notes=list(floor.notes),
                )
            )
        return audit

    def _task_outputs(
        self, policy: SessionPolicy, session_id: str, limits: Limits
    ) -> tuple[TaskOutputs | None, str]:
        """Where background tasks write their output, shared read-only with every sandbox
        of the session (so made before the first starts), removed at its end; or None and
        why not (background commands are then refused, saying so)."""
        try:
            outputs = TaskOutputs.open(self.cwd, session_id, limit_bytes=limits.task_output_bytes)
        except TaskOutputError as exc:
            structlog.get_logger().warning(
                "no output directory for background tasks", error=str(exc)
            )
            return None, str(exc)
        policy.shared_read_only.append(outputs.root)
        self.stack.callback(outputs.remove)
        return outputs, ""

    async def _tool_hosts(
        self, up: StartedUp, policy: SessionPolicy, session_id: str
    ) -> tuple[ToolContext, ToolRunner]:
        """The session's tool context and where its calls run: the sandboxed tool hosts the
        composition root plugs in, or this process with the sandbox off."""
        ctx = ToolContext(
            workspace=self.cwd,
            cwd=self.cwd,
            session_id=session_id,
            extra_roots=policy.writable_roots(),
            read_deny=policy.read_deny_rules(),
        )
        self.stack.push_async_callback(shielded, ctx.aclose)
        runner = await self.stack.enter_async_context(
            self.parts.runner(ctx, policy)
            if self.parts.runner is not None and up.floor_state == "proven"
            else _in_process(ctx)
        )
        return ctx, runner

    def _asker(self, policy: SessionPolicy, hooks: HookRunner) -> Asker:
        """Who answers what the policy asks about: the embedder's (the REPL's dialogs), the
        terminal's, or nobody (a denial saying how to allow it)."""
        if self.parts.asker is not None:
            return self.parts.asker(policy, hooks.notification)
        if self.config.asks == "terminal":
            return TerminalAsker(policy, tty=self.parts.terminal, notify=hooks.notification)
        return headless_asker

    async def _mcp(
        self, ctx: ToolContext, policy: SessionPolicy, registry: ToolRegistry
    ) -> tuple[ToolRegistry, DeferredMcp | None]:
        """The policy's MCP servers as a source of the registry's tools, started later
        (orchestrator/mcp/deferred.py); none without servers or without a factory."""
        open_mcp = self.parts.mcp
        if open_mcp is None or not policy.effective.mcp_servers:
            return registry, None
        servers = await self.stack.enter_async_context(
            DeferredMcp(
                lambda: open_mcp(ctx, policy),
                [name for name, _, _ in policy.effective.mcp_servers],
            ).running()
        )
        return ToolRegistry(list(registry), [servers]), servers

    async def _subagents(
        self,
        ctx: ToolContext,
        up: StartedUp,
        model: SessionModel,
        limits: Limits,
        pool_config: PoolConfig,
        registry: ToolRegistry,
        hooks: HookRunner,
        permission: PermissionFn,
        asker: Asker,
        on_update: Callable[[SubagentUpdate], None],
        tasks: TaskRegistry,
    ) -> tuple[ToolRegistry, SubagentRunner | None]:
        """The worker pool and `dispatch_agent` over it, when the composition root plugged a
        pool in, the floor is proven, the limits allow subagents and `--tools` offers them."""
        config, parts, policy = self.config, self.parts, up.policy
        if (
            parts.subagents is None
            or up.floor_state != "proven"
            or limits.max_subagents <= 0
            or not self._wanted(SUBAGENT_TOOL)
        ):
            return registry, None
        pool = await self.stack.enter_async_context(
            parts.subagents(ctx, policy, model.model, limits, pool_config)
        )
        dispatch = dispatch_tool(
            pool,
            registry,
            policy,
            self.dirs,
            permission,
            asker,
            context=up.snapshot.render(),
            on_update=on_update,
            hooks=hooks,
            max_stop_hook_blocks=limits.max_stop_hook_blocks,
            output_cap=limits.max_tool_output_chars,
            claude_sources=config.setting_sources,
            sdk_agents=parts.host.agents if parts.host is not None else None,
            tasks=tasks if limits.max_tasks > 0 else None,
            session_id=ctx.session_id,
        )
        from orchestrator.agents.send_message import SendMessageTool  # with dispatch_agent's

        added: list[Tool[Any]] = [dispatch]
        if self._wanted(SendMessageTool.name):
            added.append(SendMessageTool(dispatch))
        return registry.with_tools(added), pool

    def _task_tools(
        self, registry: ToolRegistry, tasks: TaskRegistry, runner: ToolRunner, shells: bool
    ) -> ToolRegistry:
        """TaskStop, where background tasks can run (a pool for background agents, or Bash
        with an output directory for background shells), and Monitor beside Bash; each
        unless `--tools` leaves it out."""
        if tasks.max_tasks <= 0:
            return registry
        bash = registry.get("Bash")
        added: list[Tool[Any]] = []
        if bash is not None and self._wanted(MonitorTool.name):
            added.append(MonitorTool(tasks, runner, bash))
        background = registry.get(SUBAGENT_TOOL) is not None or (bash is not None and shells)
        if background and self._wanted(TaskStopTool.name):
            added.append(TaskStopTool(tasks))
        return registry.with_tools(added) if added else registry

    def _wanted(self, name: str) -> bool:
        return self.config.tools is None or name in self.config.tools


def _session_end(hooks: HookRunner) -> Callable[[], Awaitable[None]]:
    async def end() -> None:
        await hooks.session_end()

    return end


async def shielded(close: Callable[[], Awaitable[None]]) -> None:
    """Teardown that a cancellation cannot skip, bounded so a stuck part cannot hang exit."""
    with trio.CancelScope(shield=True), trio.move_on_after(15):
        await close()


@asynccontextmanager
async def _in_process(ctx: ToolContext) -> AsyncIterator[ToolRunner]:
    yield InProcessRunner()
