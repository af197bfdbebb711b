"""Streaming tool execution: start calls while the message still streams, in a safe order.

Rules (DESIGN.md, loop contract 3), decided per call from its input:

- a concurrency-safe call starts as soon as its block is complete, once every earlier
  non-safe call has finished; safe calls share one `CapacityLimiter`;
- a non-safe call starts only once the message is complete (a retried stream can never have
  started a write) and every earlier call has finished; every later call waits for it;
- except for scoped writers (`dispatch_agent` with `write_paths`): one waits only for the
  earlier calls it may overlap (`orchestrator.calls.plan.may_overlap`: another writer whose scope
  shares a path, a reader of its scope, Bash, any unscoped writer), and later calls wait for
  it only when they may overlap it; scoped writers share the limiter with safe calls. How
  such a call was scheduled is reported (`CallScheduled`: stream-json, the audit log);
- results come back in tool_use order, one per call, whatever happened;
- once the user rejects a call at a prompt, the calls that have not started yet do not
  start: each gets `REJECTED_EARLIER` (a policy's denial stops only its own call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from orchestrator.calls.pipeline import (
    INTERRUPTED_RUNNING,
    INTERRUPTED_WAITING,
    REJECTED_EARLIER,
    ToolPipeline,
)
from orchestrator.calls.plan import CallPlan, may_overlap
from orchestrator.events import CallScheduled
from orchestrator.messages import ToolResultBlock, ToolUseBlock

__all__ = ["StreamingToolExecutor"]


@dataclass(eq=False)
class _Call:
    prepared: CallPlan
    """The call's plan, made once when its block completed: its concurrency safety is read
    here, never worked out again."""
    waits_for: list[_Call]
    """The earlier calls it may overlap: it may not start before they are done."""
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: bool = False
    result: ToolResultBlock | None = None


class StreamingToolExecutor:
    """Schedules one assistant message's tool calls on a nursery the caller owns.

    **Cancellation:** cancelling the nursery interrupts every call; each unfinished call gets a
    fixed interruption result (`INTERRUPTED_RUNNING` or `INTERRUPTED_WAITING`).
    """

    def __init__(
        self, pipeline: ToolPipeline, nursery: trio.Nursery, limiter: trio.CapacityLimiter
    ) -> None:
        self._pipeline = pipeline
        self._nursery = nursery
        self._limiter = limiter
        self._calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._message_complete = trio.Event()
        self._rejected = False
        """The user rejected a call: the calls that have not started are not run."""

    def add(self, block: ToolUseBlock) -> None:
        """Schedule a call as soon as its block is complete."""
        if block.id in self._by_id:
            return
        prepared = self._pipeline.prepare(block)
        earlier = [c for c in self._calls if may_overlap(c.prepared, prepared)]
        call = _Call(prepared, earlier)
        scoped = [c for c in self._calls if c.prepared.write_scope is not None]
        if prepared.write_scope is not None or scoped:
            self._pipeline.emit(
                CallScheduled(
                    block.id,
                    block.name,
                    None
                    if prepared.write_scope is None
                    else tuple(str(p) for p in prepared.write_scope),
                    tuple(c.prepared.block.id for c in earlier),
                    tuple(c.prepared.block.id for c in self._calls if c not in earlier),
                )
            )
        self._calls.append(call)
        self._by_id[block.id] = call
        self._nursery.start_soon(self._run, call)

    def discard(self) -> None:
        """The stream restarts (a retry): drop every call so far; they were all safe."""
        for call in self._calls:
            call.scope.cancel()
        self._calls = []
        self._by_id = {}

    def message_complete(self, tool_uses: list[ToolUseBlock]) -> None:
        """The final message is known: schedule any call not seen yet, in message order."""
        for block in tool_uses:
            self.add(block)
        wanted = [b.id for b in tool_uses]
        self._calls = [self._by_id[i] for i in wanted]
        self._message_complete.set()

    async def results(self) -> list[ToolResultBlock]:
        """Wait for every call and return their results in tool_use order."""
        for call in self._calls:
            await call.done.wait()
        return [self.result_of(c) for c in self._calls]

    def settled_results(self) -> list[ToolResultBlock]:
        """Results now, with interruption texts for unfinished calls (after a cancel)."""
        return [self.result_of(c) for c in self._calls]

    @staticmethod
    def result_of(call: _Call) -> ToolResultBlock:
        if call.result is not None:
            return call.result
        return ToolResultBlock(
            tool_use_id=call.prepared.block.id,
            content=INTERRUPTED_RUNNING if call.started else INTERRUPTED_WAITING,
            is_error=True,
        )

    async def _run(self, call: _Call) -> None:
        plan = call.prepared
        try:
            with call.scope:
                if not plan.concurrency_safe:
                    await self._message_complete.wait()
                for other in call.waits_for:
                    await other.done.wait()
                if plan.concurrency_safe or plan.write_scope is not None:
                    async with self._limiter:
                        await self._execute(call)
                else:
                    await self._execute(call)
        finally:
            call.done.set()

    async def _execute(self, call: _Call) -> None:
        if self._rejected:
            call.result = ToolResultBlock(
                tool_use_id=call.prepared.block.id, content=REJECTED_EARLIER, is_error=True
            )
            return
        call.started = True
        call.result = await self._pipeline.execute(call.prepared, on_rejected=self._reject)

    def _reject(self) -> None:
        self._rejected = True
