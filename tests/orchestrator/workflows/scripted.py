"""What the workflow script tests share: a host that answers agent calls as a test scripts it,
and running a script in a real sandbox with it."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from orchestrator.limits import Limits
from orchestrator.workflows.script import (
    AgentCall,
    AgentFailedError,
    ScriptEnd,
    run_script,
    script_sandbox,
)
from sandbox.host import SandboxHost
from sandbox.spec import SandboxSpec

META = 'META = {"name": "test", "description": "a test workflow"}\n'
RUN_LIMIT_S = 60
"""A test's run that has not ended by then has hung (a deadlock the test is there to catch)."""


class ScriptedHost:
    """Answers `agent(prompt)` with `done:<prompt>` and fails a prompt containing `fail`;
    `before(call)`, when given, runs first (to hold an answer back). Records the calls, their
    answers' order, the phases and the log lines; `arrived[prompt]` and `answered[prompt]`
    are set as each call comes and goes."""

    def __init__(self, before: Callable[[AgentCall], Awaitable[None]] | None = None) -> None:
        self.before = before
        self.calls: list[AgentCall] = []
        self.order: list[str] = []
        self.phases: list[str] = []
        self.logs: list[str] = []
        self.arrived: defaultdict[str, trio.Event] = defaultdict(trio.Event)
        self.answered: defaultdict[str, trio.Event] = defaultdict(trio.Event)

    async def agent(self, call: AgentCall) -> Any:
        self.calls.append(call)
        self.arrived[call.prompt].set()
        try:
            if self.before is not None:
                await self.before(call)
            if "fail" in call.prompt:
                raise AgentFailedError(f"failed: {call.prompt}")
            return f"done:{call.prompt}"
        finally:
            self.order.append(call.prompt)
            self.answered[call.prompt].set()

    def phase(self, title: str) -> None:
        self.phases.append(title)

    def log(self, text: str) -> None:
        self.logs.append(text)

    def keys(self) -> dict[str, str]:
        return {call.prompt: call.key for call in self.calls}


async def run(
    body: str,
    host: ScriptedHost,
    workspace: Path,
    sandbox_host: SandboxHost,
    *,
    args: Any = None,
    limits: Limits | None = None,
    floor: SandboxSpec | None = None,
) -> ScriptEnd:
    """`body` (dedented, after a META line) as a workflow in the read-only sandbox of
    `workspace`."""
    sandbox = script_sandbox(
        floor or SandboxSpec(), [workspace], limits or Limits(), host=sandbox_host
    )
    with trio.fail_after(RUN_LIMIT_S):
        return await run_script(
            META + textwrap.dedent(body), args, host, sandbox, run_id="run-test"
        )
