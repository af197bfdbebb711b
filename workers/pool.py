"""The worker pool: subagents in warm, sandboxed worker processes, each held to its limits.

`WorkerPool` implements `orchestrator.agents.types.SubagentRunner`. Each subagent runs in its own
`workers.agent_worker` process started under the OS floor (`SandboxedSpawner`): the workspace
read-only, or writable when the agent type may write (the dispatch_agent call of such a type
was allowed by the permission function before it got here). At most `max_workers` subagents
run at once; more wait for a worker.

A scoped writer (`SubagentRequest.write_paths`) runs beside other writers on one promise: it
can write only beneath its scope. The kernel keeps that promise, one of two ways:

- Landlock (`scopes="auto"`, the kernel has ABI >= 2, no writable root beneath the sandbox's
  /tmp or /dev/shm): a warm writable worker in which nothing has run is sent `Confine` and
  restricts itself (sandbox/landlock.py) before `RunAgent`: every write-type access denied
  but beneath the scope and its private scratch directories; a rename or link across the
  scope's edge denied (REFER). The restriction binds the worker and everything it starts
  (Bash) and cannot be lifted, so the worker is never reused: killed after its answer, and
  a fresh warm writer started in its place. Reads stay as the mounts say. A worker that
  cannot confine itself is stopped and the scope mounted instead;
- mounts (`scopes="mount"` or `WARREN_SCOPES=mount`, or Landlock missing): a fresh worker
  whose bwrap mounts the roots read-only and only the scope writable; a cold start per
  dispatch (tests/bench/bench_parallel_writers.py compares the two).

Both keep the floor's protected names read-only inside a scope, and both pass the same
attacks (tests/workers/test_scoped_writers_e2e.py). The scope is hashed by the coordinator
only once the worker's sandbox is gone.

Lifecycle of a worker:

- started eagerly when the pool opens (`start="eager"`), or when first needed (`"lazy"`);
  either way the slow part (interpreter, imports) is done before a dispatch reaches it;
- reused for the next subagent when its run ended normally and its agent type cannot leave
  state behind (a read-only type, Bash included: the workspace is read-only, nothing a
  command starts outlives its call, and the worker empties its private /tmp and /dev/shm
  after each run, saying in `AgentResult.leftover` when it could not); otherwise stopped,
  and a fresh worker is started in its place, so the pool stays warm: writable while fewer
  writers are ready than wanted (`warm_writers`, or the most scoped writers the session ran
  at once) and the session has a writable agent type (`expect_writers`; a session without
  one never starts a writer ahead), else read-only;
- killed when a run passes a limit: wall time, memory (resident set of its whole process tree,
  read from /proc), CPU time of the tree, the size of its logs or output, or too many
  lines that are not protocol messages; the run ends with a `worker_*` reason saying which;
- restarted after a crash; the run it was doing ends with `worker_crashed`.

While a run goes on, the pool serves the worker: model requests stream through the
`ModelBroker` (the coordinator's one client, with the session's limits), permission asks go to
the session's permission function, hook asks to the session's hooks for the run
(`SubagentRequest.hooks`, run here, in the coordinator), MCP tool calls to the run's
`SubagentRequest.mcp` (the session's servers, never one per worker), and the run's events go to
`on_event`.

A worker runs model-chosen code next to its tools, so nothing it sends is trusted
(`_admit`): a model request must carry the system prompt the coordinator sent for the run and
only tools of the agent type (whose descriptions and schemas are the coordinator's own, not the
worker's; for MCP tools, those the run started with); its `max_tokens` is clamped to the
run's (the model's output limit: the run's loop asks for the model's default and retries a cut
tool call up to the limit); a run makes
at most `max_turns` of its agent type and `max_model_requests` (default 200) requests. A
request that breaks one of these is refused and the worker killed, so the subagent ends with
`worker_protocol` or `worker_limit`, saying why; the main agent goes on.

Cancelling a run (the main agent interrupted) sends `Cancel`; the worker interrupts its loop
and answers, or is killed after `cancel_wait_s`. Closing the pool stops every worker
(`Shutdown`, then the sandbox's SIGTERM, SIGKILL and reaping, shielded and bounded); bwrap's
`--die-with-parent` and pid namespace take every worker down with a coordinator that crashes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pydantic
import structlog
import trio
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentHooks,
    SubagentOutcome,
    SubagentPermission,
    SubagentRequest,
    WorkerFailure,
)
from orchestrator.aio import closing_iter
from orchestrator.calls.permissions import Allow, Deny
from orchestrator.errors import ModelError, WarrenError
from orchestrator.messages import Message
from orchestrator.model.base import BlockComplete, MessageComplete, ModelRequest, Retry, ToolSpec
from orchestrator.model.catalog import default_max_tokens, output_limit
from sandbox.limits import tree_usage
from workers import protocol as wire
from workers.agent_worker import DEFAULT_TOOLS
from workers.broker import ModelBroker
from workers.child import (
    SEND_TIMEOUT_S,
    ChildGone,
    ChildStarter,
    ChildStartError,
    HostLaunch,
    HostProcess,
    HostSpawner,
    RemoteHostProcess,
    SupervisedChild,
)
from workers.entry import load_tools_factory

if TYPE_CHECKING:
    from orchestrator.hooks.runner import HookOutcome

__all__ = [
    "DEFAULT_MAX_MODEL_REQUESTS",
    "PoolOptions",
    "WorkerPool",
    "WorkerStartError",
    "open_worker_pool",
    "tree_usage",
]

_MiB = 1024**2

DEFAULT_MAX_MODEL_REQUESTS = 200
"""Model requests one subagent run may make, whatever its agent type's `max_turns`."""

