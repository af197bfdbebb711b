"""What every file tool promises the loop and the model: names, schemas, read-only flags.

Also the shared path and text helpers of tools/_files.py.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import pydantic
import pytest

from orchestrator.tools._files import (
    binary_problem,
    load_text,
    path_problem,
    run_ripgrep,
    snippet,
    stale_read_problem,
)
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.edit import EditTool
from orchestrator.tools.glob import GlobTool
from orchestrator.tools.grep import GrepTool
from orchestrator.tools.ls import LSTool
from orchestrator.tools.multi_edit import MultiEditTool
from orchestrator.tools.notebook_edit import NotebookEditTool
from orchestrator.tools.read import ReadTool
from orchestrator.tools.think import ThinkTool
from orchestrator.tools.write import WriteTool
from tests.orchestrator.tools.conftest import run_tool

CASES: list[tuple[Tool[Any], str, dict[str, Any], bool]] = [
    (ReadTool(), "Read", {"file_path": "/x"}, True),
    (WriteTool(), "Write", {"file_path": "/x", "content": ""}, False),
    (EditTool(), "Edit", {"file_path": "/x", "old_string": "a", "new_string": "b"}, False),
    (
        MultiEditTool(),
        "MultiEdit",
        {"file_path": "/x", "edits": [{"old_string": "a", "new_string": "b"}]},
        False,
    ),
    (
        NotebookEditTool(),
        "NotebookEdit",
        {"notebook_path": "/x.ipynb", "cell_number": 0, "new_source": ""},
        False,
    ),
    (GlobTool(), "Glob", {"pattern": "*"}, True),
    (GrepTool(), "Grep", {"pattern": "x"}, True),
    (LSTool(), "LS", {"path": "/x"}, True),
    (ThinkTool(), "Think", {"thought": "hmm"}, True),
]


@pytest.mark.parametrize(("tool", "name", "minimal", "read_only"), CASES, ids=[c[1] for c in CASES])
def test_tool_contract(
    tool: Tool[Any], name: str, minimal: dict[str, Any], read_only: bool
) -> None:
    assert tool.name == name
    assert type(tool).__name__ == f"{name}Tool"
    parsed = tool.parse_input(minimal)
    assert tool.is_read_only(parsed) is read_only
    assert tool.is_concurrency_safe(parsed) is read_only
    with pytest.raises(pydantic.ValidationError):
        tool.parse_input({**minimal, "unexpected": 1})
    schema = tool.input_schema()
    models = [schema, *schema.get("$defs", {}).values()]
    for model in models:
        assert model.get("additionalProperties") is False
        for field, spec in model["properties"].items():
            assert spec.get("description"), f"{name}.{field} has no description for the model"
    assert len(tool.description) > (100 if name == "Think" else 300)
    assert "\n" not in tool.render_use(parsed)


async def test_think_logs_and_returns_at_once(ctx: ToolContext) -> None:
    out = await run_tool(ThinkTool(), {"thought": "First read the tests.\nThen edit."}, ctx)
    assert out.stage == "ok" and out.text == "Your thought has been logged."
    assert out.output is not None and out.output.summary == "First read the tests."


# --- _files helpers -------------------------------------------------------------------------


def test_path_problem_compares_resolved_paths_not_prefixes(ws: Path, ctx: ToolContext) -> None:
    sibling = ws.parent / f"{ws.name}-evil"
    sibling.mkdir()
    assert path_problem(str(sibling / "a"), ctx, param="p") is not None
    assert path_problem(str(ws / "sub" / ".." / "a"), ctx, param="p") is None
    assert path_problem(str(ws / ".." / "a"), ctx, param="p") is not None
    loop = ws / "loop"
    loop.symlink_to(loop)
    assert "Cannot resolve" in (path_problem(str(loop / "x"), ctx, param="p") or "")


def test_extra_roots_are_inside(ws: Path) -> None:
    extra = (ws.parent / "extra").resolve()
    extra.mkdir()
    ctx = ToolContext(workspace=ws, cwd=ws, extra_roots=(extra,))
    assert path_problem(str(extra / "f"), ctx, param="p") is None


def test_stale_read_problem(ws: Path, ctx: ToolContext) -> None:
    f = ws / "f"
    assert stale_read_problem(f, ctx) is None  # a missing file needs no read
    f.write_text("x")
    assert "has not been read" in (stale_read_problem(f, ctx) or "")
    ctx.read_ledger.record(f)
    assert stale_read_problem(f, ctx) is None


@pytest.mark.parametrize(
    ("name", "head", "binary"),
    [
        ("a.txt", b"plain text\n", False),
        ("a.txt", b"\x00\x01\x02", True),
        ("a.pdf", b"%PDF-1.7 looks like text", True),
        ("a.txt", codecs.BOM_UTF16_LE + "hi".encode("utf-16-le"), False),
        ("a.txt", b"", False),
    ],
)
def test_binary_problem(name: str, head: bytes, binary: bool) -> None:
    assert (binary_problem(Path(name), head) is not None) is binary


def test_load_text_detects_mixed_line_endings_by_majority(ws: Path) -> None:
    f = ws / "mixed.txt"
    f.write_bytes(b"a\r\nb\r\nc\n")
    assert load_text(f).line_ending == "\r\n"
    f.write_bytes(b"a\r\nb\nc\n")
    assert load_text(f).line_ending == "\n"


def test_snippet_merges_nearby_regions_and_caps() -> None:
    text = "".join(f"l{i}\n" for i in range(1, 101))
    assert snippet(text, [(4, 5), (7, 8)], context=1).splitlines() == [
        f"{n:>6}\tl{n}" for n in range(4, 10)
    ]
    capped = snippet(text, [(0, 100)], context=0, max_lines=5)
    assert capped.splitlines()[-1].startswith("[... lines 6-100 not shown")


async def test_run_ripgrep_stops_at_the_output_limit(ws: Path) -> None:
    for i in range(200):
        (ws / f"file{i:03d}.txt").write_text("x\n" * 2000)
    result = await run_ripgrep(["--no-config", "x", str(ws)], cwd=ws, max_stdout_bytes=10_000)
    assert result.truncated
    assert 0 < len(result.stdout) <= 10_001 and result.stdout.endswith("\n")
    complete = await run_ripgrep(["--no-config", "--files", str(ws)], cwd=ws)
    assert not complete.truncated and complete.returncode == 0
    assert len(complete.stdout.splitlines()) == 200
