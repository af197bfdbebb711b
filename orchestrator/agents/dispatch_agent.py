"""The dispatch_agent tool: hand a task to a subagent that runs in its own sandboxed process.

The tool runs in the coordinator (it touches no workspace itself) and talks to an injected
`SubagentRunner` (the worker pool). It returns only the subagent's final text and its usage:
the subagent's own turns go to its sidechain transcript
(`<sessions>/<session id>.agents/<agent id>.jsonl`) and, tagged with its id, to the
`on_update` sink (stream-json, progress). Each of the subagent's tool calls is decided by this
session's permission function; asks go to the session's asker one at a time. The session's
PreToolUse, PostToolUse and SubagentStop hooks fire for the subagent too, run here with its
`agent_id` (orchestrator/agents/hooks.py). An agent type that names MCP tools uses the
session's servers through this coordinator (orchestrator/agents/mcp.py): a call its
permission answer allows is granted there, and only a granted call runs.

A call is read-only and concurrency-safe exactly when its agent type cannot write, so several
read-only dispatches in one turn run in parallel and the scheduler is never told a writing
agent is read-only.

A writable type may be given `write_paths`, a write scope (orchestrator/calls/scopes.py): checked in
`validate` (inside a writable root, no protected name, no link on the way, directories only),
made once the call is allowed, mounted as the only writable part of its worker's sandbox. Its
plan carries the scope (`write_scope`), so writers with disjoint scopes run at once
(orchestrator/conversation/executor.py). The scope is hashed before and after the run, here, and
the files that changed are listed in the tool_result and dropped from the read ledger, so the main
agent reads them again before it edits them.

Warren's own callers (the workflow engine, calling through the session's `ToolPipeline`) may
give `output_schema`, which the model's schema of the tool leaves out: the agent then ends by
calling `StructuredOutput` with an object matching it (orchestrator/agents/structured.py); one
that ends without a valid one is continued once, and the tool_result is the object as JSON or
an error saying why there is none. Every foreground dispatch leaves a `DispatchOutcome` (the
values behind its tool_result) under its tool_use_id until `take_outcome` takes it
(orchestrator/agents/dispatch_outcome.py).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, assert_never

import pydantic
import trio
from pydantic import Field

from orchestrator.agents.dispatch_outcome import (
    MISSING,
    DispatchOutcome,
    Missing,
    UntakenOutcomes,
)
from orchestrator.agents.fork import FORK, FORK_DESCRIPTION, fork_start, fork_task, fork_type
from orchestrator.agents.recall import AgentRecord, conversation, stored_agents
from orchestrator.agents.structured import (
    STRUCTURED_OUTPUT,
    STRUCTURED_OUTPUT_RULE,
    ServedTools,
    StructuredOutput,
    output_validator,
)
from orchestrator.agents.structured import SYSTEM_NOTE as STRUCTURED_SYSTEM_NOTE
from orchestrator.agents.types import (
    AgentType,
    SubagentEvent,
    SubagentFinished,
    SubagentMcp,
    SubagentOutcome,
    SubagentPermission,
    SubagentRequest,
    SubagentRunner,
    SubagentStarted,
    SubagentUpdate,
    WarmsWriters,
)
from orchestrator.calls.permissions import Allow, Ask, Asker, Deny, PermissionFn
from orchestrator.calls.pipeline import DEFAULT_OUTPUT_CAP
from orchestrator.calls.plan import Assessor, plan_call, tool_assessor
from orchestrator.calls.scopes import (
    FileChange,
    ScopeError,
    ScopeHashes,
    check_scope,
    hash_scope,
    lexical_scope,
    open_scope,
    scope_changes,
)
from orchestrator.errors import ConfigError, ToolError
from orchestrator.events import AssistantTurn, RetryScheduled, ToolResultsMessage
from orchestrator.messages import Message, ToolUseBlock, Usage
from orchestrator.model.catalog import resolve_model
from orchestrator.records.transcripts import Transcript
from orchestrator.tasks.registry import Task, TaskEnd, TaskError, TaskRegistry, TaskStatus
from orchestrator.tools.base import (
    CURRENT_TOOL_USE_ID,
    CURRENT_TURN,
    InputT,
    Tool,
    ToolContext,
    ToolInput,
    ToolOutput,
    ToolProgress,
)
from orchestrator.tools.registry import DISPATCH_AGENT_FACTS, ToolRegistry
from policies.claude_names import SUBAGENT_TOOL
from policies.facts import ToolFacts
from sandbox.spec import DEFAULT_PROTECTED

MAX_CONTINUED_BYTES = 8 * 1024 * 1024
"""The largest conversation `SendMessage` continues (its API form): it goes to the worker in
one protocol line (16 MiB at most, `workers/host_protocol.py`)."""

if TYPE_CHECKING:
    from orchestrator.agents.hooks import AgentHooks
    from orchestrator.agents.mcp import AgentMcp
    from orchestrator.hooks.runner import HookRunner

__all__ = ["AgentRun", "AgentRunTool", "DispatchAgentInput", "DispatchAgentTool", "sidechain_path"]

DESCRIPTION = """\
Launches a subagent that works on a task on its own, in a separate sandboxed process, and \
returns its final report to you.

Use it for open-ended searches and surveys that may take several rounds of Glob, Grep and \
Read, and to split independent work: dispatch several agents in one message (several \
dispatch_agent calls in the same turn) and read-only agents run in parallel.

