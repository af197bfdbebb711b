"""Shared pieces of the pool, worker and dispatch tests.

- `tools(role)`: the `--tools` factory of test workers (`tests.workers.agent_kit:tools`): the
  built-in tools plus probes that report on, or misbehave inside, the worker's sandbox.
- `FunctionModel`: a coordinator-side `ModelClient` that answers each request with a function
  of it, so concurrent subagents get answers that do not depend on arrival order.
- `rogue_spawner(mode)`: starts `tests.workers.rogue_worker` instead of the real worker, under
  the same sandbox.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import psutil
import trio
from pydantic import Field

from orchestrator.agents.types import AgentType, SubagentEvent, SubagentRequest
from orchestrator.calls.permissions import Allow, Deny
from orchestrator.messages import (
    AssistantMessage,
    ContentBlock,
    Message,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.model.base import BlockComplete, MessageComplete, ModelEvent, ModelRequest
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.registry import ToolRegistry
from workers.agent_worker import worker_tools
from workers.protocol import HostRole
from workers.toolhost_runner import HostLaunch, HostProcess, HostSpawner, SandboxedSpawner

FACTORY = "tests.workers.agent_kit:tools"
SECRET = "sk-ant-secret-never-in-a-sandbox"
"""Put in the coordinator's environment as ANTHROPIC_API_KEY by tests that check the scrub."""


# --- tools the test workers have ---------------------------------------------------------------


class ProbeInput(ToolInput):
    label: str = Field(default="", description="echoed back")


class ProbeTool(Tool[ProbeInput]):
    """Claims to be read-only; reports what the worker's sandbox lets it see and do."""

    name = "Probe"
    input_model = ProbeInput
    description = "Reports on the sandbox."

    def is_read_only(self, input: ProbeInput) -> bool:
        return True

    async def call(
        self, input: ProbeInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        target = ctx.workspace / f"probe-{input.label or 'x'}.txt"
        try:
            target.write_text("written")
            wrote = "wrote"
        except OSError as exc:
            wrote = f"write failed: {exc.strerror}"
        environ = "\n".join(f"{k}={v}" for k, v in os.environ.items())
        key_seen = "ANTHROPIC_API_KEY" in os.environ or SECRET in environ
        yield ToolOutput.text(f"label={input.label} {wrote} key_seen={key_seen}")


class HogInput(ToolInput):
    mib: int = 200


class HogTool(Tool[HogInput]):
    """Holds `mib` MiB of touched memory until cancelled."""

    name = "Hog"
    input_model = HogInput
    description = "test"

    def is_read_only(self, input: HogInput) -> bool:
        return True

    async def call(
        self, input: HogInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        held = bytearray(input.mib * 1024 * 1024)
        for i in range(0, len(held), 4096):
            held[i] = 1
        await trio.sleep_forever()
        yield ToolOutput.text(str(len(held)))


class BlockInput(ToolInput):
    seconds: float = 1000.0
    spin: bool = False
    """Burn CPU instead of sleeping."""


class BlockTool(Tool[BlockInput]):
    """Blocks the worker's event loop (sleeping or spinning): the worker hangs."""

    name = "Block"
    input_model = BlockInput
    description = "test"

    def is_read_only(self, input: BlockInput) -> bool:
        return True

    async def call(
        self, input: BlockInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        end = time.monotonic() + input.seconds
        while time.monotonic() < end:
            if not input.spin:
                time.sleep(input.seconds)  # noqa: ASYNC251 (blocking the loop is the point)
        yield ToolOutput.text("unblocked")


def tools(role: HostRole) -> ToolRegistry:
    """The built-in tools of a worker of `role`, plus the test tools."""
    return ToolRegistry([*worker_tools(role), ProbeTool(), HogTool(), BlockTool()])


# --- the coordinator side ----------------------------------------------------------------------

Respond = Callable[[ModelRequest], Awaitable[Sequence[ContentBlock]]]


class FunctionModel:
    """A `ModelClient` whose answer to each request is `await respond(request)`."""

    def __init__(self, respond: Respond, *, name: str = "function-model") -> None:
        self._respond = respond
        self._name = name
        self.requests: list[ModelRequest] = []
        self.started_at: list[float] = []
        """`time.perf_counter()` when each request arrived."""

    @property
    def model(self) -> str:
        return self._name

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.started_at.append(time.perf_counter())
        self.requests.append(request)
        blocks = list(await self._respond(request))
        for index, block in enumerate(blocks):
            yield BlockComplete(index, block)
        has_tools = any(isinstance(b, ToolUseBlock) for b in blocks)
        yield MessageComplete(
            AssistantMessage(
                message=Message(role="assistant", content=blocks),
                model=self._name,
                stop_reason="tool_use" if has_tools else "end_turn",
                usage=Usage(input_tokens=10, output_tokens=5),
                cost_usd=0.001,
            )
        )


def text(value: str) -> list[ContentBlock]:
    return [TextBlock(text=value)]


def tool_use(name: str, input: dict[str, Any], id: str = "toolu_1") -> list[ContentBlock]:
    return [ToolUseBlock(id=id, name=name, input=input)]


def first_prompt(request: ModelRequest) -> str:
    return request.messages[0].text()


def turn_of(request: ModelRequest) -> int:
    """1 for an agent's first request, 2 for the one after its first tool results, ..."""
    return (len(request.messages) + 1) // 2


def agent(
    name: str = "probe",
    *,
    tools: Sequence[str] = ("Read", "LS", "Probe"),
    writable: bool = False,
    max_turns: int = 10,
) -> AgentType:
    return AgentType(
        name=name,
        description=f"the {name} test agent",
        system_prompt=f"You are the {name} test agent.",
        tools=tuple(tools),
        writable=writable,
        max_turns=max_turns,
    )


def request(agent_type: AgentType, prompt: str, agent_id: str = "agent-t1") -> SubagentRequest:
    return SubagentRequest(agent_id, agent_type, prompt, [agent_type.system_prompt])


async def allow_all(tool: str, input: dict[str, Any]) -> Allow | Deny:
    return Allow(rule="test: allow all")


@dataclasses.dataclass
class Collected:
    """An `on_event` sink that keeps every event."""

    events: list[SubagentEvent] = dataclasses.field(default_factory=list)

    def __call__(self, event: SubagentEvent) -> None:
        self.events.append(event)


def rogue_spawner(mode: str) -> HostSpawner:
    """Start `tests.workers.rogue_worker MODE` in the real worker's sandbox the first time, and
    real workers after it (to show the pool goes on)."""
    inner = SandboxedSpawner()
    spawned = 0

    def spawn(launch: HostLaunch) -> AbstractAsyncContextManager[HostProcess]:
        nonlocal spawned
        spawned += 1
        if spawned > 1:
            return inner(launch)
        argv = (sys.executable, "-I", "-m", "tests.workers.rogue_worker", mode)
        return inner(dataclasses.replace(launch, argv=argv))

    return spawn


def descendants() -> list[psutil.Process]:
    """Our live descendant processes (zombies not yet reaped count as gone)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def worker_python(pid: int) -> psutil.Process:
    """The worker's Python process inside the sandbox whose bwrap is `pid`."""
    for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        if "bwrap" not in proc.name() and any("worker" in part for part in proc.cmdline()):
            return proc
    raise AssertionError(f"no worker python under {pid}")


def workspace_at(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\nbeta\n")
    return ws.resolve()
