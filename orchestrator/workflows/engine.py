"""One workflow run in the coordinator: the script's `agent()` calls answered by ordinary
subagents, journaled, and answered from an earlier run's journal when it is resumed.

The script (orchestrator/workflows/script.py runs it in its own sandbox) asks; `WorkflowEngine`
is its `ScriptHost`:

- an `agent()` call whose position and hash match a finished call of the run it resumes is
  answered from that journal, and the fake API of a test sees no request for it; the first call
  whose hash differs from the journal's at its position (an edited script) ends reuse for every
  position after it (`key_order`), while a call that had not finished (in flight at `kill -9`,
  or stopped short: a limit, the budget, a denial) just runs again without ending reuse, so
  siblings that finished stay cached; an agent that ran to its end and failed on its own (its
  output never fit its schema) failed for good, and is answered as failed;
- any other call runs as a `dispatch_agent` call through the session's own `ToolPipeline`
  (`PipelineAgents`): planned, hooked, decided by the policy (asks included), audited, run in a
  pool worker under the floor, a writer's changes recorded for `warren undo`; at most `cap` at
  once (the pool's), writers only with disjoint write scopes (`ScopeGate`), at most
  `max_agents` per run;
- each ended call is appended to the run's journal (fsynced) before the script hears it.

What happens is told as `WorkflowChanged` events (phases, agents started and ended, log lines):
the REPL's view, stream-json and the audit log.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog
import trio

from orchestrator.calls.scopes import overlaps
from orchestrator.events import WorkflowChanged
from orchestrator.workflows.journal import (
    AgentAnswer,
    JournalEntry,
    RunRecord,
    WorkflowStore,
    WriterStart,
    call_hash,
    key_order,
)
from orchestrator.workflows.script import AgentCall, AgentFailedError

__all__ = [
    "AgentPlan",
    "AgentRow",
    "AgentRunner",
    "ScopeGate",
    "WorkflowEngine",
]


@dataclass(frozen=True)
class AgentPlan:
    """One agent call, planned once: where it writes, and what the runner needs to run it."""

    call: AgentCall
    call_id: str
    scope: tuple[Path, ...] | Literal["ro"] | None
    """`"ro"` for a read-only agent, None for a writer of the whole workspace, else its scope
    (lexical, absolute)."""
    prepared: Any = None
    """The runner's own plan of the call (`PipelineAgents`: the pipeline's `CallPlan`)."""


class AgentRunner(Protocol):
    """Runs one workflow agent call as a subagent (`PipelineAgents`: the session's pipeline).

    **Cancellation:** the subagent is stopped before `Cancelled` propagates.
    **Errors:** none: a refusal or failure is an answer that is not `ok`.
    """

    def plan(self, call: AgentCall, call_id: str) -> AgentPlan: ...

    async def run(self, plan: AgentPlan) -> AgentAnswer: ...


@dataclass
class AgentRow:
    """One agent call as the run's view shows it."""

    key: str
    label: str
    phase: str | None
    status: Literal["waiting", "running", "done", "failed", "cached"] = "waiting"
    agent_id: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    reason: str | None = None


class ScopeGate:
    """Writers of one run only at once when their scopes are disjoint (as the executor
    schedules the main agent's scoped writers); a writer of the whole workspace alone."""

    def __init__(self) -> None:
        self._active: list[tuple[Path, ...] | None] = []
        self._changed = trio.Condition()

    def _clashes(self, scope: tuple[Path, ...] | None) -> bool:
        for other in self._active:
            if scope is None or other is None:
                return True
            if any(overlaps(a, b) for a in scope for b in other):
                return True
        return False

    @contextlib.asynccontextmanager
    async def holding(self, scope: tuple[Path, ...] | None) -> AsyncIterator[None]:
        async with self._changed:
            while self._clashes(scope):
                await self._changed.wait()
            self._active.append(scope)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._changed:
                    self._active.remove(scope)
                    self._changed.notify_all()


@dataclass
class _Reuse:
    """An earlier run's journal, and how far it may still answer."""

    entries: dict[str, JournalEntry]
    cutoff: tuple[int, ...] | None = None
    """Positions from here on run again (the first edited call's)."""
    answered: int = 0

    def answer(self, key: str, digest: str) -> JournalEntry | None:
        entry = self.entries.get(key)
        if entry is None:
            return None  # new, or never started: runs, and reuse goes on
        order = key_order(key)
        if entry.hash != digest:  # edited: this call and every later position run again
            self.cutoff = order if self.cutoff is None else min(self.cutoff, order)
            return None
        if not (entry.ok or entry.final) or (self.cutoff is not None and order >= self.cutoff):
            return None
        self.answered += 1
        return entry


@dataclass
class WorkflowEngine:
    """The `ScriptHost` of one run (see the module docstring)."""

    record: RunRecord
    store: WorkflowStore
    runner: AgentRunner
    emit: Callable[[WorkflowChanged], None]
    cap: int = 10
    """Agents at once (the pool's cap)."""
    max_agents: int = 100
    """Agents one run may start (`[limits] workflow_agents`); cached answers do not count."""
    keeper: Callable[[str, tuple[Path, ...]], WriterStart] | None = None
    """Keeps a scoped writer's scope before it runs (`rollback.keep_scope`), so a resume
    can put it back if the run stops while it writes; None: not kept."""
    task_id: str | None = None
    reuse: _Reuse | None = None
    rows: dict[str, AgentRow] = field(default_factory=dict)
    phase_now: str | None = None
    started: int = 0
    gate: ScopeGate = field(default_factory=ScopeGate)
    """Where writers wait for disjoint scopes: the session's, shared by its runs."""
    _limiter: trio.CapacityLimiter = field(init=False)

    def __post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(max(1, self.cap))

    @classmethod
    def resuming(cls, earlier: dict[str, JournalEntry], **kwargs: Any) -> WorkflowEngine:
        return cls(reuse=_Reuse(earlier), **kwargs)

    # -- ScriptHost --

    def phase(self, title: str) -> None:
        self.phase_now = title
        self._tell("phase", text=title)

    def log(self, text: str) -> None:
        self._tell("log", text=text)

    async def agent(self, call: AgentCall) -> Any:
        digest = call_hash(call.prompt, call.type, call.schema, call.write_paths, call.model)
        row = self.rows[call.key] = AgentRow(
            call.key, call.label or _short(call.prompt), call.phase or self.phase_now
        )
        cached = None if self.reuse is None else self.reuse.answer(call.key, digest)
        if cached is not None:
            await self._journal(replace(cached, key=call.key))
            row.status, row.agent_id = "cached", cached.agent_id
            row.tokens, row.cost_usd = cached.tokens, cached.cost_usd
            row.reason = cached.reason
            self._tell("agent", row=row)
            if not cached.ok:
                raise AgentFailedError(cached.reason or "the agent failed")
            return cached.value
        if self.started >= self.max_agents:
            raise AgentFailedError(
                f"this workflow has started {self.started} agents, the most one run may "
                f"([limits] workflow_agents = {self.max_agents})"
            )
        self.started += 1
        answer = await self._run(call, row)
        await self._journal(JournalEntry(**asdict(answer), key=call.key, hash=digest))
        row.status = "done" if answer.ok else "failed"
        row.agent_id, row.tokens, row.cost_usd = answer.agent_id, answer.tokens, answer.cost_usd
        row.reason = answer.reason
        self._tell("agent", row=row)
        if not answer.ok:
            raise AgentFailedError(answer.reason or "the agent failed")
        return answer.value

    async def _run(self, call: AgentCall, row: AgentRow) -> AgentAnswer:
        call_id = f"toolu_{self.record.run_id.replace('-', '_')}_{call.key.replace('.', '_')}"
        plan = self.runner.plan(call, call_id)
        scope = plan.scope
        gate = contextlib.nullcontext() if scope == "ro" else self.gate.holding(scope)
        async with self._limiter, gate:
            row.status = "running"
            self._tell("agent", row=row)
            if not isinstance(scope, tuple) or self.keeper is None:
                return await self.runner.run(plan)
            await trio.to_thread.run_sync(self._keep, call.key, scope)
            answer = await self.runner.run(plan)
            if answer.ok:  # a failed or stopped writer is put back before it runs again
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        self.store.writer_ended, self.record.run_id, call.key
                    )
            return answer

    def _keep(self, key: str, scope: tuple[Path, ...]) -> None:
        """A writer's scope kept and its start noted (in a thread: both fsync)."""
        assert self.keeper is not None
        self.store.writer_started(self.record.run_id, self.keeper(key, scope))

    async def _journal(self, entry: JournalEntry) -> None:
        """Append `entry`, fsynced, in a thread: an fsync takes milliseconds (more on a busy
        or slow disk), and on the event loop it held every other agent's stream and worker
        meanwhile (tests/bench/bench_workflows.py). Shielded: an answer the agent gave is
        kept even when the run is being cancelled, so a resume does not run it again."""
        try:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.store.append, self.record.run_id, entry)
        except OSError as exc:  # the run goes on; a resume runs this call again
            structlog.get_logger().warning(
                "workflow journal write failed", run_id=self.record.run_id, error=str(exc)
            )

    def _tell(
        self,
        what: Literal["phase", "agent", "log"],
        *,
        text: str = "",
        row: AgentRow | None = None,
    ) -> None:
        self.emit(
            WorkflowChanged(
                what,
                self.record.run_id,
                self.record.name,
                task_id=self.task_id,
                phase=self.phase_now if row is None else row.phase,
                text=text,
                key=None if row is None else row.key,
                label=None if row is None else row.label,
                status=None if row is None else row.status,
                agent_id=None if row is None else row.agent_id,
                tokens=0 if row is None else row.tokens,
                cost_usd=0.0 if row is None else row.cost_usd,
            )
        )

    # -- the run's numbers --

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rows.values())

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self.rows.values())

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for row in self.rows.values():
            found[row.status] = found.get(row.status, 0) + 1
        return found


def _short(prompt: str, width: int = 60) -> str:
    line = " ".join(prompt.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def result_json(value: Any) -> str:
    """A workflow's result as the model reads it (bounded by the notification)."""
    try:
        return json.dumps(value, ensure_ascii=False, indent=1)
    except (TypeError, ValueError):
        return json.dumps(str(value))