- Each agent starts from nothing: it sees only your prompt. Give it everything it needs to \
know, and say exactly what it should report back.
- It returns one final message; you cannot talk to it meanwhile. Its report is for you, not \
the user: tell the user what matters from it.
- Read-only agents cannot change files. Do the edits yourself once the agents have reported, \
unless an agent type below says it may write.
- An agent type that may write can be confined to a write scope: `write_paths`, a list of \
directories (absolute or relative to the workspace; missing ones are created). Only those are \
writable for it, everything else is read-only. Agents with disjoint scopes run at the same time: \
split a change across packages into one scoped agent per package, dispatched in one message. \
Re-read the files an agent reports changed before you edit them.
- `run_in_background: true` starts a read-only agent and returns at once with its id: go on \
with other work meanwhile (plan, read, dispatch more). You are told when it finishes (a \
<task-notification> with its report) at your next turn; do not poll or sleep for it, and do \
not redo its work. Use it for surveys you do not need before your next step. TaskStop ends \
one. Writing agents run in the foreground.
- `name` names the agent (for TaskStop and SendMessage); `model` (sonnet, opus, haiku) \
overrides its type's.
- Once an agent has finished, SendMessage (its id or name) asks it a follow-up: it still has \
everything it read in its context, so prefer that to a new agent re-reading the same files.
- `subagent_type: "fork"` starts a copy of you that knows this whole conversation: its prompt \
only says what to do.

Available agent types (`subagent_type`):
"""


class DispatchAgentInput(ToolInput):
    description: str = Field(
        min_length=1, description="A short (3-5 words) description of the task, for the user."
    )
    prompt: str = Field(
        min_length=1,
        description="The task for the agent: what to do, everything it needs to know, and "
        "what to report back.",
    )
    subagent_type: str = Field(
        default="general", description="The type of agent to dispatch (listed above)."
    )
    write_paths: list[str] | None = Field(
        default=None,
        description="For an agent type that may write: the only directories it may change "
        "(absolute or relative to the workspace). Leave out to let it write the workspace.",
    )
    run_in_background: bool = Field(
        default=False,
        description="Start a read-only agent and return at once; its report comes as a "
        "<task-notification> at your next turn.",
    )
    name: str | None = Field(
        default=None, min_length=1, description="A name for the agent (TaskStop takes it)."
    )
    model: str | None = Field(
        default=None, description="The model for this agent (sonnet, opus, haiku or an id)."
    )
    isolation: str | None = Field(
        default=None, description="Not supported: give a writing agent write_paths instead."
    )
    team_name: str | None = Field(default=None, description="Accepted; not used by Warren.")
    mode: str | None = Field(default=None, description="Accepted; not used by Warren.")
    effort: str | None = Field(default=None, description="Accepted; not used by Warren.")
    output_schema: dict[str, Any] | None = None
    """For Warren's own callers (the workflow engine), never shown to the model (the tool's
    input schema leaves it out, `DispatchAgentTool.input_schema`): a JSON schema of an object
    the agent must hand back through `StructuredOutput` (orchestrator/agents/structured.py).
    The tool_result is then that object as JSON, and `take_outcome` gives it as a value."""


@dataclass(frozen=True)
class _Ran:
    """One run of a subagent as `_run` returns it: its tool_result, its outcome, and the
    files it changed in its write scope."""

    output: ToolOutput
    outcome: SubagentOutcome
    changes: tuple[FileChange, ...]


def sidechain_path(sidechain_root: Path, session_id: str, agent_id: str) -> Path:
    """Where a subagent's transcript goes: next to its session's `<session id>.jsonl`."""
    return sidechain_root / f"{session_id}.agents" / f"{agent_id}.jsonl"


@dataclass(frozen=True)
class AgentRun:
    """What a call of an `AgentRunTool` would run: the agent's type and its write scope."""

    agent_type: AgentType
    write_paths: list[str] | None
    """As given (the scope is checked and hashed again at each run)."""


class AgentRunTool(Tool[InputT]):
    """A tool whose call is one subagent's run (`dispatch_agent`, `SendMessage`): read-only
    exactly when the agent's type cannot write, a writer confined to its `write_paths`, and
    no time limit of the pipeline's (the pool enforces each subagent's own limits)."""

    def _agent_run(self, input: InputT) -> AgentRun | None:
        """What the call would run; None when it names no agent (the call is refused)."""
        raise NotImplementedError

    def is_read_only(self, input: InputT) -> bool:
        run = self._agent_run(input)
        return run is None or not run.agent_type.writable  # unknown: refused, no effect

    def write_scope(self, input: InputT, workspace: Path) -> tuple[Path, ...] | None:
        run = self._agent_run(input)
        if run is None or not run.agent_type.writable or run.write_paths is None:
            return None
        return lexical_scope(run.write_paths, workspace)

    def timeout_s(self, input: InputT) -> float:
        return math.inf