WARM_START_ATTEMPTS = 3
"""Tries of a warm (background) worker start: one that fails or times out (twenty remote
workers starting at once on a loaded cluster can take longer than `start_timeout_s`) is tried
again, so the pool still has the worker ready when a run comes, instead of a cold start on
the run's path."""
WARM_START_BACKOFF_S = 1.0
"""Pause before the second try of a warm start; doubled before each later one."""


class PoolOptions(BaseModel):
    """How many workers, when they start, and the limits of each subagent run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_workers: int = Field(default=10, ge=1, le=64)
    """Worker processes (so subagents running at once). Default 10."""
    start: Literal["lazy", "eager"] = "lazy"
    """`eager`: start `max_workers` read-only workers when the pool opens; `lazy` (default):
    start each when first needed. Either way a worker stays warm between runs."""
    wall_time_s: float | None = Field(default=600.0, gt=0)
    """Seconds a subagent run may take. Default 600."""
    max_memory_bytes: int | None = Field(default=2048 * _MiB, gt=0)
    """Resident memory of a worker's whole process tree. Default 2 GiB."""
    max_cpu_s: float | None = Field(default=600.0, gt=0)
    """CPU seconds a worker's process tree may use in one run. Default 600."""
    max_log_bytes: int = Field(default=1 * _MiB, gt=0)
    """Bytes of stderr (logs) a worker may write in one run. Default 1 MiB."""
    max_output_bytes: int = Field(default=256 * _MiB, gt=0)
    """Bytes of protocol output a worker may write in one run. Default 256 MiB."""
    max_malformed_lines: int = Field(default=20, ge=0)
    """Lines that are not protocol messages a worker may write in one run. Default 20."""
    monitor_interval_s: float = Field(default=0.5, gt=0)
    """How often memory and CPU are measured, in seconds. Default 0.5."""
    start_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a worker has to send `Ready`. Default 30."""
    cancel_wait_s: float = Field(default=5.0, gt=0)
    """Seconds a cancelled run has to answer before its worker is killed. Default 5."""
    stop_grace_s: float = Field(default=2.0, gt=0)
    """Seconds a worker has to exit after `Shutdown` before it is terminated. Default 2."""
    thinking_budget: int | None = Field(default=None, ge=1)
    """Extended thinking's budget per response of every subagent (the session's
    `max_thinking_tokens`). Default None: subagents do not use extended thinking."""
    max_model_requests: int = Field(default=DEFAULT_MAX_MODEL_REQUESTS, ge=1)
    """Model requests one subagent run may make (also capped by its agent type's
    `max_turns`); one more is refused and the run ends with `worker_limit`. Default 200."""
    scopes: Literal["auto", "mount"] = "auto"
    """How a scoped writer is held to its scope (both ways by the kernel): `auto` (default),
    a warm writable worker restricts itself with Landlock when the kernel has ABI 2 or later,
    else as `mount`; `mount`, a fresh worker whose sandbox mounts only the scope writable.
    `WARREN_SCOPES=mount` sets `mount` for a session (orchestrator/cli/wiring.py)."""
    zygote: Literal["auto", "off"] = "auto"
    """`auto` (default): with the floor's spawner (`SandboxedSpawner`), read-only workers are
    forked from a warm zygote, each in namespaces of its own (workers/zygote.py), at about a
    third of a fresh worker's memory (tests/bench/bench_pool.py); fresh workers when the
    zygote cannot be made (the log says why). `off`: every worker a fresh interpreter.
    `WARREN_ZYGOTE=off` sets `off`."""
    warm_writers: int = Field(default=1, ge=0, le=64)
    """Writable workers kept ready, within `max_workers`, once `expect_writers` says the
    session has an agent type that may write; once the session ran more scoped writers at
    once, that many. Default 1."""


class WorkerStartError(WarrenError):
    """A worker could not be started (the sandbox failed, or it never said `Ready`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(eq=False)
class _Worker(SupervisedChild):
    """One worker process as the pool sees it (a `SupervisedChild`)."""

    writable: bool = False
    confined: bool = False
    """It restricted itself to a scope (Landlock): never reused, the restriction stays."""
    max_log_bytes: int = 1 * _MiB
    """Bytes of stderr it may write in one run before it is killed."""
    inbox: trio.MemorySendChannel[wire.Message] = field(init=False)
    messages: trio.MemoryReceiveChannel[wire.Message] = field(init=False)
    """What the worker sent, in order; closed when its stdout ends."""
    outbox: trio.MemorySendChannel[bytes] = field(init=False)
    outgoing: trio.MemoryReceiveChannel[bytes] = field(init=False)
    """What we send it, in order, written by the pool's writer task for this worker."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """Cancelled to stop the worker (its task then shuts it down)."""
    failure: tuple[WorkerFailure, str] | None = None
    """Why the pool killed it during the current run."""
    answered: bool = False
    """The current run ended in the worker with an `AgentResult`."""
    malformed: int = 0
    log_bytes: int = 0
    output_bytes: int = 0

    def __post_init__(self) -> None:
        self.inbox, self.messages = trio.open_memory_channel[wire.Message](64)
        self.outbox, self.outgoing = trio.open_memory_channel[bytes](math.inf)

    def post(self, message: pydantic.BaseModel) -> None:
        """Queue a message for the worker. Dropped once the worker is stopping; a dead worker
        is noticed by its reader, not here."""
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self.outbox.send_nowait(wire.encode(message))

    async def write(self, data: bytes) -> bool:
        """Write whole lines (`SupervisedChild.send_bytes`: shielded, a wedged worker is
        killed). False when the worker is gone."""
        try:
            await self.send_bytes(data)
        except ChildGone:
            return False
        return True

    def wedged(self) -> None:
        self.kill("worker_protocol", f"it took no input for {SEND_TIMEOUT_S:g} s")

    def accept_log_line(self, size: int) -> bool:
        self.log_bytes += size
        if self.log_bytes <= self.max_log_bytes:
            return True
        if self.alive:
            self.kill("worker_limit", f"it wrote more than {self.max_log_bytes} bytes of logs")
        return False

    def kill(self, failure: WorkerFailure, text: str) -> None:
        """Kill the whole sandbox for `failure`; the first reason given is kept."""
        if self.failure is None:
            self.failure = (failure, text)
        self.process.kill()


@dataclass
class _Run:
    """The pool's side of one subagent run."""

    request: SubagentRequest
    model: str
    """The model that answers the run."""
    max_tokens: int
    """The model's output limit: no request of the run may ask for more."""
    history: list[Message] = field(default_factory=list)
    """The messages of the agent's last model request (they arrive as deltas)."""
    model_requests: int = 0
    """Model requests the worker sent for this run so far."""
    mcp_specs: dict[str, ToolSpec] = field(default_factory=dict)
    """The MCP tools offered to the run (`RunAgent.mcp_tools`), by name."""

    def model_request(self, message: wire.ModelRequest, admitted: ModelRequest) -> ModelRequest:
        """The full request: `admitted`'s system, tools and max_tokens (see `WorkerPool._admit`)
        with the history the worker's delta `message` makes."""
        if message.keep > len(self.history):
            raise ValueError(
                f"keeps {message.keep} messages of a previous request that had {len(self.history)}"
            )
        self.history = [*self.history[: message.keep], *message.messages]
        return ModelRequest(
            system=admitted.system,
            messages=list(self.history),
            tools=admitted.tools,
            max_tokens=admitted.max_tokens,
            thinking_budget=admitted.thinking_budget,
            breakpoints_at=admitted.breakpoints_at,
        )


class _Refused(Exception):
    """A worker's model request breaks what the coordinator allows its run."""

    def __init__(self, kind: WorkerFailure, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


_NORMAL_ENDS = frozenset(
    {
        "completed",
        "max_turns",
        "interrupted",
        "model_error",
        "prompt_too_long",
        "budget_exceeded",
        "permission_denied",
        "hook_blocked",
    }
)
"""Terminal reasons of a run that ended inside a healthy worker."""


class WorkerPool:
    """Runs subagents in pooled worker processes. Create with `open_worker_pool`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        broker: ModelBroker,
        workspace: Path,
        cwd: Path | None = None,
        extra_roots: tuple[Path, ...] = (),
        spawner: HostSpawner | None = None,
        options: PoolOptions | None = None,
        tools: str = DEFAULT_TOOLS,
        python: Path | None = None,
    ) -> None:
        """
        `broker`: answers the workers' model requests.
        `workspace`, `cwd`, `extra_roots`: what every worker is started with.
        `spawner`: starts a worker process (default `SandboxedSpawner()`, the floor's
        defaults without a wall-time limit: the pool applies its own per run).
        `tools`: `MODULE:FUNCTION` giving a worker's `ToolRegistry` for its role.
        `python`: the workers' interpreter (default: ours, so the same venv).
        """
        if spawner is None:
            from workers.toolhost_runner import SandboxedSpawner

            spawner = SandboxedSpawner()
        self._nursery = nursery
        self._broker = broker
        self._workspace = workspace
        self._cwd = cwd or workspace
        self._extra_roots = extra_roots
        self._spawner = spawner
        self.options = options or PoolOptions()
        self._tools = tools
        self._python = python or Path(sys.executable)
        self._slots = trio.CapacityLimiter(self.options.max_workers)
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._idle_writers: list[_Worker] = []
        """Idle writable workers: nothing has run in them, so a scoped writer may confine one."""
        self._starting = {False: 0, True: 0}
        """Idle workers being started in the background, read-only (False) and writable."""
        self._writers_wanted = 0
        """Writable workers to keep ready (`expect_writers`; grown by `_note_scoped`)."""
        self._scoped_running = 0
        """Scoped writers running now (their most at once sets how many writers stay warm)."""
        self._confines = 0
        self._shunned: list[Callable[[HostProcess], bool]] = []
        """Workers no run is given to (`shun`)."""
        from sandbox.landlock import MIN_ABI, abi, beneath_scratch

        self.landlock = (
            self.options.scopes == "auto"
            and abi() >= MIN_ABI
            and not any(beneath_scratch(r.resolve()) for r in (workspace, *extra_roots))
        )
        """Scoped writers are confined with Landlock (else their scopes are mounted): the
        kernel has it, and no writable root lies beneath the sandbox's private /tmp or
        /dev/shm, whose rules would cover it (sandbox/landlock.py)."""
        self._live = 0
        """Workers started or starting, not yet told to stop."""
        self._changed = trio.Event()
        self._closing = False
        self._log = structlog.get_logger().bind(component="worker_pool")
        self._launches = {
            writable: HostLaunch.of_module(
                "workers.agent_worker",
                python=python or Path(sys.executable),
                role="read_write" if writable else "read_only",
                workspace=workspace,
                cwd=cwd or workspace,
                extra_roots=extra_roots,
                tools=tools,
            )
            for writable in (False, True)
        }
        """What a worker is started with, read-only (False) or writable (True)."""
        max_log = self.options.max_log_bytes
        self._starter = ChildStarter(
            nursery,
            spawner,
            lambda process, launch: _Worker(
                process, "a worker", writable=launch.writable, max_log_bytes=max_log
            ),
            label=lambda launch: "a worker",
            serve=self._serve_worker,
            log=self._log,
            kind="worker",
            start_timeout_s=self.options.start_timeout_s,
            stop_grace_s=self.options.stop_grace_s,
            on_ready=self._ready,
            on_stopping=_close_channels,
            on_stopped=self._replace,  # it died (or was stopped, then this does nothing)
        )
        self._specs: dict[wire.HostRole, dict[str, ToolSpec]] = {}

    # -- SubagentRunner ---------------------------------------------------------------------

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome:
        """Run one subagent in a worker to its end.

        **Cancellation:** the worker is sent `Cancel` and given `cancel_wait_s` to stop the run
        (shielded), or killed; then `Cancelled` propagates.
        **Errors:** none: a worker that cannot start, dies or passes a limit is an outcome
        (`worker_*`).
        """
        started = time.monotonic()
        agent_id = request.agent_id
        async with self._slots, self._note_scoped(bool(request.write_paths)):
            try:
                worker = await self._checkout(request.agent_type.writable, request.write_paths)
            except WorkerStartError as exc:
                text = f"No worker could be started for the subagent: {exc.message}."
                return SubagentOutcome(agent_id, "worker_unavailable", text)
            remote = worker.process if isinstance(worker.process, RemoteHostProcess) else None
            snapshot: str | None = None
            result: wire.AgentResult | None = None
            try:
                if remote is not None:
                    snapshot = await self._prepare(worker, remote)
                if worker.failure is None:
                    model = request.agent_type.model or self._broker.model
                    run = _Run(request, model=model, max_tokens=output_limit(model))
                    result = await self._drive(worker, run, on_event, permission)
            finally:  # after a cancelled run too: a worker that answered is kept
                reusable = worker.answered and worker.alive and worker.failure is None
                reusable = reusable and not worker.confined
                if result is not None and result.leftover is not None:
                    self._log.info("worker not reused", agent_id=agent_id, left=result.leftover)
                    reusable = False
                self._checkin(worker, reusable and not request.agent_type.leaves_state)
        if request.write_paths:
            # Its scope is hashed once we return: nothing of its sandbox may still be writing.
            # It is never reused, and has said all it had to: killed, not shut down (the
            # interpreter's exit took a second under load, on every writer's critical path).
            worker.process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(3 * self.options.stop_grace_s):
                await worker.process.wait()
        pid = worker.process.pid
        where = None if remote is None else remote.where
        if result is not None and worker.failure is None:  # a killed worker's answer is moot
            return SubagentOutcome(
                agent_id,
                result.reason,
                result.result,
                result.num_turns,
                result.usage,
                result.cost_usd,
                time.monotonic() - started,
                pid,
                worker_node=where,
                snapshot=snapshot,
            )
        with trio.move_on_after(self.options.stop_grace_s):
            await worker.process.wait()  # so the status below is known
        if worker.failure is not None:
            kind, text = (
                worker.failure[0],
                f"The subagent's worker was killed: {worker.failure[1]}.",
            )
        else:
            kind, text = "worker_crashed", f"The subagent's worker died ({worker.status()})."
        return SubagentOutcome(
            agent_id,
            kind,
            text,
            duration_s=time.monotonic() - started,
            worker_pid=pid,
            worker_node=where,
            snapshot=snapshot,
        )

    # -- one run ----------------------------------------------------------------------------

    async def _prepare(self, worker: _Worker, remote: RemoteHostProcess) -> str | None:
        """Bring a remote worker's view of the workspace up to date before its run (it is
        idle now); the snapshot id it will see. A worker that cannot be updated is killed
        (`worker_unavailable`)."""
        try:
            return await remote.prepare_run()
        except OSError as exc:
            worker.kill("worker_unavailable", f"its workspace snapshot could not be updated: {exc}")
            return None

    async def _drive(
        self,
        worker: _Worker,
        run: _Run,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> wire.AgentResult | None:
        """Serve the worker through one run; its `AgentResult`, or None when it died."""
        request = run.request
        worker.failure = None
        worker.answered = False
        worker.malformed = worker.log_bytes = worker.output_bytes = 0
        if request.mcp is not None:
            run.mcp_specs = {spec.name: spec for spec in request.mcp.specs()}
        message = wire.RunAgent(
            id=request.agent_id,
            prompt=request.prompt,
            history=list(request.history),
            system=request.system,
            tools=list(request.agent_type.tools),
            model=run.model,
            max_turns=request.agent_type.max_turns,
            max_tokens=default_max_tokens(run.model),
            thinking_budget=self.options.thinking_budget,
            mcp_tools=list(run.mcp_specs.values()),
            **(
                {}
                if request.hooks is None
                else {
                    "hook_events": sorted(request.hooks.events),
                    "max_stop_hook_blocks": request.hooks.max_stop_blocks,
                }
            ),
        )
        worker.post(message)
        result: wire.AgentResult | None = None
        finished = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_limits, worker)
            try:
                with trio.move_on_after(self.options.wall_time_s or math.inf) as wall:
                    result = await self._serve(worker, run, nursery, on_event, permission)
                if wall.cancelled_caught:
                    worker.kill(
                        "worker_limit",
                        f"it ran longer than the wall-time limit of {self.options.wall_time_s:g} s",
                    )
                finished = True
            finally:
                if not finished:  # cancelled from outside: stop the run, keep the worker
                    with trio.CancelScope(shield=True):
                        result = await self._cancel(worker, run)
                worker.answered = result is not None and result.reason in _NORMAL_ENDS
                nursery.cancel_scope.cancel()
        return result

    async def _serve(
        self,
        worker: _Worker,
        run: _Run,
        nursery: trio.Nursery,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> wire.AgentResult | None:
        agent_id = run.request.agent_id
        async for message in worker.messages:
            match message:
                case wire.AgentResult(id=done) if done == agent_id:
                    return message
                case wire.AgentEvent(id=source) if source == agent_id:
                    event = message.event()
                    if event is not None:
                        on_event(SubagentEvent(agent_id, event, worker.process.pid))
                case wire.ModelRequest(agent=source) if source == agent_id:
                    nursery.start_soon(self._serve_model, worker, run, message)
                case wire.PermissionAsk(agent=source) if source == agent_id:
                    nursery.start_soon(self._answer, worker, message, permission)
                case wire.HookAsk(agent=source) if source == agent_id:
                    nursery.start_soon(self._answer_hook, worker, message, run.request.hooks)
                case wire.McpCall(agent=source) if source == agent_id:
                    nursery.start_soon(self._answer_mcp, worker, message, run)
                case wire.Malformed(detail=detail):
                    self._log.warning("worker rejected a line", agent_id=agent_id, detail=detail)
                case _:
                    self._log.debug("stale or unexpected message", type=message.type)
        return None

    async def _serve_model(self, worker: _Worker, run: _Run, message: wire.ModelRequest) -> None:
        """Stream one model request through the broker, back to the worker."""
        try:
            request = self._admit(worker, run, message)
        except _Refused as refused:
            text = f"it sent a model request the coordinator refused: {refused.text}"
            worker.post(wire.ModelFailed(id=message.id, message=f"Refused: {refused.text}"))
            worker.kill(refused.kind, text)
            self._log.warning("model request refused", agent_id=message.agent, why=refused.text)
            return
        try:
            request = run.model_request(message, request)
        except ValueError as exc:
            worker.post(wire.ModelFailed(id=message.id, message=f"Malformed model request: {exc}"))
            return
        model = run.request.agent_type.model
        try:
            stream = self._broker.stream(request, model=model, subagent=True)
            async with closing_iter(stream) as events:
                async for event in events:
                    match event:
                        case BlockComplete() | Retry():
                            worker.post(wire.ModelEvent.of(message.id, event))
                        case MessageComplete(message=done):
                            worker.post(wire.ModelDone.of(message.id, done))
                            return
                        case _:
                            pass  # text deltas: the complete block follows
        except ModelError as exc:
            worker.post(
                wire.ModelFailed(
                    id=message.id, message=exc.message, reason=exc.reason, status=exc.status
                )
            )

    def _admit(self, worker: _Worker, run: _Run, message: wire.ModelRequest) -> ModelRequest:
        """What of `message` the coordinator sends on (messages aside): the run's own system
        prompt, the coordinator's specs of the tools the worker named, `max_tokens` clamped to
        the run's. Raises `_Refused` for a request over the run's count, with another system
        prompt, or naming a tool its agent type does not have."""
        agent_type = run.request.agent_type
        run.model_requests += 1
        cap = min(agent_type.max_turns, self.options.max_model_requests)
        if run.model_requests > cap:
            raise _Refused(
                "worker_limit",
                f"request {run.model_requests} is over the run's limit of {cap} model requests",
            )
        if message.system != run.request.system:
            raise _Refused("worker_protocol", "its system prompt is not the agent type's")
        fork = run.request.fork
        if fork is not None:  # the main agent's tools and limits, whatever the worker has
            return ModelRequest(
                system=list(run.request.system),
                messages=[],
                tools=list(fork.tools),
                max_tokens=fork.max_tokens,
                thinking_budget=fork.thinking_budget,
                breakpoints_at=tuple(
                    p for p in (fork.prefix - 2, fork.prefix - 1) if p >= 0
                )
                if fork.prefix and run.model_requests == 1
                else None,
            )
        names = [spec.name for spec in message.tools]
        known = {**self._tool_specs(worker.writable), **run.mcp_specs}
        extra = sorted(
            {
                name
                for name in names
                if name not in known or (name not in agent_type.tools and name not in run.mcp_specs)
            }
        )
        if extra:
            raise _Refused(
                "worker_protocol",
                f"it offers tools its agent type {agent_type.name!r} does not have: "
                + ", ".join(repr(name) for name in extra),
            )
        if len(set(names)) != len(names):
            raise _Refused("worker_protocol", "it offers the same tool twice")
        return ModelRequest(
            system=list(run.request.system),
            messages=[],
            tools=[known[name] for name in names],
            max_tokens=min(message.max_tokens, run.max_tokens),
            # Never more thinking than the session allows, and none unless it allows some.
            thinking_budget=None
            if self.options.thinking_budget is None or message.thinking_budget is None
            else min(message.thinking_budget, self.options.thinking_budget),
        )

    def _tool_specs(self, writable: bool) -> dict[str, ToolSpec]:
        """The specs of the tools a worker of this role has, built here from the same
        `--tools` factory (once per role), so a worker cannot rewrite a tool's description."""
        role: wire.HostRole = "read_write" if writable else "read_only"
        specs = self._specs.get(role)
        if specs is None:
            registry = load_tools_factory(self._tools)(role)
            specs = self._specs[role] = {spec.name: spec for spec in registry.specs()}
        return specs

    async def _answer(
        self, worker: _Worker, message: wire.PermissionAsk, permission: SubagentPermission
    ) -> None:
        try:
            decision: Allow | Deny = await permission(message.tool, message.input)
        except Exception as exc:
            decision = Deny(f"The permission check failed ({exc}); the call was not run.")
        reply = (
            wire.PermissionReply(
                id=message.id,
                allow=True,
                rule=decision.rule,
                updated_input=decision.updated_input,
            )
            if isinstance(decision, Allow)
            else wire.PermissionReply(
                id=message.id, allow=False, message=decision.message, rule=decision.rule
            )
        )
        worker.post(reply)

    async def _answer_hook(
        self, worker: _Worker, message: wire.HookAsk, hooks: SubagentHooks | None
    ) -> None:
        """Run the session's hooks for a subagent's call or end. An event the run was not
        told of has no hooks: the empty answer."""
        if hooks is None or message.event not in hooks.events:
            worker.post(wire.HookReply(id=message.id))
            return
        try:
            match message.event:
                case "PreToolUse":
                    outcome = await hooks.pre_tool_use(
                        message.tool, message.input, message.tool_use_id
                    )
                case "PostToolUse":
                    outcome = await hooks.post_tool_use(
                        message.tool, message.input, message.tool_use_id, message.response
                    )
                case "SubagentStop":
                    outcome = await hooks.subagent_stop(active=message.stop_hook_active)
        except Exception as exc:  # the runner reports hook failures as values; this is a bug
            self._log.error("hooks failed", agent_id=message.agent, error=repr(exc))
            deny = message.event == "PreToolUse"
            why = f"The hooks could not run ({exc}); the call was not run." if deny else None
            worker.post(wire.HookReply(id=message.id, deny=deny, message=why))
            return
        worker.post(_hook_reply(message.id, outcome))

    async def _answer_mcp(self, worker: _Worker, message: wire.McpCall, run: _Run) -> None:
        """Run a call of a tool the coordinator serves the subagent (`SubagentRequest.mcp`:
        an MCP tool, which runs only a call its permission answer allowed, or
        StructuredOutput)."""
        mcp = run.request.mcp
        if mcp is None:
            why = f"{message.tool} is not one of this agent's tools; it was not run."
            worker.post(wire.McpResult(id=message.id, content=why, is_error=True))
            return
        output = await mcp.call(message.tool, message.input)
        worker.post(wire.McpResult(id=message.id, content=output.content, is_error=output.is_error))

    async def _cancel(self, worker: _Worker, run: _Run) -> wire.AgentResult | None:
        """Ask the worker to interrupt the run and wait (bounded) for its result; kill it if
        none comes. Called shielded."""
        agent_id = run.request.agent_id
        if not worker.alive:
            return None
        with trio.move_on_after(self.options.cancel_wait_s):
            worker.post(wire.Cancel(id=agent_id))
            async for message in worker.messages:
                if isinstance(message, wire.AgentResult) and message.id == agent_id:
                    return message
                if isinstance(
                    message, wire.ModelRequest | wire.PermissionAsk | wire.HookAsk | wire.McpCall
                ):
                    self._refuse(worker, message)
            return None
        worker.kill("worker_limit", f"it did not stop within {self.options.cancel_wait_s:g} s")
        return None

    @staticmethod
    def _refuse(
        worker: _Worker,
        message: wire.ModelRequest | wire.PermissionAsk | wire.HookAsk | wire.McpCall,
    ) -> None:
        stopping = "The subagent is being stopped."
        match message:
            case wire.ModelRequest():
                worker.post(wire.ModelFailed(id=message.id, message=stopping))
            case wire.PermissionAsk():
                worker.post(wire.PermissionReply(id=message.id, allow=False, message=stopping))
            case wire.HookAsk():
                worker.post(wire.HookReply(id=message.id, deny=True, message=stopping))
            case wire.McpCall():
                worker.post(wire.McpResult(id=message.id, content=stopping, is_error=True))

    async def _watch_limits(self, worker: _Worker) -> None:
        """Kill the worker when its process tree passes the memory or CPU limit."""
        options = self.options
        if options.max_memory_bytes is None and options.max_cpu_s is None:
            return
        process = worker.process
        remote = process if isinstance(process, RemoteHostProcess) else None

        async def measure() -> tuple[int, float] | None:
            # A remote worker's pid is its node's: it is measured there.
            return tree_usage(process.pid) if remote is None else await remote.usage()

        first = await measure()
        if first is None:
            return
        while True:
            await trio.sleep(options.monitor_interval_s)
            usage = await measure()
            if usage is None:
                return
            rss, cpu = usage
            if options.max_memory_bytes is not None and rss > options.max_memory_bytes:
                worker.kill(
                    "worker_limit",
                    f"its processes used {rss // _MiB} MiB of memory, over the limit of "
                    f"{options.max_memory_bytes // _MiB} MiB",
                )
                return
            if options.max_cpu_s is not None and cpu - first[1] > options.max_cpu_s:
                worker.kill(
                    "worker_limit",
                    f"it used more than {options.max_cpu_s:g} s of CPU time",
                )
                return

    # -- workers ----------------------------------------------------------------------------

    def worker_pids(self) -> list[int]:
        """Host pids of the live workers' sandboxes (bwrap), busy or idle."""
        return [w.process.pid for w in self._workers if w.alive]

    @property
    def idle_writers(self) -> int:
        """Writable workers ready for a run right now (nothing ran in them)."""
        return sum(1 for w in self._idle_writers if w.alive)

    @property
    def idle(self) -> int:
        """Workers ready for a run right now, read-only and writable."""
        return sum(1 for w in (*self._idle, *self._idle_writers) if w.alive)

    def expect_writers(self) -> None:
        """The session has an agent type that may write: keep `warm_writers` writable workers
        ready from now on, started in the background within `max_workers` (an idle read-only
        worker makes room). A warm one serves an unscoped writer as a fresh one would, and a
        scoped writer under Landlock; a session without writers never pays for them."""
        if self._writers_wanted or self._closing:
            return
        self._writers_wanted = self.options.warm_writers
        for _ in range(self._writers_wanted):
            if self._live >= self.options.max_workers and self._idle:
                self._retire(self._idle[0])
            self._nursery.start_soon(self._start_idle)

    @contextlib.asynccontextmanager
    async def _note_scoped(self, scoped: bool) -> AsyncIterator[None]:
        """Count a scoped writer while it runs. A session that ran N at once keeps N writable
        workers warm from then on (at most `max_workers`, never fewer than `warm_writers`):
        its next batch of scoped writers then starts without a cold worker on its path."""
        if not scoped:
            yield
            return
        self._scoped_running += 1
        wanted = min(self._scoped_running, self.options.max_workers)
        self._writers_wanted = max(self._writers_wanted, wanted)
        try:
            yield
        finally:
            self._scoped_running -= 1

    def start_soon(self, count: int | None = None) -> None:
        """Start up to `count` (default `max_workers`) read-only workers in the background."""
        for _ in range(count if count is not None else self.options.max_workers):
            self._nursery.start_soon(self._start_idle)

    async def wait_idle(self, count: int, *, writers: int = 0) -> None:
        """Wait until `count` workers are ready, `writers` of them writable (tests and
        benchmarks)."""
        while self.idle < count or self.idle_writers < writers:
            await self._wait_changed()

    async def _checkout(self, writable: bool, write_paths: tuple[Path, ...] = ()) -> _Worker:
        """A worker for one run: an idle one of its kind, else a fresh one. A scoped writer
        gets a writable worker confined to its scope (Landlock), or, under mounts, a fresh
        worker whose sandbox has only its scope writable."""
        if not (writable and write_paths):
            return await self._take(writable)
        if not self.landlock:
            return await self._fresh(write_paths)
        return await self._confine(await self._take(True), write_paths)

    async def _take(self, writable: bool) -> _Worker:
        idle, others = (
            (self._idle_writers, self._idle) if writable else (self._idle, self._idle_writers)
        )
        while True:
            while idle:
                worker = idle.pop()
                if not worker.alive:
                    continue
                if not self._shunned_worker(worker):
                    return worker
                self._retire(worker)
            if self._starting[writable]:
                await self._wait_changed()  # one of its kind is nearly ready: sooner than new
                continue
            if self._live < self.options.max_workers:
                return await self._start(self._launches[writable])
            if others:
                self._retire(others[0])
                continue
            await self._wait_changed()

    async def _fresh(self, write_paths: tuple[Path, ...]) -> _Worker:
        """A new worker whose sandbox mounts only `write_paths` writable."""
        launch = dataclasses.replace(self._launches[True], write_paths=write_paths)
        while True:
            if self._live < self.options.max_workers:
                return await self._start(launch)
            if self._idle or self._idle_writers:
                self._retire((self._idle or self._idle_writers)[0])
                continue
            await self._wait_changed()

    async def _confine(self, worker: _Worker, write_paths: tuple[Path, ...]) -> _Worker:
        """Have a writable worker in which nothing ran restrict itself to writing beneath
        `write_paths` (`Confine`; sandbox/landlock.py) before its run. If it cannot, it is
        stopped and a fresh worker with only the scope mounted writable serves instead."""
        self._confines += 1
        request_id = f"confine-{self._confines}"
        worker.post(wire.Confine(id=request_id, write_paths=[str(p) for p in write_paths]))
        why = f"it did not answer within {self.options.start_timeout_s:g} s"
        try:
            with trio.move_on_after(self.options.start_timeout_s):
                async for message in worker.messages:
                    if isinstance(message, wire.Confined) and message.id == request_id:
                        if message.error is None:
                            worker.confined = True
                            return worker
                        why = message.error
                        break
                else:
                    why = "it died"
        finally:
            if not worker.confined:  # refused, dead, or the run cancelled meanwhile
                self._retire(worker)
        self._log.warning("worker not confined; mounting the scope instead", error=why)
        return await self._fresh(write_paths)

    def _checkin(self, worker: _Worker, reusable: bool) -> None:
        if reusable and not self._closing:
            (self._idle_writers if worker.writable else self._idle).append(worker)
            self._notify()
        else:
            self._replace(worker)

    def _replace(self, worker: _Worker) -> None:
        """Stop `worker` and start a fresh one (writable while `expect_writers` wants more,
        else read-only), so the pool stays warm."""
        if self._retire(worker) and not self._closing:
            self._nursery.start_soon(self._start_idle)

    def shun(self, unwanted: Callable[[HostProcess], bool]) -> None:
        """From now on, give no run to a warm worker whose process is `unwanted` (a remote
        pool's workers on a node that lost one): idle ones are stopped now and replaced, one
        still starting is stopped when a run would take it. A worker started for a run that
        is waiting is not checked (the spawner decides where it goes)."""
        self._shunned.append(unwanted)
        for worker in [*self._idle, *self._idle_writers]:
            if unwanted(worker.process) and self._retire(worker):
                self._nursery.start_soon(self._start_idle)

    def _shunned_worker(self, worker: _Worker) -> bool:
        return any(unwanted(worker.process) for unwanted in self._shunned)

    def _retire(self, worker: _Worker) -> bool:
        """Stop `worker` (its task shuts it down); False if it was retired already."""
        worker.scope.cancel()
        for idle in (self._idle, self._idle_writers):
            if worker in idle:
                idle.remove(worker)
        if worker not in self._workers:
            return False
        self._workers.discard(worker)
        self._live -= 1
        self._notify()
        return True

    async def _start_idle(self) -> None:
        """Start a warm worker; one that fails or times out is tried again
        (`WARM_START_ATTEMPTS`, with backoff) while the pool still has room for it. During a
        pause it does not count as starting: a run that comes meanwhile starts its own."""
        for attempt in range(WARM_START_ATTEMPTS):
            if attempt:
                with trio.move_on_after(WARM_START_BACKOFF_S * 2 ** (attempt - 1)):
                    while not self._closing:  # the pool's close ends the pause
                        await self._wait_changed()
            if self._live >= self.options.max_workers or self._closing:
                return
            ready = len(self._idle_writers) + self._starting[True]
            writable = ready < self._writers_wanted
            self._starting[writable] += 1
            try:
                worker = await self._start(self._launches[writable])
            except WorkerStartError as exc:
                last = attempt + 1 == WARM_START_ATTEMPTS
                self._log.warning(
                    "worker failed to start", error=exc.message, attempt=attempt + 1, last=last
                )
                continue
            finally:
                self._starting[writable] -= 1
                self._notify()
            (self._idle_writers if writable else self._idle).append(worker)
            self._notify()
            return

    async def _start(self, launch: HostLaunch) -> _Worker:
        self._live += 1
        started = False
        try:
            try:
                worker = await self._starter.start(launch)
            except ChildStartError as exc:
                raise WorkerStartError(exc.message) from exc
            started = True
            return worker
        finally:
            if not started:
                self._live -= 1
                self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    def _ready(self, worker: _Worker) -> None:
        self._workers.add(worker)
        self._nursery.start_soon(self._write, worker)

    async def _serve_worker(self, worker: _Worker, reader: wire.LineReader) -> None:
        with worker.scope:
            await self._read(worker, reader)

    async def _write(self, worker: _Worker) -> None:
        """Send what is queued for the worker; whatever queued up meanwhile goes in the same
        write (a block and the end of the message, say), so the worker wakes once for it."""
        async for line in worker.outgoing:
            lines = [line]
            while True:
                try:
                    lines.append(worker.outgoing.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            if not await worker.write(b"".join(lines)):
                return

    async def _read(self, worker: _Worker, reader: wire.LineReader) -> None:
        """Route the worker's messages to the run being served, until its stdout ends."""
        options = self.options
        while (line := await reader.next()) is not None:
            size = line.size if isinstance(line, wire.Oversized) else len(line)
            worker.output_bytes += size
            if worker.output_bytes > options.max_output_bytes:
                worker.kill(
                    "worker_limit",
                    f"it wrote more than {options.max_output_bytes} bytes of output in one run",
                )
                continue
            message = wire.decode_line(line) if isinstance(line, bytes) else None
            if message is None or isinstance(message, wire.ProtocolError):
                worker.malformed += 1
                detail = "an oversized line" if message is None else message.detail
                if worker.malformed <= 3:
                    self._log.warning("malformed line from worker", detail=detail)
                if worker.malformed > options.max_malformed_lines and worker.failure is None:
                    worker.kill(
                        "worker_protocol",
                        f"it wrote {worker.malformed} lines that are not protocol messages "
                        f"(the last: {detail[:200]})",
                    )
                continue
            await worker.inbox.send(message)

    async def aclose(self) -> None:
        """Stop every worker (the pool's nursery then reaps them)."""
        self._closing = True
        for worker in list(self._workers):
            self._retire(worker)
        self._notify()


def _hook_reply(request_id: str, outcome: HookOutcome) -> wire.HookReply:
    """What the worker acts on of the hooks' merged answer. PreToolUse's allow/ask is not
    sent: the coordinator applies it to the call's permission answer
    (orchestrator/agents/hooks.py)."""
    return wire.HookReply(
        id=request_id,
        deny=outcome.permission == "deny",
        message=outcome.permission_reason,
        rule=" ".join(outcome.deciders) or None,
        blocked=outcome.blocked,
        reasons=list(outcome.reasons),
        updated_input=outcome.updated_input,
        context=list(outcome.context),
        stop=outcome.stop,
        stop_reason=outcome.stop_reason,
    )


def _close_channels(worker: _Worker) -> None:
    """The worker is stopping: the run being served sees its end, queued messages drop."""
    worker.inbox.close()
    worker.outbox.close()


@asynccontextmanager
async def open_worker_pool(
    *,
    broker: ModelBroker,
    workspace: Path,
    cwd: Path | None = None,
    extra_roots: tuple[Path, ...] = (),
    spawner: HostSpawner | None = None,
    options: PoolOptions | None = None,
    tools: str = DEFAULT_TOOLS,
) -> AsyncIterator[WorkerPool]:
    """A `WorkerPool` whose workers live as long as the `async with` block.

    **Cancellation:** leaving the block (normally, by error or cancellation) stops every
    worker, concurrently, shielded and bounded by about three times `stop_grace_s`.
    """
    from workers.toolhost_runner import SandboxedSpawner

    options = options or PoolOptions()
    if spawner is None:
        spawner = SandboxedSpawner()
    async with trio.open_nursery() as nursery:
        zygote = None
        if options.zygote == "auto" and type(spawner) is SandboxedSpawner:
            from workers.zygote_spawner import ZygoteSpawner

            spawner = zygote = ZygoteSpawner(spawner, nursery)
        pool = WorkerPool(
            nursery,
            broker=broker,
            workspace=workspace,
            cwd=cwd,
            extra_roots=extra_roots,
            spawner=spawner,
            options=options,
            tools=tools,
        )
        if pool.options.start == "eager":
            pool.start_soon()
        try:
            yield pool
        finally:
            await pool.aclose()
            if zygote is not None:
                await zygote.aclose()
            nursery.cancel_scope.cancel()
