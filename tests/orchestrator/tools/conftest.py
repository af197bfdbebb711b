"""Fixtures for the tool tests: a workspace, its context, and running a tool as the pipeline does.

`run_tool` goes parse_input -> validate -> call, like orchestrator/calls/pipeline.py, and reports
which stage stopped the call, so a test can assert that a refusal happens at validation (before
a permission prompt) rather than as a failure during the call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest

from orchestrator.aio import closing_iter
from orchestrator.errors import ToolError
from orchestrator.messages import ImageBlock
from orchestrator.tools.base import Tool, ToolContext, ToolOutput, ToolProgress

__all__ = ["Outcome", "run_tool", "set_mtime_later"]


@dataclass(frozen=True)
class Outcome:
    stage: Literal["ok", "schema_error", "refused", "error"]
    """ok: a ToolOutput; schema_error: parse_input failed; refused: validate returned a
    message; error: the call raised ToolError."""
    text: str
    output: ToolOutput | None = None
    progress: tuple[ToolProgress, ...] = ()
    use: str = ""
    """The tool's one-line rendering of the call."""

    def images(self) -> list[ImageBlock]:
        if self.output is None or isinstance(self.output.content, str):
            return []
        return [b for b in self.output.content if isinstance(b, ImageBlock)]


async def run_tool(
    tool: Tool[Any],
    raw: dict[str, Any],
    ctx: ToolContext,
    *,
    after_validate: Callable[[], None] | None = None,
) -> Outcome:
    """Run one call like the pipeline (minus permissions); `after_validate` runs between
    validation and the call, to simulate the world changing while permission is asked."""
    try:
        input = tool.parse_input(raw)
    except pydantic.ValidationError as exc:
        return Outcome("schema_error", str(exc))
    use = tool.render_use(input)
    assert "\n" not in use
    refusal = await tool.validate(input, ctx)
    if refusal is not None:
        return Outcome("refused", refusal, use=use)
    if after_validate is not None:
        after_validate()
    output: ToolOutput | None = None
    progress: list[ToolProgress] = []
    try:
        async with closing_iter(tool.call(input, ctx)) as events:
            async for event in events:
                if isinstance(event, ToolOutput):
                    assert output is None, "a call must yield exactly one ToolOutput"
                    output = event
                else:
                    progress.append(event)
    except ToolError as exc:
        return Outcome("error", exc.message, use=use)
    assert output is not None, "the call yielded no ToolOutput"
    assert tool.render_result(output)
    return Outcome("ok", output.as_text(), output, tuple(progress), use)


def set_mtime_later(path: Path, seconds: float = 10.0) -> None:
    """Move a file's mtime forward explicitly: a change made within one clock tick of the
    previous one can keep the same mtime, and tests must not depend on timing."""
    stat = os.stat(path)
    later = stat.st_mtime_ns + int(seconds * 1e9)
    os.utime(path, ns=(stat.st_atime_ns, later))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace root (resolved); `tmp_path` itself holds things outside it."""
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, cwd=ws)
