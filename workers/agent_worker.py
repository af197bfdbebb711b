"""The agent worker: a pooled, sandboxed process that runs one subagent at a time.

    python -m workers.agent_worker --workspace /repo [--role read_only] [--cwd DIR]
        [--extra-root DIR]... [--tools MODULE:FUNCTION]

The pool (`workers.pool`) starts it under the OS floor, with the workspace read-only unless the
agent type may write, and sends it `RunAgent`. The worker runs the same `run_loop` as the main
agent, with the agent type's tools executed here, inside its own sandbox. What the sandbox must
not hold stays with the coordinator and is borrowed over the wire protocol:

- the model: `BrokeredModel` sends each request upward (`ModelRequest`) and yields the
  events that come back, so the API key and the network never enter the sandbox;
- permissions: `forwarding_permission` asks the coordinator, whose policy (and user, or
  headless deny) answers every tool call; the policy files are not even readable here;
- hooks: for the events the coordinator has hooks for (`RunAgent.hook_events`), the run's
  pipeline and loop ask the coordinator to run them (`workers.agent_hooks`); a run without
  hooks sends no hook message and does not even import the hooks layer;
- MCP tools: the ones the coordinator offers the run (`RunAgent.mcp_tools`) are called there,
  where the session's servers run (`workers.agent_mcp`); a worker never starts a server.

A read-only worker is reused for the next run (`AgentType.leaves_state`), Bash included: its
commands are one-shots whose processes die with their calls (`sandbox.process.orphans`), and
after each run it empties its sandbox's private /tmp and /dev/shm (`sandbox.scratch`), or says
in `AgentResult.leftover` what stays, and the pool replaces it.

Everything the worker sends goes through one queue, in order, so a run's events always reach
the coordinator before its `AgentResult`. Start-up does the slow work (imports, the message
adapter, the tools' JSON schemas) before `Ready`, so a dispatch to a warm worker reaches its
first model request in milliseconds (tests/bench/bench_pool.py).

Stdin/stdout are taken over as in the tool host (a stray print or a child process cannot
corrupt the stream); logs are JSON lines on stderr. The worker imports no more than it needs:
an idle one is mostly the interpreter, trio and pydantic (tests/bench/bench_pool.py, c). It
exits on `Shutdown`, end of stdin or SIGTERM, interrupting the run in progress.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import sys
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.permissions import Allow, Ask, Deny, PermissionFn, PermissionResult
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.plan import CallPlan
from orchestrator.conversation.loop import LoopConfig, RunControl, run_loop
from orchestrator.conversation.repair import normalize_for_api
from orchestrator.errors import ModelError
from orchestrator.events import Event
from orchestrator.messages import Message
from orchestrator.model.base import (
    BlockComplete,
    MessageComplete,
    ModelEvent,
    ModelRequest,
    Retry,
    ToolSpec,
)
from orchestrator.model.scripted import ScriptedModel
from orchestrator.tools.base import Tool, ToolContext, ToolInput
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from workers import protocol as wire
from workers.entry import (
    exit_now,
    load_tools_factory,
    make_undumpable,
    serve_until_sigterm,
    take_protocol,
)

if TYPE_CHECKING:  # imported by a run with hooks only (workers/agent_hooks.py)
    from orchestrator.hooks.runner import HookRunner

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DEFAULT_TOOLS",
    "AgentWorker",
    "BrokeredModel",
    "forwarding_permission",
    "main",
    "worker_tools",
]

DEFAULT_TOOLS = "workers.agent_worker:worker_tools"
"""The `--tools` factory used when none is given: the built-in tools."""

CLOSE_TIMEOUT_S = 10.0
"""Seconds a run's resources (a shell) and the worker's queued messages get to close on exit."""


def worker_tools(role: wire.HostRole) -> ToolRegistry:
    """The built-in tools; Bash without `run_in_background` (a worker keeps no tasks). In a
    read-only worker every Bash command counts as read-only and runs in a one-shot shell,
    concurrently: the read-only workspace is what makes that safe, and nothing a command
    starts outlives its call (`sandbox.process.orphans`). Which commands run at all is the
    coordinator's policy's decision (`forwarding_permission`), not this classification."""
    if role == "read_only":
        return builtin_tools(
            bash_classifier=lambda _command: True, backgrounds=False, persistent_shell=False
        )
    return builtin_tools(backgrounds=False)


def log(event: str, level: str = "info", **fields: Any) -> None:
    """One JSON line on stderr, which the pool relays into the coordinator's log. Not
    structlog: importing it (and asyncio with it) would add 3 MB to every idle worker."""
    record = {"event": event, "level": level, **fields}
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()


_Reply = (
    wire.ModelEvent
    | wire.ModelDone
    | wire.ModelFailed
    | wire.PermissionReply
    | wire.HookReply
    | wire.McpResult
)
R = TypeVar("R", bound=pydantic.BaseModel)


class AgentWorker:
    """Serves one coordinator: runs agents one at a time, routes the answers they wait for.

    `tools` holds every tool an agent type may name; `send` writes one encoded line.
    """

    def __init__(
        self,
        *,
        tools: ToolRegistry,
        workspace: Path,
        cwd: Path,
        extra_roots: tuple[Path, ...] = (),
        role: wire.HostRole = "read_only",
        send: Callable[[bytes], Awaitable[None]],
        scratch: tuple[Path, ...] = (),
    ) -> None:
        self.tools = tools
        self.workspace = workspace
        self.cwd = cwd
        self.extra_roots = extra_roots
        self.role = role
        # The specs are the same for every run; building them is most of a run's set-up.
        self._specs = {spec.name: spec for spec in tools.specs()}
        self._send_bytes = send
        self._outbox, self._outgoing = trio.open_memory_channel[pydantic.BaseModel](math.inf)
        self._pending: dict[str, trio.MemorySendChannel[_Reply]] = {}
        self._ids = itertools.count(1)
        self._running: tuple[str, RunControl] | None = None
        self._run_done = trio.Event()
        self._serving = trio.CancelScope()
        self._ran = False
        """An agent has run here: too late to confine the worker (`Confine`)."""
        self._scratch = scratch
        """The sandbox's private scratch directories, emptied after each run; only ever
        what `sandbox.scratch.private_scratch` found (none outside a sandbox)."""

    # -- plumbing used by the run's model and permission function -------------------------------

    def post(self, message: pydantic.BaseModel) -> None:
        """Queue a message for the coordinator (sent in order by one writer task); dropped
        once the worker is stopping and has closed its queue."""
        with contextlib.suppress(trio.ClosedResourceError):
            self._outbox.send_nowait(message)

    def expect(self, prefix: str) -> tuple[str, trio.MemoryReceiveChannel[_Reply]]:
        """A fresh request id and the channel its answers will arrive on."""
        request_id = f"{prefix}{next(self._ids)}"
        send, receive = trio.open_memory_channel[_Reply](math.inf)
        self._pending[request_id] = send
        return request_id, receive

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    async def asked(self, prefix: str, question: pydantic.BaseModel, reply: type[R]) -> R | None:
        """Send `question` to the coordinator under a fresh id (its own `id` replaced) and
        return the first answer of type `reply` to it; None when the answers end first."""
        request_id, replies = self.expect(prefix)
        try:
            self.post(question.model_copy(update={"id": request_id}))
            async for answer in replies:
                if isinstance(answer, reply):
                    return answer
            return None
        finally:
            self.forget(request_id)

    async def rehearse(self) -> None:
        """One run in process, before `Ready`: a Think call then an answer, from a scripted
        model, with every wire message it would send or receive encoded and decoded. The first
        run of a fresh process pays for lazily built validators and serializers and first-time
        code paths; paid here, a dispatch does not (tests/bench/bench_pool.py)."""
        from orchestrator.model.scripted import ScriptedModel, ScriptedTurn

        think = {"type": "tool_use", "name": "Think", "input": {"thought": "warm up"}}
        model = ScriptedModel(
            [
                ScriptedTurn.model_validate({"content": [think]}),
                ScriptedTurn.model_validate({"content": [{"type": "text", "text": "done"}]}),
            ]
        )
        tools = _Tools([t for t in self.tools if t.name == "Think"], self._specs)
        ctx = ToolContext(workspace=self.workspace, cwd=self.cwd, session_id="rehearsal")

        async def allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
            _round_trip(wire.PermissionAsk(id="p", agent="r", tool=plan.block.name, input={}))
            _round_trip(wire.PermissionReply(id="p", allow=True))
            return Allow()

        def emit(event: Event) -> None:
            wired = wire.AgentEvent.of("rehearsal", event)
            if wired is not None:
                _round_trip(wired)

        run = await run_loop(
            model=_Rehearsed(model),
            messages=[Message.user_text("rehearsal")],
            pipeline=ToolPipeline(
                tools=tools, ctx=ctx, permission=allow, asker=_unresolved_ask, emit=emit
            ),
            config=LoopConfig(max_turns=2),
            emit=emit,
        )
        _round_trip(wire.RunAgent(id="r", prompt="", system=[], tools=[], model="", max_turns=1))
        _round_trip(wire.AgentResult(id="r", reason=run.reason, result="", num_turns=1))
        await ctx.aclose()

    # -- serving --------------------------------------------------------------------------------

    async def serve(self, reader: wire.LineReader) -> None:
        """Announce `Ready`, then answer messages until `Shutdown` or end of input; then
        interrupt the run in progress and write what it still has to say (bounded).

        **Cancellation:** everything stops at once (SIGTERM).
        """
        async with trio.open_nursery() as nursery:
            self._serving = nursery.cancel_scope
            nursery.start_soon(self._write)
            self.post(
                wire.Ready(
                    version=wire.PROTOCOL_VERSION,
                    pid=os.getpid(),
                    role=self.role,
                    workspace=str(self.workspace),
                    tools=self.tools.names(),
                )
            )
            await self._receive(reader, nursery)
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                if self._running is not None:
                    self._running[1].interrupt()
                    await self._run_done.wait()
            self._outbox.close()  # the writer ends once everything queued is written

    async def _write(self) -> None:
        async for message in self._outgoing:
            # Whatever else is queued goes in the same write: a tool call's events come in a
            # burst, and one write wakes the coordinator once (tests/bench/bench_pool.py, b).
            lines = [wire.encode(message)]
            while True:
                try:
                    lines.append(wire.encode(self._outgoing.receive_nowait()))
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            try:
                await self._send_bytes(b"".join(lines))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log("coordinator gone; stopping")
                self._serving.cancel()
                return

    async def _receive(self, reader: wire.LineReader, nursery: trio.Nursery) -> None:
        while (line := await reader.next()) is not None:
            if isinstance(line, wire.Oversized):
                self.post(wire.Malformed(detail=f"line of {line.size} bytes exceeds the cap"))
                continue
            message = wire.decode_line(line)
            match message:
                case wire.RunAgent():
                    if self._running is not None:
                        self.post(
                            wire.Malformed(detail="an agent is already running", id=message.id)
                        )
                        continue
                    self._ran = True
                    self._running = (message.id, RunControl())
                    self._run_done = trio.Event()
                    nursery.start_soon(self._run_agent, message, self._running[1])
                case wire.Confine():
                    self.post(self._confine(message))
                case wire.Cancel(id=agent_id):
                    if self._running is not None and self._running[0] == agent_id:
                        self._running[1].interrupt()
                case (
                    wire.ModelEvent()
                    | wire.ModelDone()
                    | wire.ModelFailed()
                    | wire.PermissionReply()
                    | wire.HookReply()
                    | wire.McpResult()
                ):
                    waiting = self._pending.get(message.id)
                    if waiting is not None:
                        waiting.send_nowait(message)
                case wire.Shutdown():
                    log("shutdown requested")
                    return
                case wire.ProtocolError(detail=detail, call_id=call_id):
                    log("malformed line", "warning", detail=detail, line=message.line_prefix)
                    self.post(wire.Malformed(detail=detail, id=call_id))
                case _:
                    detail = f"an agent worker does not accept {message.type!r} messages"
                    self.post(wire.Malformed(detail=detail))
        log("end of input")

    def _confine(self, message: wire.Confine) -> wire.Confined:
        """Restrict this process to writing beneath the scope, before any run (nothing the
        model chose has run here yet). Synchronous, on trio's only thread: the restriction
        binds this thread and what it starts, and `restrict_writes` refuses when another
        thread or a child exists."""
        if self._ran:
            return wire.Confined(id=message.id, error="an agent has run in this worker")
        from sandbox.landlock import restrict_writes  # stdlib and ctypes only

        try:
            abi = restrict_writes([Path(p) for p in message.write_paths])
        except OSError as exc:
            log("confine failed", "warning", error=str(exc))
            return wire.Confined(id=message.id, error=str(exc))
        log("confined", write_paths=message.write_paths, abi=abi)
        return wire.Confined(id=message.id, abi=abi)

    async def _run_agent(self, message: wire.RunAgent, control: RunControl) -> None:
        agent_id = message.id
        log("agent started", agent_id=agent_id, tools=message.tools, max_turns=message.max_turns)
        ctx = ToolContext(
            workspace=self.workspace,
            cwd=self.cwd,
            session_id=agent_id,
            extra_roots=self.extra_roots,
        )
        tools = _Tools([t for t in self.tools if t.name in message.tools], self._specs)
        if message.mcp_tools:
            tools = self._with_mcp(tools, message)

        def emit(event: Event) -> None:
            wired = wire.AgentEvent.of(agent_id, event)
            if wired is not None:
                self.post(wired)

        result: wire.AgentResult | None = None
        try:
            run = await run_loop(
                model=BrokeredModel(self, agent_id, message.model),
                messages=normalize_for_api([*message.history, Message.user_text(message.prompt)]),
                pipeline=ToolPipeline(
                    tools=tools,
                    ctx=ctx,
                    permission=forwarding_permission(self, agent_id),
                    asker=_unresolved_ask,
                    emit=emit,
                    hooks=self._hooks(message, ctx) if message.hook_events else None,
                    recheck_rewrites=False,  # the coordinator's answer is final and checked
                ),
                config=LoopConfig(
                    system=message.system,
                    max_turns=message.max_turns,
                    max_tokens=message.max_tokens,
                    thinking_budget=message.thinking_budget,
                    max_stop_hook_blocks=message.max_stop_hook_blocks,
                    agent_id=agent_id,
                ),
                emit=emit,
                control=control,
            )
            result = wire.AgentResult(
                id=agent_id,
                reason=run.reason,
                result=run.result,
                num_turns=run.num_turns,
                usage=run.usage,
                cost_usd=run.cost_usd,
                duration_s=run.duration_s,
            )
            log("agent finished", agent_id=agent_id, reason=run.reason, turns=run.num_turns)
        except Exception as exc:  # a bug in the loop: still answer, so the coordinator moves on
            log("agent failed", "error", agent_id=agent_id, exception=traceback.format_exc())
            result = wire.AgentResult(
                id=agent_id,
                reason="model_error",
                result=f"The subagent failed inside its worker: {type(exc).__name__}: {exc}",
                num_turns=0,
            )
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                await ctx.aclose()
            if result is not None:
                if self._scratch:
                    result = result.model_copy(update={"leftover": await self._empty_scratch()})
                self.post(result)
            self._running = None
            self._run_done.set()

    async def _empty_scratch(self) -> str | None:
        """After a run in a read-only worker, which the pool reuses: empty the sandbox's
        private /tmp and /dev/shm, the only places its commands could write (every process
        of theirs is gone by now: `sandbox.process.orphans`). Shielded, and bounded by
        `empty_scratch` itself. Returns what stays, for `AgentResult.leftover`."""
        from sandbox.scratch import empty_scratch  # stdlib only

        with trio.CancelScope(shield=True):
            left = await trio.to_thread.run_sync(empty_scratch, self._scratch)
        if left is not None:
            log("scratch not emptied; the pool replaces this worker", "warning", left=left)
        return left

    def _with_mcp(self, tools: _Tools, message: wire.RunAgent) -> _Tools:
        """The run's tools and the MCP tools the coordinator offers it (called there)."""
        from workers.agent_mcp import ForwardedMcpTool

        async def ask(call: wire.McpCall) -> wire.McpResult:
            result = await self.asked("c", call, wire.McpResult)
            if result is None:
                return wire.McpResult(id=call.id, content="No answer.", is_error=True)
            return result

        own = set(tools.names())
        forwarded = [
            ForwardedMcpTool(spec, agent_id=message.id, ask=ask)
            for spec in message.mcp_tools
            if spec.name not in own
        ]
        specs = {**self._specs, **{spec.name: spec for spec in message.mcp_tools}}
        return _Tools([*tools, *forwarded], specs)

    def _hooks(self, message: wire.RunAgent, ctx: ToolContext) -> HookRunner:
        """The run's hooks: each event the coordinator named is asked of it."""
        from workers.agent_hooks import ForwardedHooks

        async def ask(question: wire.HookAsk) -> wire.HookReply:
            reply = await self.asked("h", question, wire.HookReply)
            # None is not reached: the channel stays open.
            return wire.HookReply(id=question.id) if reply is None else reply

        return ForwardedHooks(
            ask, agent_id=message.id, events=message.hook_events, workspace=ctx.workspace
        )


