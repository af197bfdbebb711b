"""The coordinator's side of the tool hosts: a `ToolRunner` whose calls run in sandboxes.

`SandboxedToolRunner` implements `orchestrator.calls.pipeline.ToolRunner` over the wire protocol.
It owns two long-lived tool hosts (`workers.toolhost`), each started under the OS floor on
first use:

* read-write: the workspace writable; calls that may write, and the persistent Bash shell;
* read-only: the workspace mounted read-only; every call whose plan says `sandbox == "ro"`
  (its read-only verdict, made once by the pipeline: orchestrator/calls/plan.py). A misclassified
  command runs there too, so it cannot write: the classification is enforced by the kernel,
  not trusted. Nothing here classifies a call again; a tool that declares
  `runs_in_coordinator` (dispatch_agent) runs in this process.

The coordinator's `ToolContext.read_ledger` stays the source of truth for read-before-write:
each message carries the ledger changes the host has not seen yet, each answer the entries the
host's tools recorded or forgot, and the runner applies them (so a Read in the read-only host
counts for an Edit in the read-write host). The persistent shell's state (cwd, exports) goes
the same way from the read-write host to the read-only one.

A host that dies (crash, SIGKILL, OOM) fails every call in flight on it with an error result
saying the call may or may not have happened; the next call starts a fresh host. Hosts are
stopped with a shielded, bounded teardown (`Shutdown`, `stop_grace_s`, then the sandbox's own:
end of stdin, SIGTERM, grace, SIGKILL, reap); with bwrap's `--die-with-parent` and pid
namespace, nothing a host started survives it.

Usage (the composition root):

    async with open_tool_runner() as runner:
        pipeline = ToolPipeline(..., runner=runner)
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import itertools
import math
import os
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import pydantic
import structlog
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.pipeline import InProcessRunner
from orchestrator.calls.plan import CallPlan, SandboxMode
from orchestrator.errors import ToolError, WarrenError
from orchestrator.hooks.process import HookCommand, HookProcess
from orchestrator.messages import TextBlock
from orchestrator.tools.base import Checked, Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from sandbox.guard import find_denied
from sandbox.host import SandboxHost, detect_host
from sandbox.process.child import open_child
from sandbox.run import open_sandboxed_process
from sandbox.scratch import PRIVATE_SCRATCH_ENV
from sandbox.spare import SpareSource
from sandbox.spec import Bind, Limits, SandboxSpec, WorkspaceRoot
from workers import protocol as wire
from workers.child import (
    SEND_TIMEOUT_S,
    ChildGone,
    ChildStarter,
    ChildStartError,
    HostLaunch,
    HostProcess,
    HostSpawner,
    SupervisedChild,
)
from workers.toolhost import DEFAULT_TOOLS

__all__ = [
    "HOST_DIED",
    "HOST_LIMITS",
    "SEND_TIMEOUT_S",
    "HostLaunch",
    "HostProcess",
    "HostSpawner",
    "SandboxedSpawner",
    "SandboxedToolRunner",
    "ToolHostError",
    "host_environment",
    "open_tool_runner",
    "unsandboxed_spawner",
]

HOST_DIED = (
    "The sandboxed tool host running this call died ({status}) before the call finished. The "
    "call may or may not have taken effect: check the state before repeating it. A fresh tool "
    "host starts with the next call."
)

_ENV_KEPT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
_HOOK_ANSWER_SLACK_S = 10.0
"""Seconds past a hook's own timeout we wait for its host's answer (the host kills it at the
timeout; this is for a host that stopped answering)."""


class ToolHostError(WarrenError):
    """A tool host could not start, or went away while answering (`role` names which)."""

    def __init__(self, message: str, *, role: wire.HostRole) -> None:
        super().__init__(message)
        self.message = message
        self.role = role


HOST_LIMITS = Limits(wall_time_s=None, cpu_time_s=None)
"""A host lives as long as the session, so no wall-clock or CPU-time limit applies to it as a
whole (each call has its own time limit); memory, processes and file sizes keep the floor's
defaults."""


class SandboxedSpawner:
    """Starts hosts with `sandbox.open_sandboxed_process`: the workspace writable for the
    read-write host and read-only for the read-only one, everything else as the floor says
    (read-only root, private /tmp, no network, secrets masked, scrubbed environment). A
    launch with `write_paths` (a scoped writer) gets the roots read-only and only those
    directories writable, bound after them, with the floor's protected names inside."""

    def __init__(
        self,
        spec: SandboxSpec | None = None,
        *,
        host: SandboxHost | None = None,
        read_denied: Callable[[str], bool] | None = None,
        spares: SpareSource | None = None,
    ):
        """`spec`: the session's sandbox (protected paths, masks, limits); its workspaces
        default to the launch's workspace and extra roots. Default: the floor's defaults
        with `HOST_LIMITS`. `host`: detected on first use when None. `read_denied`: the
        policy's read deny rules (`SessionPolicy.read_denied`); the files they cover in the
        workspace when the first sandbox starts are masked in every sandbox. `spares`: where
        a warm server's spare hosts come from (`sandbox.spare`; a host started from an
        identical recipe is adopted instead of started)."""
        self._spec = spec or SandboxSpec(limits=HOST_LIMITS)
        self._spares = spares
        self._host = host
        self._read_denied = read_denied
        self._denied_lock = trio.Lock()
        self._denied: tuple[str, ...] | None = None

    async def _denied_paths(self, launch: HostLaunch) -> tuple[str, ...]:
        if self._read_denied is None:
            return ()
        async with self._denied_lock:
            if self._denied is None:
                roots = [r.resolve() for r in (launch.workspace, *launch.extra_roots)]
                found = await trio.to_thread.run_sync(find_denied, roots, self._read_denied)
                self._denied = tuple(glob.escape(str(p)) for p in found)
        return self._denied

    def spec_for(self, launch: HostLaunch) -> SandboxSpec:
        spec = self._spec
        if not spec.workspaces:
            roots = (launch.workspace, *launch.extra_roots)
            spec = spec.model_copy(
                update={"workspaces": tuple(WorkspaceRoot(path=r, mode="rw") for r in roots)}
            )
        # PRIVATE_SCRATCH_ENV: the floor gives every sandbox its own /tmp and /dev/shm, which
        # a read-only pool worker empties after each run (sandbox/scratch.py).
        values = {**spec.env.values, "PYTHONDONTWRITEBYTECODE": "1", PRIVATE_SCRATCH_ENV: "1"}
        spec = spec.model_copy(update={"env": spec.env.model_copy(update={"values": values})})
        if launch.writable and launch.write_paths:
            # A scoped writer: every root read-only, then each scope directory bound writable
            # on top (bwrap mounts parents first), its protected names read-only again.
            spec = spec.read_only()
            scopes = tuple(Bind(path=p, mode="rw") for p in launch.write_paths)
            return spec.model_copy(update={"extra_binds": spec.extra_binds + scopes})
        return spec if launch.writable else spec.read_only()

    async def host(self) -> SandboxHost:
        """The machine's sandbox facts (detected on first use)."""
        if self._host is None:
            self._host = await detect_host()
        return self._host

    async def full_spec(self, launch: HostLaunch) -> SandboxSpec:
        """`spec_for(launch)` with the files the read deny rules cover masked."""
        spec = self.spec_for(launch)
        denied = await self._denied_paths(launch)
        if denied:
            spec = spec.model_copy(update={"extra_deny_read": spec.extra_deny_read + denied})
        return spec

    @asynccontextmanager
    async def __call__(self, launch: HostLaunch) -> AsyncIterator[HostProcess]:
        await self.host()
        spec = await self.full_spec(launch)
        async with open_sandboxed_process(
            spec,
            launch.argv,
            cwd=launch.cwd,
            stderr="pipe",
            host=self._host,
            private_pipes=True,
            spares=self._spares,
        ) as process:
            if process.guard is not None and self._read_denied is not None:
                process.guard.denied = self._read_denied
            yield process

    @asynccontextmanager
    async def stdio(
        self,
        launch: HostLaunch,
        env: Mapping[str, str] | None = None,
        *,
        network: bool = False,
    ) -> AsyncIterator[HostProcess]:
        """Like a call, for a program that speaks on its stdin and stdout (an MCP server):
        the same spec and masks (the read-denied files found once for all), `env` added to
        its environment, its stdio the pipes. `network`: the host's network instead of none
        (an MCP server's `network = true`; tool hosts and workers never get it)."""
        if self._host is None:
            self._host = await detect_host()
        spec = self.spec_for(launch)
        if network:
            spec = spec.model_copy(update={"network": "host", "allow_unix_sockets": False})
        if env:
            values = {**spec.env.values, **env}
            spec = spec.model_copy(update={"env": spec.env.model_copy(update={"values": values})})
        if denied := await self._denied_paths(launch):
            spec = spec.model_copy(update={"extra_deny_read": spec.extra_deny_read + denied})
        async with open_sandboxed_process(
            spec, launch.argv, cwd=launch.cwd, stderr="pipe", host=self._host
        ) as process:
            yield process

    def add_denied(self, paths: Sequence[Path]) -> None:
        """Also mask `paths` (files the read deny rules cover, created after the first
        sandbox started) in every sandbox started from now on."""
        known = self._denied or ()
        added = tuple(glob.escape(str(p)) for p in paths if glob.escape(str(p)) not in known)
        self._denied = known + added


