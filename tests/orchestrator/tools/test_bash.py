"""The Bash tool end to end with real processes: schema, rendering, workspace, concurrency."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from pydantic import ValidationError

from orchestrator.errors import ToolError
from orchestrator.tools.base import ToolContext, ToolOutput
from orchestrator.tools.bash import (
    DEFAULT_TIMEOUT_MS,
    MAX_BACKGROUND_TIMEOUT_MS,
    MAX_OUTPUT_CHARS,
    MAX_TIMEOUT_MS,
    TIMEOUT_MARGIN_S,
    BashInput,
    BashTool,
)
from tests.orchestrator.test_shell import marker_sleep, processes_with


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[ToolContext]:
    workspace = (tmp_path / "ws").resolve()
    (workspace / "sub").mkdir(parents=True)
    context = ToolContext(workspace=workspace, cwd=workspace)
    try:
        yield context
    finally:
        await context.aclose()


async def call(tool: BashTool, ctx: ToolContext, **raw: Any) -> ToolOutput:
    items = [item async for item in tool.call(tool.parse_input(raw), ctx)]
    assert len(items) == 1 and isinstance(items[0], ToolOutput)
    return items[0]


def our_processes() -> list[list[str]]:
    """Command lines of every process this test process started and has not reaped."""
    return [p.cmdline() for p in psutil.Process().children(recursive=True)]


PERSISTENT_SHELL = ["bash", "--noprofile", "--norc"]


def test_one_timeout_rule() -> None:
    tool = BashTool()
    assert tool.timeout_s(BashInput(command="x")) == DEFAULT_TIMEOUT_MS / 1000 + TIMEOUT_MARGIN_S
    assert tool.timeout_s(BashInput(command="x", timeout=1500)) == 1.5 + TIMEOUT_MARGIN_S
    for bad in (0, MAX_TIMEOUT_MS + 1):
        with pytest.raises(ValidationError):
            tool.parse_input({"command": "x", "timeout": bad})
    # The schema allows a background command's longest; a foreground one is held to less.
    schema = tool.input_schema()["properties"]["timeout"]["anyOf"][0]
    assert schema["maximum"] == MAX_BACKGROUND_TIMEOUT_MS
    assert f"max {MAX_TIMEOUT_MS} for a foreground command" in schema.get(
        "description", tool.input_schema()["properties"]["timeout"].get("description", "")
    )


def test_description_tells_the_model_the_rules() -> None:
    text = BashTool.description
    for needle in ("Read", "Grep", "Glob", "milliseconds", "600000", "30000", "persists", "stdin"):
        assert needle in text


def test_render_use() -> None:
    tool = BashTool()
    assert tool.render_use(BashInput(command="git status")) == "Bash(git status)"
    assert tool.render_use(BashInput(command="make\nmake test")) == "Bash(make …)"
    long = tool.render_use(BashInput(command="echo " + "x" * 200))
    assert long.endswith("…)") and len(long) == len("Bash()") + 80


def test_read_only_only_through_the_classifier() -> None:
    ls, rm = BashInput(command="ls"), BashInput(command="rm -rf build")
    plain = BashTool()
    assert not plain.is_read_only(ls) and not plain.is_concurrency_safe(ls)
    classified = BashTool(classifier=lambda command: command.startswith("ls"))
    assert classified.is_read_only(ls) and classified.is_concurrency_safe(ls)
    assert not classified.is_concurrency_safe(rm)


async def test_streams_and_exit_code(ctx: ToolContext) -> None:
    out = await call(BashTool(), ctx, command="echo out; echo err >&2; exit 3")
    assert out.content == "out\n[stderr]\nerr\nExit code: 3"
    assert out.summary == "exit 3 · 1 line stdout, 1 line stderr"
    assert not out.is_error
    quiet = await call(BashTool(), ctx, command="true", description="Do nothing")
    assert (quiet.content, quiet.summary) == (
        "(no output)",
        "exit 0 · 0 lines stdout, 0 lines stderr",
    )


async def test_state_persists_between_calls(ctx: ToolContext) -> None:
    tool = BashTool()
    await call(tool, ctx, command="cd sub && export WARREN_TEST=42")
    out = await call(tool, ctx, command='pwd; echo "$WARREN_TEST"')
    assert out.content == f"{ctx.workspace / 'sub'}\n42"


async def test_a_read_only_workers_bash_is_one_shot_without_background_and_says_so(
    ctx: ToolContext,
) -> None:
    """`general`'s Bash in its read-only worker (`workers.agent_worker.worker_tools`): no
    `run_in_background` in its schema or description, a foreground limit, and every command
    in a fresh shell, which its description says instead of the persistent shell's rules."""
    tool = BashTool(backgrounds=False, persistent=False)
    properties = tool.input_schema()["properties"]
    assert "run_in_background" not in properties
    assert properties["timeout"]["anyOf"][0]["maximum"] == MAX_TIMEOUT_MS
    assert str(MAX_BACKGROUND_TIMEOUT_MS) not in properties["timeout"]["description"]
    assert "run_in_background" not in tool.description and "persists" not in tool.description
    assert "fresh shell" in tool.description and "is killed then" in tool.description
    assert "run_in_background" in BashTool().input_schema()["properties"]  # the main agent's
    assert BashTool.description == BashTool().description
    await call(tool, ctx, command="cd sub && export WARREN_TEST=42")
    out = await call(tool, ctx, command='pwd; echo "${WARREN_TEST:-unset}"')
    assert out.content == f"{ctx.workspace}\nunset"