class _Tools(ToolRegistry):
    """A registry whose specs were built once, at start-up."""

    def __init__(self, tools: Iterable[Tool[Any]], specs: dict[str, ToolSpec]) -> None:
        super().__init__(tools)
        self._built = specs

    def specs(self) -> list[ToolSpec]:
        return [self._built[tool.name] for tool in self]


class BrokeredModel:
    """The worker's `ModelClient`: each request goes to the coordinator, which streams it from
    the real model and sends the events back. Sends only the messages that are new since the
    agent's previous request."""

    def __init__(self, worker: AgentWorker, agent_id: str, name: str) -> None:
        self._worker = worker
        self._agent_id = agent_id
        self._name = name
        self._sent: list[Message] = []

    @property
    def model(self) -> str:
        return self._name

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        keep = _shared_prefix(self._sent, request.messages)
        self._sent = list(request.messages)
        request_id, replies = self._worker.expect("m")
        try:
            self._worker.post(
                wire.ModelRequest(
                    id=request_id,
                    agent=self._agent_id,
                    keep=keep,
                    messages=request.messages[keep:],
                    system=request.system,
                    tools=request.tools,
                    max_tokens=request.max_tokens,
                    thinking_budget=request.thinking_budget,
                )
            )
            async for reply in replies:
                match reply:
                    case wire.ModelEvent():
                        event = reply.event()
                        if event is not None:
                            yield event
                    case wire.ModelDone():
                        yield MessageComplete(reply.assistant_message())
                        return
                    case wire.ModelFailed():
                        raise ModelError(reply.message, reason=reply.reason, status=reply.status)
                    case _:
                        pass
        finally:
            self._worker.forget(request_id)


