"""FIFOs, devices and sockets: the file tools refuse them at once and never block on them.

Opening a FIFO for reading waits for a writer, and reading /dev/zero or /dev/urandom never
ends, so every case runs under `trio.fail_after`: a hang guard that fails the test instead of
freezing the suite, not a timing assertion.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.edit import EditTool
from orchestrator.tools.glob import GlobTool
from orchestrator.tools.grep import GrepTool
from orchestrator.tools.ls import LSTool
from orchestrator.tools.notebook_edit import NotebookEditTool
from orchestrator.tools.read import ReadTool
from orchestrator.tools.write import WriteTool
from tests.orchestrator.tools.conftest import Outcome, run_tool

READ = ReadTool()
GREP = GrepTool()
GLOB = GlobTool()
LS = LSTool()
HANG_GUARD_S = 20


@pytest.fixture
def dev_ctx(ws: Path) -> ToolContext:
    """A context whose roots include /dev, so device paths pass the workspace check."""
    return ToolContext(workspace=ws, cwd=ws, extra_roots=(Path("/dev"),))


@pytest.fixture
def unix_socket(ws: Path) -> Iterator[Path]:
    path = ws / "s.sock"
    if len(os.fsencode(path)) > 100:
        pytest.skip(f"{path} is too long for a Unix socket address")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    try:
        yield path
    finally:
        sock.close()


def special_paths(ws: Path, unix_socket: Path) -> dict[str, tuple[Path, str]]:
    fifo = ws / "pipe"
    os.mkfifo(fifo)
    link = ws / "CLAUDE.md"
    link.symlink_to(fifo)
    return {
        "fifo": (fifo, "FIFO"),
        "symlink to a fifo": (link, "FIFO"),
        "socket": (unix_socket, "socket"),
        "/dev/zero": (Path("/dev/zero"), "character device"),
        "/dev/urandom": (Path("/dev/urandom"), "character device"),
        "/dev/null": (Path("/dev/null"), "character device"),
    }


async def guarded(tool: Tool[Any], raw: dict[str, Any], ctx: ToolContext, **kw: Any) -> Outcome:
    with trio.fail_after(HANG_GUARD_S):
        return await run_tool(tool, raw, ctx, **kw)


async def test_read_refuses_every_non_regular_file_at_once(
    ws: Path, dev_ctx: ToolContext, unix_socket: Path
) -> None:
    for name, (path, kind) in special_paths(ws, unix_socket).items():
        out = await guarded(READ, {"file_path": str(path)}, dev_ctx)
        assert out.stage == "refused", name
        assert kind in out.text and "not a regular file" in out.text, name
        assert dev_ctx.read_ledger.recorded_mtime(path) is None


async def test_grep_refuses_a_non_regular_path_at_once(
    ws: Path, dev_ctx: ToolContext, unix_socket: Path
) -> None:
    for name, (path, kind) in special_paths(ws, unix_socket).items():
        out = await guarded(GREP, {"pattern": "x", "path": str(path)}, dev_ctx)
        assert out.stage == "refused", name
        assert kind in out.text, name


def swap_for_fifo(path: Path) -> Callable[[], None]:
    def swap() -> None:
        path.unlink()
        os.mkfifo(path)

    return swap


async def test_a_file_swapped_for_a_fifo_after_validation_is_refused_not_waited_on(
    ws: Path, ctx: ToolContext
) -> None:
    for tool, raw in (
        (READ, {"file_path": str(ws / "a.txt")}),
        (GREP, {"pattern": "needle", "path": str(ws / "a.txt")}),
    ):
        (ws / "a.txt").write_text("needle\n")
        out = await guarded(tool, raw, ctx, after_validate=swap_for_fifo(ws / "a.txt"))
        assert out.stage == "error", tool.name
        assert "FIFO" in out.text, tool.name
        (ws / "a.txt").unlink()


async def test_searching_a_directory_with_a_fifo_does_not_hang(ws: Path, ctx: ToolContext) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("needle = 1\n")
    os.mkfifo(ws / "src" / "pipe.py")
    os.mkfifo(ws / "pipe.txt")

    grep = await guarded(GREP, {"pattern": "needle", "output_mode": "content"}, ctx)
    assert grep.stage == "ok" and "a.py:1:needle = 1" in grep.text

    glob = await guarded(GLOB, {"pattern": "**/*.py"}, ctx)
    assert glob.stage == "ok" and "a.py" in glob.text

    ls = await guarded(LS, {"path": str(ws)}, ctx)
    assert ls.stage == "ok" and "pipe.txt" in ls.text

    listing = await guarded(LS, {"path": str(ws / "pipe.txt")}, ctx)
    assert listing.stage == "refused" and "FIFO" in listing.text


@pytest.mark.parametrize("tool", [WriteTool(), EditTool(), NotebookEditTool()])
async def test_writing_tools_do_not_touch_a_fifo(
    ws: Path, ctx: ToolContext, tool: Tool[Any]
) -> None:
    fifo = ws / ("pipe.ipynb" if tool.name == "NotebookEdit" else "pipe.txt")
    os.mkfifo(fifo)
    ctx.read_ledger.record(fifo)  # as if it had been read: the kind check must still refuse
    inputs: dict[str, dict[str, Any]] = {
        "Write": {"file_path": str(fifo), "content": "x\n"},
        "Edit": {"file_path": str(fifo), "old_string": "a", "new_string": "b"},
        "NotebookEdit": {"notebook_path": str(fifo), "cell_number": 0, "new_source": "x"},
    }
    out = await guarded(tool, inputs[tool.name], ctx)
    assert out.stage in ("refused", "error")
    assert "FIFO" in out.text, out.text
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
