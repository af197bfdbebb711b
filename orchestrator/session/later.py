"""Parts of a session that start once its first model request is on its way (issue 15).

A cold `warren -p` reaches its first request after the SDK's import, and every millisecond the
coordinator spends before then adds to it: the coordinator's threads share one GIL, so the
import and the start-up work run one after the other. The tool hosts, the worker pool and the
change scan are not needed for that request, so the session opens them as stand-ins that start
the real part on `start()`: the session calls it when the first response's first event arrives
(`FirstResponseStarts`, as the MCP servers' start), the REPL when it opens (the user is
typing), and a call that needs the part now (a tool call, a hook, a subagent) starts it and
waits. Their imports (workers/, about 100 ms of CPU) and their processes' start then run beside
the model's answer, never before the request.
A session of the warm server starts them at once instead, in the background (nothing to
import, spare tool hosts to adopt: its first tool call finds them ready; `SessionParts.
start_at_once`).

    LaterToolHosts   the sandboxed tool hosts (a `ToolRunner` and the hooks' `WarmHookHost`)
    LaterSubagents   the worker pool behind `dispatch_agent` (a `SubagentRunner`)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from orchestrator.aio import closing_iter
from orchestrator.model.base import ModelClient, ModelEvent, ModelRequest

if TYPE_CHECKING:
    from orchestrator.agents.types import (
        SubagentEvent,
        SubagentOutcome,
        SubagentPermission,
        SubagentRequest,
        SubagentRunner,
    )
    from orchestrator.calls.pipeline import ToolRunner
    from orchestrator.calls.plan import CallPlan
    from orchestrator.hooks.process import HookCommand, HookProcess
    from orchestrator.hooks.runner import WarmHookHost
    from orchestrator.tools.base import Checked, ToolContext, ToolOutput, ToolProgress

__all__ = ["FirstResponseStarts", "LaterSubagents", "LaterToolHosts"]

P = TypeVar("P")


class _Later(Generic[P]):
    """The real part, opened by `open` in the background once `start()` was called, kept open
    until `running()`'s block is left. A part that fails to open fails the session's nursery,
    as it would have at start-up."""

    def __init__(self, open: Callable[[], AbstractAsyncContextManager[P]]) -> None:
        self._open = open
        self._gate = trio.Event()
        self._ready = trio.Event()
        self._part: P | None = None

    def start(self) -> None:
        self._gate.set()

    @property
    def opened(self) -> P | None:
        """The real part once it is open, else None."""
        return self._part

    async def part(self) -> P:
        """The real part: started now if it was not, once it is open."""
        self.start()
        return await self.when_open()

    async def when_open(self) -> P:
        """The real part once something started it and it is open."""
        await self._ready.wait()
        assert self._part is not None
        return self._part

    async def _run(self) -> None:
        await self._gate.wait()
        async with self._open() as part:
            self._part = part
            self._ready.set()
            await trio.sleep_forever()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The block during which the part may run; leaving it closes it (its own teardown)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()


class LaterToolHosts:
    """The sandboxed tool hosts, opened on `start()` or by the first call or hook that needs
    them. `open` gives a runner that is also a `WarmHookHost` (the CLI's tool hosts)."""

    def __init__(self, open: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._later: _Later[Any] = _Later(open)

    def start(self) -> None:
        self._later.start()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LaterToolHosts]:
        async with self._later.running():
            yield self

    async def validate(self, plan: CallPlan, ctx: ToolContext) -> str | None:
        runner: ToolRunner = await self._later.part()
        return await runner.validate(plan, ctx)

    merged_checks = True
    """The hosts validate in the sandbox: a trip of its own (`ToolRunner`)."""

    async def call(
        self, plan: CallPlan, ctx: ToolContext, *, validate: bool = False
    ) -> AsyncGenerator[Checked | ToolProgress | ToolOutput, None]:
        runner: ToolRunner = await self._later.part()
        calling = runner.call(plan, ctx, validate=True) if validate else runner.call(plan, ctx)
        async with closing_iter(calling) as items:
            async for item in items:
                yield item

    async def run_hook(self, hook: HookCommand, *, writable: bool) -> HookProcess:
        host: WarmHookHost = await self._later.part()
        return await host.run_hook(hook, writable=writable)


class LaterSubagents:
    """The worker pool, opened on `start()` or by the first subagent. A pool told to expect
    writers (`dispatch_agent` when a type may write) is told so once it is open."""

    def __init__(self, open: Callable[[], AbstractAsyncContextManager[SubagentRunner]]) -> None:
        self._later: _Later[SubagentRunner] = _Later(open)
        self._writers = False

    def start(self) -> None:
        self._later.start()

    @property
    def opened(self) -> SubagentRunner | None:
        """The pool once it is open, else None."""
        return self._later.opened

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LaterSubagents]:
        async with self._later.running(), trio.open_nursery() as nursery:
            nursery.start_soon(self._tell_writers)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    def expect_writers(self) -> None:
        """Keep a writable worker warm once the pool is open (`WarmsWriters`); it does not
        start the pool."""
        self._writers = True
        pool = self._later.opened
        if pool is not None:
            self._tell(pool)

    async def _tell_writers(self) -> None:
        pool = await self._later.when_open()
        if self._writers:
            self._tell(pool)

    def _tell(self, pool: SubagentRunner) -> None:
        from orchestrator.agents.types import WarmsWriters

        if isinstance(pool, WarmsWriters):
            pool.expect_writers()

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome:
        pool = await self._later.part()
        return await pool.run(request, on_event=on_event, permission=permission)


class FirstResponseStarts:
    """The session's model for a run whose parts have not started: the first event of the
    response (or the end of a request that failed) starts them, so they never run before the
    first request is on its way."""

    def __init__(self, model: ModelClient, starts: Sequence[Callable[[], None]]) -> None:
        self._model = model
        self._starts = tuple(starts)
        self._started = False

    @property
    def model(self) -> str:
        return self._model.model

    async def aclose(self) -> None:
        return None  # the session owns the model

    def _start(self) -> None:
        """Once: it wraps every request of the run, and each start takes its part's lock (the
        change scan's is held while its first scan is taken over, ~100 ms on 10,000 files)."""
        if self._started:
            return
        self._started = True
        for start in self._starts:
            start()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        try:
            async with closing_iter(self._model.stream(request)) as events:
                async for event in events:
                    self._start()
                    yield event
        finally:
            self._start()