@pytest.mark.parametrize("target", ["/", "../ws-evil", "link-out"])
async def test_cd_outside_the_workspace_is_reset(ctx: ToolContext, target: str) -> None:
    (ctx.workspace.parent / "ws-evil").mkdir()
    (ctx.workspace / "link-out").symlink_to(ctx.workspace.parent)
    tool = BashTool()
    out = await call(tool, ctx, command=f"cd {target} && echo moved")
    assert out.as_text().startswith("moved\nNote: The command left the shell in ")
    assert f"the working directory was reset to {ctx.workspace}." in out.as_text()
    assert (await call(tool, ctx, command="pwd")).content == str(ctx.workspace)


async def test_cd_inside_the_workspace_has_no_note(ctx: ToolContext) -> None:
    out = await call(BashTool(), ctx, command="cd sub && pwd")
    assert out.content == str(ctx.workspace / "sub")


async def test_syntax_error_never_reaches_the_shell(ctx: ToolContext) -> None:
    marker = ctx.workspace / "ran"
    with pytest.raises(ToolError, match="syntax error") as info:
        await call(BashTool(), ctx, command=f"touch {marker}; if")
    assert "was not run" in info.value.message
    assert not marker.exists()
    assert our_processes() == []  # not even a shell was started


async def test_timeout_is_reported(ctx: ToolContext) -> None:
    out = await call(BashTool(), ctx, command="echo begun; sleep 30", timeout=300)
    assert out.is_error
    assert out.as_text().startswith(
        "begun\nExit code: 143\nNote: The command timed out after 0.3 s"
    )
    assert out.summary is not None and out.summary.startswith("timed out after 0.3 s")


async def test_output_is_capped(ctx: ToolContext) -> None:
    out = await call(BashTool(), ctx, command="head -c 100000 /dev/zero | tr '\\0' b")
    assert "[... 70000 characters (0 lines) removed from the middle" in out.as_text()
    assert out.as_text().count("b") == MAX_OUTPUT_CHARS


async def test_cancellation_leaves_no_process(ctx: ToolContext) -> None:
    sleep, marker = marker_sleep()
    await call(BashTool(), ctx, command="true")  # the shell is up before the clock starts
    with trio.move_on_after(0.5) as scope:
        await call(BashTool(), ctx, command=f"{sleep} & {sleep}")
    assert scope.cancelled_caught
    assert processes_with(marker) == []
    assert our_processes() == [PERSISTENT_SHELL]
    await ctx.aclose()
    assert our_processes() == []


async def test_read_only_calls_run_in_parallel_one_shot_shells(ctx: ToolContext) -> None:
    tool = BashTool(classifier=lambda command: True)
    # Each command waits (bounded) for the other's file: both succeed only if they overlap.
    wait_for = "for _ in $(seq 200); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 1"
    results: dict[str, ToolOutput] = {}

    async def run(mine: str, other: str) -> None:
        command = f"touch {mine}; " + wait_for.format(other)
        results[mine] = await call(tool, ctx, command=command)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "a", "b")
        nursery.start_soon(run, "b", "a")
    assert {k: v.summary for k, v in results.items()} == {
        "a": "exit 0 · 0 lines stdout, 0 lines stderr",
        "b": "exit 0 · 0 lines stdout, 0 lines stderr",
    }
    assert our_processes() == []  # one-shots are reaped; no persistent shell was started