class _Rehearsed:
    """A model for `rehearse`: its requests and events make the wire round trip too."""

    def __init__(self, model: ScriptedModel) -> None:
        self._model = model

    @property
    def model(self) -> str:
        return self._model.model

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        _round_trip(
            wire.ModelRequest(
                id="m",
                agent="r",
                messages=request.messages,
                system=request.system,
                tools=request.tools,
                max_tokens=request.max_tokens,
                thinking_budget=request.thinking_budget,
            )
        )
        async with closing_iter(self._model.stream(request)) as events:
            async for event in events:
                if isinstance(event, BlockComplete | Retry):
                    _round_trip(wire.ModelEvent.of("m", event))
                elif isinstance(event, MessageComplete):
                    _round_trip(wire.ModelDone.of("m", event.message))
                yield event


def _round_trip(message: pydantic.BaseModel) -> None:
    wire.decode_line(wire.encode(message))


def _shared_prefix(before: list[Message], now: list[Message]) -> int:
    """How many leading messages `now` shares with `before`. The loop re-sends the very same
    objects each turn, so identity is enough (and costs nothing)."""
    count = 0
    for old, new in zip(before, now, strict=False):
        if old is not new:
            break
        count += 1
    return count


def forwarding_permission(worker: AgentWorker, agent_id: str) -> PermissionFn:
    """A `PermissionFn` that lets the coordinator decide: its policy, then its asker for an
    ask. The answer is final (Allow or Deny), so the worker's own asker is never used."""

    async def decide(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
        tool, input = plan.runnable()
        question = wire.PermissionAsk(
            id="",
            agent=agent_id,
            tool=tool.name,
            input=input.model_dump(mode="json", by_alias=True),
        )
        reply = await worker.asked("p", question, wire.PermissionReply)
        if reply is None:
            return Deny("The coordinator did not answer the permission request.")
        if reply.allow:
            return Allow(updated_input=reply.updated_input, rule=reply.rule)
        return Deny(reply.message or f"{tool.name} was denied.", rule=reply.rule)

    return decide


async def _unresolved_ask(tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
    return Deny(f"{tool.name} needs permission, and this worker cannot ask: {ask.reason}")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.agent_worker", description=__doc__)
    parser.add_argument("--role", choices=["read_write", "read_only"], default="read_only")
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--cwd", type=Path, default=None)
    parser.add_argument("--extra-root", type=Path, action="append", default=[])
    parser.add_argument("--tools", default=DEFAULT_TOOLS)
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace, proto_in: int, proto_out: int) -> None:
    workspace = args.workspace.resolve()
    role: wire.HostRole = args.role
    out = trio.lowlevel.FdStream(proto_out)
    worker = AgentWorker(
        tools=load_tools_factory(args.tools)(role),
        workspace=workspace,
        cwd=(args.cwd or workspace).resolve(),
        extra_roots=tuple(p.resolve() for p in args.extra_root),
        role=role,
        send=out.send_all,
        scratch=_private_scratch(role),
    )
    await worker.rehearse()
    await serve_until_sigterm(worker.serve, proto_in, on_sigterm=lambda: log("SIGTERM: stopping"))


def _private_scratch(role: wire.HostRole) -> tuple[Path, ...]:
    """What a read-only worker empties after each run: its sandbox's own /tmp and /dev/shm,
    found before anything ran (`sandbox.scratch.private_scratch`); nothing outside a sandbox
    (where /tmp is the machine's) or in a writer (never reused). The spawner's marker is
    taken out of the environment, so no command inherits it."""
    from sandbox.scratch import PRIVATE_SCRATCH_ENV, private_scratch

    found = private_scratch(os.environ) if role == "read_only" else ()
    os.environ.pop(PRIVATE_SCRATCH_ENV, None)
    if isinstance(found, str):
        log("scratch not emptied after runs", reason=found)
        return ()
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m workers.agent_worker`; returns the exit status."""
    make_undumpable()  # before anything else: see workers.entry
    args = _parse_args(argv)
    proto_in, proto_out = take_protocol(args.role)
    log("agent worker starting", role=args.role, pid=os.getpid())
    trio.run(_serve, args, proto_in, proto_out)
    return 0


if __name__ == "__main__":
    exit_now(main())
