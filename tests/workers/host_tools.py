"""Test-only tools for tool hosts, and the `--tools` factory that adds them to the built-ins.

Tool hosts import this module by name (`tests.workers.host_tools:tools`), so each host builds
its own instances: state kept on a tool (the rendezvous) is per host, as in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio
from pydantic import Field

from orchestrator.errors import ToolError
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.registry import ToolRegistry
from workers.protocol import HostRole
from workers.toolhost import host_tools

FACTORY = "tests.workers.host_tools:tools"


class RendezvousInput(ToolInput):
    key: str
    count: int = Field(ge=1)
    timeout_s: float = 20.0


class RendezvousTool(Tool[RendezvousInput]):
    """Read-only; answers "met" once `count` calls with the same key are running at the same
    time in this host, "alone" if that did not happen within `timeout_s`."""

    name = "Rendezvous"
    input_model = RendezvousInput
    description = "test"

    def __init__(self) -> None:
        self._arrived: dict[str, int] = {}
        self._met: dict[str, trio.Event] = {}

    def is_read_only(self, input: RendezvousInput) -> bool:
        return True

    async def call(
        self, input: RendezvousInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        met = self._met.setdefault(input.key, trio.Event())
        self._arrived[input.key] = self._arrived.get(input.key, 0) + 1
        if self._arrived[input.key] >= input.count:
            met.set()
        with trio.move_on_after(input.timeout_s):
            await met.wait()
        yield ToolOutput.text("met" if met.is_set() else "alone")


class HangInput(ToolInput):
    read_only: bool = False


class HangTool(Tool[HangInput]):
    """Says "started" as progress, then waits forever (until cancelled or killed)."""

    name = "Hang"
    input_model = HangInput
    description = "test"

    def is_read_only(self, input: HangInput) -> bool:
        return input.read_only

    async def call(
        self, input: HangInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        yield ToolProgress("started")
        await trio.sleep_forever()
        yield ToolOutput.text("unreachable")


class WriteAnywayInput(ToolInput):
    file_path: str
    content: str = "written"


class WriteAnywayTool(Tool[WriteAnywayInput]):
    """Claims to be read-only and writes a file anyway: a misclassified tool."""

    name = "WriteAnyway"
    input_model = WriteAnywayInput
    description = "test"

    def is_read_only(self, input: WriteAnywayInput) -> bool:
        return True

    async def call(
        self, input: WriteAnywayInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        await trio.Path(input.file_path).write_text(input.content)
        yield ToolOutput.text("wrote it")


class FailInput(ToolInput):
    how: str = "tool_error"


class FailTool(Tool[FailInput]):
    """Fails in the way the input says: a `ToolError`, an exception, or no output at all."""

    name = "Fail"
    input_model = FailInput
    description = "test"

    async def call(
        self, input: FailInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        if input.how == "tool_error":
            raise ToolError("refused, for the model")
        if input.how == "exception":
            raise RuntimeError("boom")
        if False:
            yield ToolOutput.text("never")


class NoisyInput(ToolInput):
    size: int = 0
    """Characters of output to return (beyond the protocol's line cap: the host refuses it)."""


class NoisyTool(Tool[NoisyInput]):
    """Prints to stdout, from Python and from a child process, then returns `size` x's."""

    name = "Noisy"
    input_model = NoisyInput
    description = "test"

    def is_read_only(self, input: NoisyInput) -> bool:
        return True

    async def call(
        self, input: NoisyInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        print("stray print from a tool", flush=True)
        await trio.run_process(["echo", "stray output of a child"])
        yield ToolOutput.text("x" * input.size if input.size else "quiet now")


def tools(role: HostRole) -> ToolRegistry:
    """The built-in tools of a host of `role`, plus the test tools."""
    return ToolRegistry(
        [
            *host_tools(role),
            RendezvousTool(),
            HangTool(),
            WriteAnywayTool(),
            FailTool(),
            NoisyTool(),
        ]
    )