@asynccontextmanager
async def unsandboxed_spawner(launch: HostLaunch) -> AsyncIterator[HostProcess]:
    """No sandbox at all: for tests of the protocol itself and an explicit `--sandbox=off`.
    The host gets `host_environment()`, in a session of its own; leaving stops it with its
    process group (`sandbox.process.child.open_child`: end of stdin, SIGTERM, SIGKILL, 2 s
    each). A launch with `write_paths` (a scope to mount) is refused: without the floor no
    mount would hold it to its scope, and the scheduler runs it beside other writers on that
    promise. (A worker the pool confines with Landlock holds itself; workers/pool.py.)"""
    if launch.write_paths:
        raise OSError("a write scope needs the sandbox (it is off)")
    async with open_child(launch.argv, env=host_environment(), cwd=launch.cwd) as process:
        yield process


def host_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an unsandboxed host: a short allowlist of `base` (default: ours),
    so API keys and tokens stay in the coordinator even then."""
    source = os.environ if base is None else base
    env = {key: source[key] for key in _ENV_KEPT if key in source}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass(eq=False)
class _Host(SupervisedChild):
    """One running tool host as the coordinator sees it (a `SupervisedChild`)."""

    role: wire.HostRole = "read_write"
    pending: dict[str, trio.MemorySendChannel[_Reply]] = field(default_factory=dict)
    sent_ledger: dict[Path, int] = field(default_factory=dict)
    """The ledger as this host's replica has it (what was sent plus what it reported)."""
    sent_shell: wire.ShellState | None = None
    retiring: bool = False
    """Replaced (its masks are out of date): stopped once its last call has answered."""

    def expect(self, call_id: str) -> trio.MemoryReceiveChannel[_Reply]:
        """Where the answers to `call_id` arrive, until `done(call_id)`."""
        send, receive = trio.open_memory_channel[_Reply](math.inf)
        self.pending[call_id] = send
        return receive

    def done(self, call_id: str) -> None:
        """No more answers to `call_id`: a retiring host stops once its last call is done."""
        self.pending.pop(call_id, None)
        if self.retiring and not self.pending:
            self.process.kill()

    async def send(self, message: pydantic.BaseModel) -> None:
        """Write one message, whole (`SupervisedChild.send_bytes`).

        **Errors:** `ToolHostError` when the host's stdin is gone (it died or was killed).
        """
        try:
            await self.send_bytes(wire.encode(message))
        except ChildGone as exc:
            raise ToolHostError(exc.message, role=self.role) from exc

    def ledger_delta(self, ctx: ToolContext) -> wire.LedgerDelta:
        current = ctx.read_ledger.entries()
        if current == self.sent_ledger:
            return _NO_CHANGES
        recorded = {str(p): m for p, m in current.items() if self.sent_ledger.get(p) != m}
        forgotten = [str(p) for p in self.sent_ledger if p not in current]
        self.sent_ledger = current
        return wire.LedgerDelta(recorded=recorded, forgotten=forgotten)

    def take_ledger(self, ctx: ToolContext, delta: wire.LedgerDelta) -> None:
        if not delta:
            return
        recorded = {Path(p): m for p, m in delta.recorded.items()}
        forgotten = [Path(p) for p in delta.forgotten]
        ctx.read_ledger.apply(recorded, forgotten)
        self.sent_ledger.update(recorded)
        for path in forgotten:
            self.sent_ledger.pop(path, None)