class DispatchAgentTool(AgentRunTool[DispatchAgentInput]):
    name: ClassVar[str] = SUBAGENT_TOOL
    facts: ClassVar[ToolFacts] = DISPATCH_AGENT_FACTS
    input_model: ClassVar[type[ToolInput]] = DispatchAgentInput
    description: ClassVar[str] = DESCRIPTION

    def __init__(
        self,
        *,
        runner: SubagentRunner,
        agent_types: Mapping[str, AgentType],
        tools: ToolRegistry,
        permission: PermissionFn,
        asker: Asker,
        assessor: Assessor | None = None,
        sidechain_root: Path | None = None,
        on_update: Callable[[SubagentUpdate], None] | None = None,
        context: str | None = None,
        hooks: HookRunner | None = None,
        max_stop_hook_blocks: int = 5,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        protected: Sequence[str] = (),
        tasks: TaskRegistry | None = None,
        session_id: str | None = None,
    ) -> None:
        """
        `runner`: where subagents run (the worker pool).
        `agent_types`: the session's types by name (`load_agent_types`).
        `tools`: the session's tools, to decide the subagents' calls with `permission`
        (a subagent only ever gets the tools its type names).
        `permission`, `asker`: the session's; asks are answered one at a time.
        `assessor`: the session's (`SessionPolicy.assessor`), so each subagent call is
        classified once, into its plan, before `permission` decides it.
        `sidechain_root`: the sessions directory; None writes no subagent transcripts.
        `on_update`: receives every `SubagentUpdate` (quick, must not raise).
        `context`: the main agent's context text (`ContextSnapshot.render`: git snapshot,
        memory files), the last system block of every subagent; gathered once per session,
        never again per subagent.
        `hooks`: the session's; its PreToolUse, PostToolUse and SubagentStop hooks fire for
        each subagent. `max_stop_hook_blocks`: SubagentStop blocks a subagent may take
        (`[limits]`, default 5).
        `output_cap`: characters of a subagent's MCP tool result (the session's
        `max_tool_output_chars`).
        `protected`: the policy's protected paths, besides the floor's (`DEFAULT_PROTECTED`),
        which no write scope may hold or lie in.
        `tasks`: the session's background tasks, where `run_in_background` agents run; None
        refuses them.
        `session_id`: the session's, whose earlier processes' agents (their sidechain
        transcripts) `SendMessage` may continue; None: none.
        """
        self._runner = runner
        self._types = dict(agent_types)
        if isinstance(runner, WarmsWriters) and any(t.writable for t in self._types.values()):
            runner.expect_writers()  # a writer's worker is warm before the first dispatch
        self._tools = tools
        self._permission = permission
        self._asker = asker
        self._assessor: Assessor = assessor or tool_assessor
        self._sidechain_root = sidechain_root
        self._on_update = on_update or _ignore
        self._context = context
        self._ask_lock = trio.Lock()
        self._hooks = hooks
        self._max_stop_hook_blocks = max_stop_hook_blocks
        self._output_cap = output_cap
        self._protected = (*(p.path for p in DEFAULT_PROTECTED), *protected)
        self._tasks = tasks
        self._agents: dict[str, AgentRecord] = {}
        self._outcomes = UntakenOutcomes()
        self._earlier: Path | None = (
            None
            if sidechain_root is None or session_id is None
            else sidechain_root / f"{session_id}.agents"
        )
        """Where the session's earlier processes' agents are, until first asked for (not at
        start-up: most sessions never send one a message)."""
        # The model is told which types exist, and they differ per session.
        self.description = DESCRIPTION + "\n".join(  # type: ignore[misc]
            [
                *(_describe(t) for t in self._types.values()),
                *([] if FORK in self._types else [f"- {FORK}: {FORK_DESCRIPTION}"]),
            ]
        )

    def input_schema(self) -> dict[str, Any]:
        """Claude Code's shape of the tool: `output_schema` is for Warren's callers only."""
        schema = super().input_schema()
        schema["properties"].pop("output_schema", None)
        return schema

    def take_outcome(self, tool_use_id: str) -> DispatchOutcome | None:
        """How the foreground dispatch of the call `tool_use_id` ended, once (it is dropped
        when taken); None for another id, a background dispatch, or a call refused before it
        started (orchestrator/agents/dispatch_outcome.py)."""
        return self._outcomes.take(tool_use_id)

    def _type_of(self, input: DispatchAgentInput) -> AgentType | None:
        agent_type = self._types.get(input.subagent_type)
        if agent_type is None and input.subagent_type == FORK:
            agent_type = fork_type(
                writable=input.write_paths is not None, available=self._tools.names()
            )
        if agent_type is not None and input.model is not None:
            agent_type = agent_type.model_copy(update={"model": resolve_model(input.model)})
        return agent_type

    def _agent_run(self, input: DispatchAgentInput) -> AgentRun | None:
        agent_type = self._type_of(input)
        return None if agent_type is None else AgentRun(agent_type, input.write_paths)

    async def validate(self, input: DispatchAgentInput, ctx: ToolContext) -> str | None:
        agent_type = self._type_of(input)
        if agent_type is None:
            return (
                f"There is no agent type {input.subagent_type!r}. Available types: "
                f"{', '.join(self._types)}. Call dispatch_agent again with one of them."
            )
        if agent_type.name == FORK and FORK not in self._types and CURRENT_TURN.get() is None:
            return "A fork starts from the main agent's conversation: only the main agent forks."
        if input.output_schema is not None:
            refusal = _refuse_output_schema(input, agent_type, builtin_fork=FORK not in self._types)
            if refusal is not None:
                return refusal
        if input.isolation is not None:
            return (
                f"isolation {input.isolation!r} is not supported: Warren confines a writing "
                "agent to its own directories instead. Leave isolation out and give the agent "
                "write_paths (the directories it may change); agents with disjoint write_paths "
                "run at the same time."
            )
        if input.run_in_background:
            if agent_type.writable:
                return (
                    f"run_in_background runs read-only agent types; {agent_type.name} may "
                    "write. Dispatch it without run_in_background (writers with disjoint "
                    "write_paths still run at the same time)."
                )
            if self._tasks is None:
                return "Background agents are not available in this session."
        if input.write_paths is None:
            return None
        if not agent_type.writable:
            return (
                f"write_paths is for agent types that may write; {agent_type.name} is "
                "read-only. Leave write_paths out, or dispatch a type that may write."
            )
        try:
            await trio.to_thread.run_sync(self._check_scope, input.write_paths, ctx)
        except ScopeError as exc:
            return exc.message
        return None

    def _check_scope(self, raw: Sequence[str], ctx: ToolContext) -> tuple[Path, ...]:
        return check_scope(
            raw, workspace=ctx.workspace, roots=_roots(ctx), protected=self._protected
        )

    async def call(
        self, input: DispatchAgentInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        agent_type = self._type_of(input)
        if agent_type is None:
            raise ToolError(f"There is no agent type {input.subagent_type!r}.")
        agent_id = f"agent-{uuid.uuid4().hex[:12]}"
        record = AgentRecord(
            agent_id,
            agent_type,
            " ".join(input.description.split()),
            input.name,
            input.write_paths,
            input.run_in_background,
        )
        self._agents[agent_id] = record
        if agent_type.name == FORK and FORK not in self._types:
            input = self._fork(input, agent_type, record)
        if input.run_in_background:
            yield self._start_in_background(input, record, ctx)
            return
        yield ToolProgress(f"{agent_id} ({agent_type.name}): {input.description}")
        yield await self._foreground(input, record, ctx)

    def _fork(
        self, input: DispatchAgentInput, agent_type: AgentType, record: AgentRecord
    ) -> DispatchAgentInput:
        """`record` made a fork of the main agent's turn (orchestrator/agents/fork.py); the
        input with the fork's instructions as its prompt."""
        turn, tool_use_id = CURRENT_TURN.get(), CURRENT_TOOL_USE_ID.get()
        if turn is None or tool_use_id is None:
            raise ToolError("A fork starts from the main agent's conversation: only it forks.")
        try:
            start = fork_start(turn, tool_use_id)
        except ValueError as exc:
            raise ToolError(f"The fork could not start: {exc}.") from None
        record.messages, record.fork, record.system = start.history, start.base, start.system
        scope = (
            None
            if input.write_paths is None
            else "You may change files only in: " + ", ".join(input.write_paths)
        )
        return input.model_copy(update={"prompt": fork_task(input.prompt, agent_type, scope)})

    # -- SendMessage (orchestrator/agents/send_message.py) --

    def agent(self, key: str) -> AgentRecord | None:
        """The subagent `key` names: its id, else the latest one given that name."""
        self._recall()
        record = self._agents.get(key)
        if record is None:
            named = [r for r in self._agents.values() if r.name == key]
            record = named[-1] if named else None
        return record

    def agents(self) -> list[AgentRecord]:
        self._recall()
        return list(self._agents.values())

    def _recall(self) -> None:
        """The agents of the session's earlier processes, ready to be continued, once: before
        this process's own (which their directory holds too, and which stay as they are)."""
        if self._earlier is None:
            return
        directory, self._earlier = self._earlier, None
        earlier = {agent.agent_id: agent for agent in stored_agents(directory, self._types)}
        self._agents = {**earlier, **self._agents}

    def refuse_continuing(self, record: AgentRecord, background: bool) -> str | None:
        """Why `record` cannot be continued now; None when it can."""
        if record.running:
            return (
                f"Agent {record.agent_id} ({record.description}) is still running; its report "
                "comes as its result or a <task-notification>. Send the message once it has "
                "finished."
            )
        if background and record.agent_type.writable:
            return (
                f"{record.agent_type.name} may write: continue it without run_in_background "
                "(writers run in the foreground)."
            )
        if background and self._tasks is None:
            return "Background agents are not available in this session."
        size = sum(m.api_size for m in record.messages)
        if size > MAX_CONTINUED_BYTES:
            return (
                f"Agent {record.agent_id}'s conversation is too large to continue "
                f"({size} bytes; at most {MAX_CONTINUED_BYTES}). Dispatch a new agent with "
                "what it needs to know."
            )
        return None

    async def continue_agent(
        self, record: AgentRecord, message: str, ctx: ToolContext, *, background: bool
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        """`record`'s agent again, its whole conversation followed by `message`, in a fresh
        worker of its type and write scope: its reply, or (`background`) its start.

        **Errors:** `ToolError` when it cannot be continued now (`refuse_continuing`).
        """
        refusal = self.refuse_continuing(record, background)
        if refusal is not None:
            raise ToolError(refusal)
        if record.stored is not None:  # an earlier process's: its conversation, read now
            try:
                record.messages = await trio.to_thread.run_sync(conversation, record.stored)
            except OSError as exc:
                raise ToolError(
                    f"Agent {record.agent_id}'s transcript cannot be read: {exc.strerror}."
                ) from None
            record.stored = None
            refusal = self.refuse_continuing(record, background)
            if refusal is not None:
                raise ToolError(refusal)
        input = DispatchAgentInput(
            description=record.description or "continued",
            prompt=message,
            subagent_type=record.agent_type.name,
            write_paths=record.write_paths,
            run_in_background=background,
            name=record.name,
        )
        record.running = True
        if background:
            yield self._start_in_background(input, record, ctx, continued=True)
            return
        yield ToolProgress(f"{record.agent_id} ({record.agent_type.name}): continued")
        yield (await self._run(input, record, ctx)).output

    def _start_in_background(
        self,
        input: DispatchAgentInput,
        record: AgentRecord,
        ctx: ToolContext,
        *,
        continued: bool = False,
    ) -> ToolOutput:
        """The agent as a task of the session (orchestrator/tasks/): this call returns now;
        the agent's report is its notification, at the main agent's next turn."""
        agent_type, agent_id = record.agent_type, record.agent_id
        if self._tasks is None:
            record.running = False
            raise ToolError("Background agents are not available in this session.")

        async def body(task: Task) -> TaskEnd:
            output = (await self._run(input, record, ctx)).output
            status: TaskStatus = "failed" if output.is_error else "completed"
            return TaskEnd(status, f'Agent "{task.description}" {status}', output.as_text())

        try:
            self._tasks.start(
                "agent",
                " ".join(input.description.split()),
                body,
                id=agent_id,
                name=input.name,
                tool_use_id=CURRENT_TOOL_USE_ID.get(),
            )
        except TaskError as exc:
            record.running = False
            raise ToolError(str(exc)) from None
        named = f" (named {input.name!r})" if input.name else ""
        started = "Continued" if continued else "Started"
        return ToolOutput(
            f"{started} agent {agent_id}{named} ({agent_type.name}: {input.description}) in the "
            "background. Go on with other work; its report comes as a <task-notification> "
            "at your next turn once it finishes. Do not wait or poll for it.",
            summary=f"{agent_id}: started in the background",
        )

    async def _foreground(
        self, input: DispatchAgentInput, record: AgentRecord, ctx: ToolContext
    ) -> ToolOutput:
        """A dispatch run to its end here: its tool_result, and its outcome kept for
        `take_outcome` under the call's tool_use_id, failed or not. With `output_schema`, an
        agent that ends without a valid structured output is continued once, its
        conversation kept (as `SendMessage` continues one), told what was wrong; the
        tool_result is then the value as JSON, or the call fails saying why.

        **Errors:** `ToolError` for the model (and in the outcome's `failed`).
        """
        key = CURRENT_TOOL_USE_ID.get()
        runs: list[_Ran] = []
        structured: StructuredOutput | None = None
        try:
            if input.output_schema is not None:
                try:
                    structured = StructuredOutput(input.output_schema)
                except ConfigError as exc:  # `validate` refuses it first: a caller that skipped it
                    raise ToolError(f"{exc} The dispatch was refused; nothing ran.") from None
                if record.fork is not None:  # its requests carry the main agent's tools only
                    raise ToolError(f"A fork cannot be offered {STRUCTURED_OUTPUT}.")
            runs.append(await self._run(input, record, ctx, structured))
            if structured is None:
                output = runs[-1].output
            else:
                if not structured.has_value and runs[-1].outcome.reason == "completed":
                    record.running = True
                    again = input.model_copy(update={"prompt": structured.continuation()})
                    runs.append(await self._run(again, record, ctx, structured))
                output = _structured_result(structured, runs[-1], continued=len(runs) > 1)
        except Exception as exc:  # a ToolError for the model, or a bug: the caller is told
            if key is not None:
                why = exc.message if isinstance(exc, ToolError) else f"{type(exc).__name__}: {exc}"
                self._outcomes.put(key, _outcome(record, runs, structured, why))
            raise
        if key is not None:
            failed = output.as_text() if output.is_error else None
            self._outcomes.put(key, _outcome(record, runs, structured, failed))
        return output

    async def _run(
        self,
        input: DispatchAgentInput,
        record: AgentRecord,
        ctx: ToolContext,
        structured: StructuredOutput | None = None,
    ) -> _Ran:
        """One subagent run, to its end: its scope made and hashed, its transcript written,
        its conversation kept in `record` (continued from what it holds), its tool_result
        (the final text, or what happened) with its outcome and changes. `structured`: the
        dispatch's StructuredOutput, served to the agent beside its MCP tools."""
        history = tuple(record.messages)
        conversation = [*history, Message.user_text(input.prompt)]
        try:
            return await self._run_agent(input, record, ctx, history, conversation, structured)
        finally:
            record.messages = conversation
            record.running = False

    async def _run_agent(
        self,
        input: DispatchAgentInput,
        record: AgentRecord,
        ctx: ToolContext,
        history: tuple[Message, ...],
        conversation: list[Message],
        structured: StructuredOutput | None,
    ) -> _Ran:
        agent_type, agent_id = record.agent_type, record.agent_id

        def on_event(update: SubagentEvent) -> None:
            if transcript is not None:
                _record(transcript, update)
            match update.event:
                case AssistantTurn(turn=turn):
                    conversation.append(turn.message)
                case ToolResultsMessage(message=message):
                    conversation.append(message)
                case _:
                    pass
            self._on_update(update)

        scope: tuple[Path, ...] = ()
        before = after = ScopeHashes({}, complete=True)
        if agent_type.writable and input.write_paths is not None:
            try:
                scope = await trio.to_thread.run_sync(self._open_scope, input.write_paths, ctx)
            except ScopeError as exc:
                raise ToolError(exc.message) from exc
            before = await trio.to_thread.run_sync(hash_scope, scope)
        # First: it waits for the servers the type names, whose tools the hooks then plan.
        mcp = await self._agent_mcp(agent_type, ctx, agent_id, on_event)
        served: SubagentMcp | None = mcp
        if structured is not None:
            served = ServedTools(structured, mcp)
            structured.begin_run()
        transcript = self._open_sidechain(ctx, agent_id, agent_type, input)
        hooks = self._agent_hooks(agent_id, agent_type, transcript)
        system = (
            list(record.system)
            if record.system is not None  # a fork's: the main agent's, byte for byte
            else [
                *agent_type.system_blocks(workspace=ctx.workspace, cwd=ctx.cwd),
                *([_scope_note(scope)] if scope else []),
                *([STRUCTURED_SYSTEM_NOTE] if structured is not None else []),
                *([self._context] if self._context else []),
            ]
        )
        request = SubagentRequest(
            agent_id=agent_id,
            agent_type=agent_type,
            prompt=input.prompt,
            system=system,
            hooks=hooks,
            mcp=served,
            write_paths=scope,
            history=history,
            fork=record.fork,
        )
        if record.fork is not None:  # a continued fork's breakpoints are its own
            record.fork = replace(record.fork, prefix=0)
        self._on_update(
            SubagentStarted(
                agent_id,
                agent_type.name,
                input.description,
                None if transcript is None else transcript.path,
                CURRENT_TOOL_USE_ID.get(),
            )
        )
        try:
            who = f"subagent {agent_id} ({' '.join(input.description.split())})"
            outcome = await self._runner.run(
                request,
                on_event=on_event,
                permission=self._decider(agent_type, ctx, hooks, who, mcp, structured),
            )
            changes: list[FileChange] = []
            if scope:
                with trio.CancelScope(shield=True):  # what it changed is known, even now
                    after = await trio.to_thread.run_sync(hash_scope, scope)
                changes = scope_changes(before, after)
                # Changed under the main agent's feet: it must read them again to edit them.
                ctx.read_ledger.apply({}, [c.path for c in changes])
            if transcript is not None:
                value = MISSING if structured is None else structured.value
                transcript.write(_result_line(outcome, changes, value))
        finally:
            if transcript is not None:
                transcript.close()
        self._on_update(SubagentFinished(outcome))
        output = _tool_output(outcome, agent_type)
        if scope:
            note = _changes_note(changes, before.complete and after.complete)
            output = replace(output, content=f"{output.as_text()}\n\n{note}")
        return _Ran(output, outcome, tuple(changes))

    def _open_scope(self, raw: Sequence[str], ctx: ToolContext) -> tuple[Path, ...]:
        scope = self._check_scope(raw, ctx)
        open_scope(scope, _roots(ctx))
        return scope

    def render_use(self, input: DispatchAgentInput) -> str:
        return f"dispatch_agent({input.subagent_type}: {' '.join(input.description.split())})"

    def _agent_hooks(
        self, agent_id: str, agent_type: AgentType, transcript: Transcript | None
    ) -> AgentHooks | None:
        """The session's hooks for one subagent; None when it has none a subagent fires."""
        if self._hooks is None:
            return None
        from orchestrator.agents.hooks import AgentHooks

        hooks = AgentHooks(
            self._hooks,
            agent_id=agent_id,
            tools=ToolRegistry(t for t in self._tools if agent_type.allows(t.name)),
            assessor=self._assessor,
            max_stop_blocks=self._max_stop_hook_blocks,
            transcript=None if transcript is None else str(transcript.path),
        )
        return hooks if hooks.events else None

    async def _agent_mcp(
        self,
        agent_type: AgentType,
        ctx: ToolContext,
        agent_id: str,
        on_event: Callable[[SubagentEvent], None],
    ) -> AgentMcp | None:
        """The subagent's MCP tools, when its type names some and the session has servers."""
        if not any(t.startswith("mcp__") for t in agent_type.tools):
            return None
        from orchestrator.agents.mcp import agent_mcp

        return await agent_mcp(
            self._tools,
            agent_type,
            ctx,
            output_cap=self._output_cap,
            emit=lambda event: on_event(SubagentEvent(agent_id, event)),
        )

    def _decider(
        self,
        agent_type: AgentType,
        ctx: ToolContext,
        hooks: AgentHooks | None,
        who: str,
        mcp: AgentMcp | None = None,
        structured: StructuredOutput | None = None,
    ) -> SubagentPermission:
        """The final answer for each tool call of one subagent: the policy's, narrowed by
        the call's PreToolUse hooks as the pipeline narrows the main agent's
        (`ToolPipeline._decide`). An ask goes to the session's asker labelled with `who`
        (the subagent's id and description). An allowed MCP call is granted to `mcp`, which
        runs it. A StructuredOutput call of a run that has it (`structured`) is allowed as
        it is: it touches nothing (orchestrator/agents/structured.py)."""

        async def decide(name: str, raw: dict[str, Any]) -> Allow | Deny:
            if structured is not None and name == STRUCTURED_OUTPUT:
                return Allow(rule=STRUCTURED_OUTPUT_RULE)
            answer = await decide_only(name, raw)
            if isinstance(answer, Allow) and mcp is not None and name.startswith("mcp__"):
                mcp.grant(name, raw if answer.updated_input is None else answer.updated_input)
            return answer

        async def recheck(
            answer: Allow | Deny, tool: Tool[Any], block: ToolUseBlock
        ) -> Allow | Deny:
            """An input the asker rewrote is another call: the policy decides it again, so
            the rewrite cannot take it past a deny rule (as `ToolPipeline` does for the main
            agent; the worker takes this answer as final)."""
            if not isinstance(answer, Allow) or answer.updated_input in (None, block.input):
                return answer
            rewritten = tool.parse_input(answer.updated_input)
            again = await self._permission(plan_call(block, tool, rewritten, self._assessor), ctx)
            return again if isinstance(again, Deny) else answer

        async def decide_only(name: str, raw: dict[str, Any]) -> Allow | Deny:
            tool = self._tools.get(name) if agent_type.allows(name) else None
            if tool is None:
                return Deny(
                    f"{name} is not one of the tools of a {agent_type.name} agent "
                    f"({', '.join(agent_type.tools)}).",
                    rule=f"agent type {agent_type.name}",
                )
            try:
                parsed = tool.parse_input(raw)
                block = ToolUseBlock(id=f"{agent_type.name}:{name}", name=name, input=raw)
                result = await self._permission(plan_call(block, tool, parsed, self._assessor), ctx)
                if hooks is not None:
                    asked, verdict = hooks.take_verdict(name, raw)
                    if not asked:
                        return Deny(
                            f"This {name} call's PreToolUse hooks were not run; it was not run.",
                            rule="PreToolUse hook",
                        )
                    if verdict == "ask" and isinstance(result, Allow):
                        result = Ask(
                            "A PreToolUse hook asks for confirmation.", rule="PreToolUse hook"
                        )
                    elif verdict == "allow" and isinstance(result, Ask):
                        return Allow(rule="PreToolUse hook: allow")
                if isinstance(result, Ask):
                    async with self._ask_lock:
                        answer = await self._asker(tool, parsed, replace(result, agent=who))
                    return await recheck(answer, tool, block)
                return result
            except pydantic.ValidationError:
                return Deny(f"The input of this {name} call is invalid; it was not run.")
            except Exception as exc:
                return Deny(f"The permission check failed ({exc}); the call was not run.")

        return decide

    def _open_sidechain(
        self, ctx: ToolContext, agent_id: str, agent_type: AgentType, input: DispatchAgentInput
    ) -> Transcript | None:
        if self._sidechain_root is None:
            return None
        path = sidechain_path(self._sidechain_root, ctx.session_id, agent_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            transcript = Transcript(path, agent_id, path.open("a", encoding="utf-8"))
        except OSError as exc:
            raise ToolError(f"Could not create the subagent's transcript {path}: {exc}") from exc
        transcript.write(
            {
                "type": "subagent",
                "agent_id": agent_id,
                "agent_type": agent_type.name,
                "description": input.description,
                "parent_session_id": ctx.session_id,
                "cwd": str(ctx.cwd),
                # What a resumed session needs to continue it (orchestrator/agents/recall.py).
                "name": input.name,
                "write_paths": input.write_paths,
                "background": input.run_in_background,
                "model": agent_type.model,
                "fork": agent_type.name == FORK and FORK not in self._types,
            }
        )
        transcript.message(Message.user_text(input.prompt))
        return transcript


def _ignore(update: SubagentUpdate) -> None:
    pass


def _refuse_output_schema(
    input: DispatchAgentInput, agent_type: AgentType, *, builtin_fork: bool
) -> str | None:
    """Why a dispatch with `output_schema` cannot run; None when it can."""
    try:
        output_validator(input.output_schema)
    except ConfigError as exc:
        return f"{exc} The dispatch was refused; nothing ran."
    if input.run_in_background:
        return (
            "output_schema is for foreground dispatches: the value is taken when the call "
            "returns. Leave run_in_background out."
        )
    if builtin_fork and agent_type.name == FORK:
        return (
            "A fork's requests carry the main agent's tools, so it cannot be offered "
            f"{STRUCTURED_OUTPUT}: give output_schema to another agent type."
        )
    return None


def _structured_result(structured: StructuredOutput, ran: _Ran, *, continued: bool) -> ToolOutput:
    """The tool_result of a dispatch with `output_schema`: its value as JSON.

    **Errors:** `ToolError` saying why there is none.
    """
    value = structured.value
    if value is not MISSING:
        return ToolOutput(
            json.dumps(value, ensure_ascii=False),
            summary=f"{ran.outcome.agent_id}: structured output",
        )
    why = structured.why_missing()
    if ran.outcome.reason != "completed":
        why += f"\n\nIts run ended early ({ran.outcome.reason}): {ran.output.as_text()}"
    again = " (it was continued once to give it)" if continued else ""
    raise ToolError(f"The subagent's output did not match the schema{again}: {why}")


def _outcome(
    record: AgentRecord,
    runs: Sequence[_Ran],
    structured: StructuredOutput | None,
    failed: str | None,
) -> DispatchOutcome:
    """A foreground dispatch's `DispatchOutcome`, from its runs (none: it failed first)."""
    last = runs[-1].outcome if runs else None
    return DispatchOutcome(
        agent_id=record.agent_id,
        agent_type=record.agent_type.name,
        text="" if last is None else last.result,
        value=MISSING if structured is None else structured.value,
        reason=None if last is None else last.reason,
        runs=len(runs),
        usage=sum((r.outcome.usage for r in runs), Usage()),
        cost_usd=None if last is None else sum(r.outcome.cost_usd for r in runs),
        changes=_merged_changes(runs),
        failed=failed,
    )


def _merged_changes(runs: Sequence[_Ran]) -> tuple[FileChange, ...]:
    """The changes of consecutive runs as one: each file from before the first to after the
    last (a file changed back is no change)."""
    if len(runs) == 1:
        return runs[0].changes
    before: dict[Path, str | None] = {}
    after: dict[Path, str | None] = {}
    for ran in runs:
        for change in ran.changes:
            before.setdefault(change.path, change.before)
            after[change.path] = change.after
    return tuple(FileChange(p, before[p], after[p]) for p in before if before[p] != after[p])


def _describe(agent_type: AgentType) -> str:
    access = "may write files" if agent_type.writable else "read-only"
    return (
        f"- {agent_type.name}: {agent_type.description} "
        f"(tools: {', '.join(agent_type.tools)}; {access})"
    )


def _record(transcript: Transcript, update: SubagentEvent) -> None:
    match update.event:
        case AssistantTurn(turn=turn):
            transcript.message(turn.message)
        case ToolResultsMessage(message=message):
            transcript.message(message)
        case RetryScheduled() as retry:
            transcript.write(
                {
                    "type": "retry",
                    "attempt": retry.attempt,
                    "delay_s": retry.delay_s,
                    "error": retry.error,
                }
            )
        case _:
            pass


def _roots(ctx: ToolContext) -> tuple[Path, ...]:
    return tuple(Path(os.path.realpath(root)) for root in ctx.roots())


def _scope_note(scope: tuple[Path, ...]) -> str:
    return (
        "You may change files only under these directories (your write scope): "
        + ", ".join(str(p) for p in scope)
        + ". Everything else is read-only: a write there fails with 'Read-only file system'."
    )


MAX_CHANGES_LISTED = 50
"""Changed files listed in a scoped writer's tool_result; more are counted."""


def _changes_note(changes: list[FileChange], complete: bool) -> str:
    """The files a scoped writer changed, with sha256 before and after, for the model."""
    if not changes:
        text = "Files changed in the write scope: none."
    else:
        lines = [
            f"- {c.path}: {_kind(c)} (sha256 {c.before or '-'} -> {c.after or '-'})"
            for c in changes[:MAX_CHANGES_LISTED]
        ]
        if len(changes) > MAX_CHANGES_LISTED:
            lines.append(f"- ... and {len(changes) - MAX_CHANGES_LISTED} more")
        text = (
            f"Files changed in the write scope ({len(changes)}), measured on disk; Read a "
            "file again before you edit it:\n" + "\n".join(lines)
        )
    if not complete:
        text += "\n(The scope was too large to hash whole: this list may be incomplete.)"
    return text


def _kind(change: FileChange) -> str:
    if change.before is None:
        return "created"
    return "deleted" if change.after is None else "modified"


def _result_line(
    outcome: SubagentOutcome,
    changes: Sequence[FileChange] = (),
    value: dict[str, Any] | Missing = MISSING,
) -> dict[str, Any]:
    return {
        "type": "result",
        "reason": outcome.reason,
        "result": outcome.result,
        "num_turns": outcome.num_turns,
        "usage": outcome.usage.model_dump(),
        "total_cost_usd": outcome.cost_usd,
        "worker_pid": outcome.worker_pid,
        **({"worker_node": outcome.worker_node} if outcome.worker_node else {}),
        **({"snapshot": outcome.snapshot} if outcome.snapshot else {}),
        "ts_end": round(time.time(), 3),
        **({} if value is MISSING else {"structured_output": value}),
        **(
            {
                "changes": [
                    {"path": str(c.path), "before": c.before, "after": c.after} for c in changes
                ]
            }
            if changes
            else {}
        ),
    }


def _usage_note(outcome: SubagentOutcome, agent_type: AgentType) -> str:
    usage = outcome.usage
    return (
        f"[{outcome.agent_id} ({agent_type.name}): {outcome.reason}, {outcome.num_turns} turns, "
        f"{outcome.duration_s:.1f} s; tokens: {usage.input_tokens} in, {usage.output_tokens} "
        f"out, {usage.cache_read_input_tokens} cache read; cost ${outcome.cost_usd:.4f}"
        + (f"; ran on {outcome.worker_node}" if outcome.worker_node else "")
        + (f", workspace snapshot {outcome.snapshot}" if outcome.snapshot else "")
        + "]"
    )


def _tool_output(outcome: SubagentOutcome, agent_type: AgentType) -> ToolOutput:
    """The tool_result: the final text and usage, or what happened, for the model."""
    note = _usage_note(outcome, agent_type)
    summary = f"{outcome.agent_id}: {outcome.reason}, {outcome.num_turns} turns"
    result = outcome.result.strip()
    match outcome.reason:
        case "completed":
            return ToolOutput(f"{result or '(no report)'}\n\n{note}", summary=summary)
        case "max_turns":
            text = (
                f"The subagent stopped at its limit of {agent_type.max_turns} turns before it "
                f"finished. Its last message was:\n{result or '(none)'}"
            )
        case "model_error" | "prompt_too_long":
            text = f"The subagent's model request failed, so it stopped: {result}"
        case "budget_exceeded":
            text = (
                f"The subagent stopped because the session's model budget is used up: {result} "
                "Do not dispatch more agents; finish with what you have."
            )
        case "interrupted":
            text = f"The subagent was interrupted before it finished: {result}"
        case "output_truncated":
            text = (
                "The subagent's reply stayed cut at its output token limit, so its report is "
                f"incomplete. What it wrote:\n{result or '(none)'}"
            )
        case "io_error":
            text = f"The subagent stopped because Warren could not write its state: {result}"
        case "permission_denied" | "hook_blocked":
            text = f"The subagent stopped: {result}"
        case "worker_crashed" | "worker_limit" | "worker_protocol" | "worker_unavailable":
            text = (
                f"The subagent did not finish. {result} Its work so far is lost; dispatch it "
                "again (perhaps with a narrower task) or do the work yourself."
            )
        case _:
            assert_never(outcome.reason)
    return ToolOutput(f"{text}\n\n{note}", is_error=True, summary=summary)