HOSTS_REPLACED = (
    "Warren restarted the tool sandboxes: {count} new file(s) that the read deny rules cover "
    "appeared, and every sandbox now hides them. The shell started afresh (working directory "
    "and exported variables reset)."
)


@dataclass(frozen=True)
class _Failure:
    """Delivered to a waiting call instead of an answer: the host died or replied nonsense."""

    text: str


_Reply = wire.ToolProgress | wire.ToolResult | wire.Validated | wire.HookResult | _Failure
"""What a waiting call can receive."""

_NO_CHANGES = wire.LedgerDelta()

_ROLES: Mapping[SandboxMode, wire.HostRole] = {
    "ro": "read_only",
    "rw": "read_write",
    # A tool host cannot confine a call to a scope: a scoped call that got here only reads.
    "scoped": "read_only",
}
"""The host that runs a plan of each sandbox mode."""


class SandboxedToolRunner:
    """Runs validation and calls in the sandboxed tool hosts. Create with `open_tool_runner`.

    Not safe to share between sessions: the hosts are started with the workspace of the first
    call's `ToolContext`.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        spawner: HostSpawner | None = None,
        tools: str = DEFAULT_TOOLS,
        python: Path | None = None,
        start_timeout_s: float = 30.0,
        validate_timeout_s: float = 60.0,
        cancel_wait_s: float = 5.0,
        stop_grace_s: float = 2.0,
    ) -> None:
        """
        `spawner`: starts each host (default: `SandboxedSpawner()`, the floor's defaults).
        `tools`: `MODULE:FUNCTION` returning the hosts' `ToolRegistry` for a role.
        `python`: the interpreter of the hosts (default: ours, so the same venv).
        `start_timeout_s`: seconds a host has to send `Ready`.
        `validate_timeout_s`: seconds a host has to answer `ValidateTool`.
        `cancel_wait_s`: seconds a cancelled call waits for the host's final answer.
        `stop_grace_s`: seconds a host has to exit after `Shutdown` before the spawner
        terminates it.
        """
        self._nursery = nursery
        self._spawner: HostSpawner = spawner or SandboxedSpawner()
        self._tools = tools
        self._python = python or Path(sys.executable)
        self._start_timeout_s = start_timeout_s
        self._validate_timeout_s = validate_timeout_s
        self._cancel_wait_s = cancel_wait_s
        self._stop_grace_s = stop_grace_s
        self._hosts: dict[str, _Host] = {}
        """Live hosts by slot: a role for the tool calls' hosts, `hooks:<role>` for the
        hosts hooks run in (`run_hook`)."""
        self._context: ToolContext | None = None
        """The context hosts are started for (the last given): hooks, which have none, use it."""
        self._start_locks: defaultdict[str, trio.Lock] = defaultdict(trio.Lock)
        self._ids = itertools.count(1)
        self._shell: wire.ShellState | None = None
        """The read-write host's last reported shell state."""
        self._carried: list[str] = []
        """Guard notes drained before a read-only call, for the next output."""
        self._log = structlog.get_logger().bind(component="toolhost_runner")
        self._starter = ChildStarter(
            nursery,
            self._spawner,
            lambda process, launch: _Host(process, _host_label(launch), role=launch.role),
            label=_host_label,
            serve=self._route,
            log=self._log,
            kind="host",
            start_timeout_s=start_timeout_s,
            stop_grace_s=stop_grace_s,
            on_ready=self._ready,
            on_stopped=self._stopped,
        )

    # -- the ToolRunner protocol -------------------------------------------------------------

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        """`tool.validate` in the host the plan names (here, for a coordinator tool).

        **Errors:** `ToolHostError` when the host cannot start, dies, or does not answer within
        `validate_timeout_s`; `ToolError` when the host could not run validate.
        """
        if plan.runs_in_coordinator:
            return await InProcessRunner().validate(plan, ctx)
        tool, input = plan.runnable()
        role = _ROLES[plan.sandbox]
        host = await self._host(role, ctx)
        call_id = self._next_id()
        receive = host.expect(call_id)
        try:
            await host.send(
                wire.ValidateTool(
                    id=call_id,
                    tool=tool.name,
                    input=_dump(input),
                    ledger=host.ledger_delta(ctx),
                )
            )
            with trio.move_on_after(self._validate_timeout_s):
                while True:
                    reply = await receive.receive()
                    if isinstance(reply, _Failure):
                        raise ToolHostError(reply.text, role=role)
                    if isinstance(reply, wire.Validated):
                        host.take_ledger(ctx, reply.ledger)
                        if reply.error is not None:
                            raise ToolError(reply.error)
                        return reply.refusal
            raise ToolHostError(
                f"the {role} tool host did not answer within {self._validate_timeout_s:g} s",
                role=role,
            )
        finally:
            host.done(call_id)

    merged_checks = True
    """Validation in a host is a trip of its own; `call(validate=True)` saves it."""

    async def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncIterator[Checked | ToolProgress | ToolOutput]:
        """`tool.call` in the host the plan names (`ro`: the read-only host, always, whatever
        the decision; `rw`: the read-write one): progress passes through, then one output (or
        `ToolError`). With `validate`, the host runs `tool.validate` first, in the same trip,
        and its answer comes first (`Checked`); a refusal ends the call there.

        **Cancellation:** the host is sent `Cancel` and the call waits up to `cancel_wait_s`
        (shielded) for its final answer, so the call has stopped and its ledger entries are
        kept before `Cancelled` propagates.

        **Errors:** a host that cannot start or dies gives an error output, never an exception.
        """
        tool, input = plan.runnable()
        if plan.runs_in_coordinator:
            here = InProcessRunner().call(plan, ctx, validate=validate)
            async with closing_iter(here) as events:
                async for event in events:
                    if isinstance(event, ToolOutput):
                        event = self._guarded(self._hosts.get("read_write"), event)
                    yield event
            return
        role = _ROLES[plan.sandbox]
        if role == "read_only":
            # What appeared since the last writable call (the agent's or anyone's) is checked
            # before a read: a new file the deny rules cover restarts the hosts masked.
            self._carried += self._drain_guard(self._hosts.get("read_write"))
        try:
            host = await self._host(role, ctx)
        except ToolHostError as exc:
            yield ToolOutput(f"{tool.name} could not run: {exc.message}", is_error=True)
            return
        call_id = self._next_id()
        receive = host.expect(call_id)
        answered = False
        try:
            shell = self._shell if role == "read_only" and self._shell != host.sent_shell else None
            try:
                await host.send(
                    wire.RunTool(
                        id=call_id,
                        tool=tool.name,
                        input=_dump(input),
                        ledger=host.ledger_delta(ctx),
                        shell=shell,
                        check=validate,
                    )
                )
            except ToolHostError:
                answered = True
                yield ToolOutput(HOST_DIED.format(status=host.status()), is_error=True)
                return
            if shell is not None:
                host.sent_shell = shell
            async for reply in receive:
                if isinstance(reply, wire.ToolProgress):
                    yield ToolProgress(reply.text, reply.data.encode("latin-1", "replace"))
                    continue
                if isinstance(reply, wire.Validated):
                    host.take_ledger(ctx, reply.ledger)
                    refusal = reply.refusal
                    if reply.error is not None:
                        refusal = f"{tool.name} could not validate this call: {reply.error}"
                    if refusal is not None:
                        answered = True  # the host ran nothing: no result follows
                        yield Checked(refusal)
                        return
                    yield Checked()
                    continue
                answered = True
                output = self._output(host, ctx, tool, reply)
                if output is not None:
                    yield self._guarded(host if role == "read_write" else None, output)
                return
        finally:
            if not answered:
                with trio.CancelScope(shield=True), trio.move_on_after(self._cancel_wait_s):
                    await self._cancel(host, call_id, ctx, receive)
            host.done(call_id)

    # -- hooks (orchestrator.hooks.runner.WarmHookHost) -------------------------------------

    async def run_hook(self, hook: HookCommand, *, writable: bool) -> HookProcess:
        """Run a hook in the read-write host (`writable`) or the read-only one: it inherits
        that host's sandbox, the floor tools run under, and is killed with everything it
        started at `timeout_s` or past `output_bytes` (`orchestrator.hooks.process`).

        The hosts are started for the context of `open_tool_runner(prestart=...)` or the first
        call; a hook before either is an error (nothing to run it in).

        **Cancellation:** the host is sent `Cancel` and the run waits up to `cancel_wait_s`
        (shielded) for the hook to be killed.
        **Errors:** `ToolHostError` when the host cannot start; a host that dies or does not
        answer gives a `HookProcess` with a `problem`.
        """
        role: wire.HostRole = "read_write" if writable else "read_only"
        # As before a read-only call: a new file the read deny rules cover restarts the hosts
        # masked before the hook can read it; the guard's notes go with the next tool output.
        self._carried += self._drain_guard(self._hosts.get("read_write"))
        if self._context is None:
            raise ToolHostError("no tool host was started for this session yet", role=role)
        # Hooks get hosts of their own, with the same floor: in the tool calls' hosts a
        # process the model left running could kill a hook or write into its output, and a
        # hook that errs does not block.
        host = await self._host(role, self._context, slot=_hook_slot(role))
        call_id = self._next_id()
        receive = host.expect(call_id)
        answered = False
        try:
            await host.send(
                wire.RunHook(
                    id=call_id,
                    command=hook.command,
                    stdin=hook.stdin.decode("utf-8", "replace"),
                    env=dict(hook.env),
                    cwd=str(hook.cwd),
                    timeout_s=hook.timeout_s,
                    output_bytes=hook.output_bytes,
                )
            )
            # The host enforces the timeout; this only outlasts a host that stopped answering.
            with trio.move_on_after(hook.timeout_s + _HOOK_ANSWER_SLACK_S):
                async for reply in receive:
                    if isinstance(reply, _Failure):
                        answered = True
                        return HookProcess(None, b"", b"", f"did not finish: {reply.text}")
                    if isinstance(reply, wire.HookResult):
                        answered = True
                        return HookProcess(
                            reply.exit_code,
                            reply.stdout.encode(),
                            reply.stderr.encode(),
                            reply.problem,
                        )
            return HookProcess(None, b"", b"", f"got no answer from the {role} tool host")
        finally:
            if not answered:
                with trio.CancelScope(shield=True), trio.move_on_after(self._cancel_wait_s):
                    await _cancel_hook(host, call_id, receive)
            host.done(call_id)
            # What the hook made of protected names is undone now (and said with the next
            # tool output), as after a writable call.
            self._carried += self._drain_guard(self._hosts.get(_hook_slot("read_write")))

    # -- calls -------------------------------------------------------------------------------

    def _output(
        self, host: _Host, ctx: ToolContext, tool: Tool[Any], reply: _Reply
    ) -> ToolOutput | None:
        """The output a call's final reply stands for; raises `ToolError` for a tool error."""
        if isinstance(reply, _Failure):
            return ToolOutput(reply.text, is_error=True)
        if not isinstance(reply, wire.ToolResult):
            return ToolOutput(
                f"{tool.name}: the tool host answered with an unexpected {reply.type} message.",
                is_error=True,
            )
        host.take_ledger(ctx, reply.ledger)
        if reply.shell is not None and host.role == "read_write":
            self._shell = reply.shell
        match reply.outcome:
            case "output":
                return ToolOutput(reply.content, is_error=reply.is_error, summary=reply.summary)
            case "tool_error":
                raise ToolError(reply.content if isinstance(reply.content, str) else "")
            case "no_output":
                return None
            case "cancelled":
                return ToolOutput(f"{tool.name} was cancelled.", is_error=True)

    async def _cancel(
        self,
        host: _Host,
        call_id: str,
        ctx: ToolContext,
        receive: trio.MemoryReceiveChannel[_Reply],
    ) -> None:
        """Tell the host to stop the call and wait for its final answer (caller bounds it)."""
        if not host.alive:
            return
        try:
            await host.send(wire.Cancel(id=call_id))
        except ToolHostError:
            return
        async for reply in receive:
            if isinstance(reply, _Failure):
                return
            if isinstance(reply, wire.Validated):  # of a call sent with its validation
                host.take_ledger(ctx, reply.ledger)
                if reply.refusal is not None or reply.error is not None:
                    return  # refused: nothing ran, no result follows
                continue
            if isinstance(reply, wire.ToolResult):
                host.take_ledger(ctx, reply.ledger)
                if reply.shell is not None and host.role == "read_write":
                    self._shell = reply.shell
                return

    def _drain_guard(self, host: _Host | None) -> list[str]:
        """Drain the read-write sandbox's guard (`sandbox.guard`): notes for the protected
        names it removed; and when a new file is read-denied, every host is replaced so the
        next sandboxes mask it (the running ones were masked when they started)."""
        if host is None or not host.alive:
            return []
        check = getattr(host.process, "check_changes", None)
        notes: list[str] = check() if check is not None else []
        take = getattr(host.process, "take_new_denied", None)
        found: list[Path] = take() if take is not None else []
        add = getattr(self._spawner, "add_denied", None)
        if found and add is not None:
            add(found)
            self._log.info("new read-denied files: tool hosts replaced", count=len(found))
            for stale in list(self._hosts.values()):
                self._retire(stale)
            notes.append(HOSTS_REPLACED.format(count=len(found)))
        return notes

    def _retire(self, host: _Host) -> None:
        """Start a fresh host of this role at its next call; stop this one when idle."""
        host.alive = False
        host.retiring = True
        if not host.pending:
            host.process.kill()

    def _guarded(self, host: _Host | None, output: ToolOutput) -> ToolOutput:
        """`output` with a note for each protected name the call created and the read-write
        sandbox's guard removed (`sandbox.guard`): it also catches what a background process
        of the persistent shell or a subagent made since the last call."""
        notes = self._carried + self._drain_guard(host)
        self._carried = []
        if not notes:
            return output
        note = "\n".join(notes)
        if isinstance(output.content, str):
            content: Any = f"{output.content}\n\n{note}" if output.content else note
        else:
            content = [*output.content, TextBlock(text=note)]
        return dataclasses.replace(output, content=content)

    def _next_id(self) -> str:
        return f"c{next(self._ids)}"

    # -- hosts -------------------------------------------------------------------------------

    async def start(self, ctx: ToolContext, roles: Sequence[wire.HostRole] = ()) -> None:
        """Start hosts now rather than on first use (all roles by default), concurrently.

        **Errors:** `ToolHostError` when a host cannot start (the first, if both fail).
        """
        failed: list[ToolHostError] = []

        async def start(role: wire.HostRole) -> None:
            try:
                await self._host(role, ctx)
            except ToolHostError as exc:
                failed.append(exc)

        async with trio.open_nursery() as nursery:
            for role in roles or ("read_write", "read_only"):
                nursery.start_soon(start, role)
        if failed:
            raise failed[0]

    def start_soon(self, ctx: ToolContext, roles: Sequence[wire.HostRole] = ()) -> None:
        """Start hosts in the background (all roles by default), so their start-up (about half
        a second, mostly imports) overlaps the first model request. A host that fails to start
        is logged; the first call that needs it tries again and reports the error."""

        async def start(role: wire.HostRole) -> None:
            try:
                await self._host(role, ctx)
            except ToolHostError as exc:
                self._log.warning("tool host failed to start", role=role, error=exc.message)

        self._context = ctx
        for role in roles or ("read_write", "read_only"):
            self._nursery.start_soon(start, role)

    def host_pids(self) -> dict[str, int]:
        """Pids of the processes spawned for live hosts (bwrap's, when sandboxed), by slot:
        `read_write`, `read_only`, and `hooks:read_write` / `hooks:read_only`."""
        return {slot: h.process.pid for slot, h in self._hosts.items() if h.alive}

    async def _host(
        self, role: wire.HostRole, ctx: ToolContext, *, slot: str | None = None
    ) -> _Host:
        self._context = ctx
        slot = slot or role
        host = self._hosts.get(slot)
        if host is not None and host.alive:
            return host
        async with self._start_locks[slot]:
            host = self._hosts.get(slot)
            if host is not None and host.alive:
                return host
            try:
                started = await self._starter.start(self._launch(role, ctx))
            except ChildStartError as exc:
                raise ToolHostError(exc.message, role=role) from exc
            self._hosts[slot] = started
            return started

    def _launch(self, role: wire.HostRole, ctx: ToolContext) -> HostLaunch:
        return HostLaunch.of_module(
            "workers.toolhost",
            python=self._python,
            role=role,
            workspace=ctx.workspace,
            cwd=ctx.cwd,
            extra_roots=ctx.extra_roots,
            tools=self._tools,
            # No session id: nothing in a host uses it, and a host without one can be a warm
            # server's spare, started before the session it serves (sandbox/spare.py).
            read_deny=ctx.read_deny,
        )

    def _ready(self, host: _Host) -> None:
        self._log.info(
            "tool host ready",
            role=host.role,
            pid=host.process.pid,
            warm=getattr(host.process, "adopted", False),
            sandbox_warnings=list(getattr(host.process, "warnings", ())),
        )

    def _stopped(self, host: _Host) -> None:
        """After the process is reaped: fail the calls still waiting."""
        self._log.info("tool host stopped", role=host.role, status=host.status())
        for waiting in list(host.pending.values()):
            waiting.send_nowait(_Failure(HOST_DIED.format(status=host.status())))

    async def _route(self, host: _Host, reader: wire.LineReader) -> None:
        """Deliver each answer to the call waiting for it, until the host's stdout ends."""
        log = self._log.bind(role=host.role, pid=host.process.pid)
        while (line := await reader.next()) is not None:
            if isinstance(line, wire.Oversized):
                log.warning("oversized answer skipped", size=line.size)
                self._fail(host, wire.oversized_id(line), "an oversized answer")
                continue
            message = wire.decode_line(line)
            match message:
                case wire.ToolProgress() | wire.ToolResult() | wire.Validated() | wire.HookResult():
                    waiting = host.pending.get(message.id)
                    if waiting is not None:
                        waiting.send_nowait(message)
                    else:
                        log.debug("answer for no waiting call", id=message.id)
                case wire.Malformed(detail=detail, id=call_id):
                    log.warning("tool host rejected a line", detail=detail, id=call_id)
                    self._fail(host, call_id, f"a rejected request ({detail})")
                case wire.ProtocolError(detail=detail, call_id=call_id):
                    log.warning("malformed answer", detail=detail, line=message.line_prefix)
                    self._fail(host, call_id, f"a malformed answer ({detail})")
                case _:
                    log.warning("unexpected message from tool host", type=message.type)

    def _fail(self, host: _Host, call_id: str | None, what: str) -> None:
        waiting = host.pending.get(call_id) if call_id is not None else None
        if waiting is not None:
            waiting.send_nowait(
                _Failure(f"The tool host's answer to this call was lost: {what}. Try again.")
            )


async def _cancel_hook(
    host: _Host, call_id: str, receive: trio.MemoryReceiveChannel[_Reply]
) -> None:
    """Tell the host to kill a hook and wait for its answer (the caller bounds it)."""
    if not host.alive:
        return
    with contextlib.suppress(ToolHostError):
        await host.send(wire.Cancel(id=call_id))
        async for reply in receive:
            if isinstance(reply, wire.HookResult | _Failure):
                return


def _hook_slot(role: wire.HostRole) -> str:
    return f"hooks:{role}"


def _host_label(launch: HostLaunch) -> str:
    return f"the {launch.role} tool host"


class _Timeouts(TypedDict):
    start_timeout_s: float
    cancel_wait_s: float


def _dump(input: ToolInput) -> dict[str, Any]:
    return input.model_dump(mode="json", by_alias=True)


@asynccontextmanager
async def open_tool_runner(
    *,
    spawner: HostSpawner | None = None,
    tools: str = DEFAULT_TOOLS,
    start_timeout_s: float = 30.0,
    cancel_wait_s: float = 5.0,
    stop_grace_s: float = 2.0,
    prestart: ToolContext | None = None,
) -> AsyncIterator[SandboxedToolRunner]:
    """A `SandboxedToolRunner` whose hosts live as long as the `async with` block.

    `prestart`: start both hosts for this context in the background at once (`start_soon`),
    rather than on first use; the other arguments are `SandboxedToolRunner`'s.

    **Cancellation:** however the block is left, each host gets the teardown of
    `workers.child.run_child` (shielded; about three times `stop_grace_s`), all at once.
    """
    timeouts = _Timeouts(start_timeout_s=start_timeout_s, cancel_wait_s=cancel_wait_s)
    async with trio.open_nursery() as nursery:
        runner = SandboxedToolRunner(
            nursery, spawner=spawner, tools=tools, stop_grace_s=stop_grace_s, **timeouts
        )
        if prestart is not None:
            runner.start_soon(prestart)
        try:
            yield runner
        finally:
            nursery.cancel_scope.cancel()
