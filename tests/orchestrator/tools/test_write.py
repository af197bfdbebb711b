"""Write: creation, read-before-write, line endings and encodings, paths outside the workspace."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from orchestrator.tools.base import ToolContext
from orchestrator.tools.read import ReadTool
from orchestrator.tools.write import WriteTool
from tests.orchestrator.tools.conftest import run_tool, set_mtime_later

WRITE = WriteTool()
READ = ReadTool()


async def test_creates_file_and_parent_directories(ws: Path, ctx: ToolContext) -> None:
    f = ws / "new" / "deep" / "mod.py"
    out = await run_tool(WRITE, {"file_path": str(f), "content": "a = 1\nb = 2\n"}, ctx)
    assert out.stage == "ok"
    assert f.read_text() == "a = 1\nb = 2\n"
    assert "Created" in out.text and "2 lines" in out.text
    assert ctx.read_ledger.recorded_mtime(f) == f.stat().st_mtime_ns
    assert out.use == f"Write({f})"


async def test_overwrite_after_read_reports_a_diff_summary(ws: Path, ctx: ToolContext) -> None:
    f = ws / "a.txt"
    f.write_text("one\ntwo\nthree\n")
    await run_tool(READ, {"file_path": str(f)}, ctx)
    out = await run_tool(WRITE, {"file_path": str(f), "content": "one\n2\nthree\nfour\n"}, ctx)
    assert out.stage == "ok"
    assert "2 lines added, 1 removed" in out.text
    assert out.output is not None and out.output.summary == "Updated (+2 -1)"
    # The write recorded the new mtime: a second write needs no new Read.
    again = await run_tool(WRITE, {"file_path": str(f), "content": "x\n"}, ctx)
    assert again.stage == "ok" and f.read_text() == "x\n"


@pytest.mark.parametrize("situation", ["unread", "changed-since-read"])
async def test_refuses_blind_overwrite(ws: Path, ctx: ToolContext, situation: str) -> None:
    f = ws / "a.txt"
    f.write_text("user's work\n")
    if situation == "changed-since-read":
        await run_tool(READ, {"file_path": str(f)}, ctx)
        set_mtime_later(f)
    out = await run_tool(WRITE, {"file_path": str(f), "content": "clobber\n"}, ctx)
    assert out.stage == "refused"
    assert ("has not been read" if situation == "unread" else "changed on disk") in out.text
    assert f.read_text() == "user's work\n"


async def test_change_between_validation_and_call_is_an_error(ws: Path, ctx: ToolContext) -> None:
    f = ws / "a.txt"
    f.write_text("v1\n")
    await run_tool(READ, {"file_path": str(f)}, ctx)
    out = await run_tool(
        WRITE,
        {"file_path": str(f), "content": "v2\n"},
        ctx,
        after_validate=lambda: set_mtime_later(f),
    )
    assert out.stage == "error" and "changed on disk" in out.text
    assert f.read_text() == "v1\n"


@pytest.mark.parametrize(
    ("original", "content", "expected"),
    [
        (b"a\r\nb\r\n", "a\nc\n", b"a\r\nc\r\n"),
        (b"a\nb\n", "a\nc\n", b"a\nc\n"),
        ("caf\xe9\n".encode("latin-1"), "thé\n", "thé\n".encode("latin-1")),
        (codecs.BOM_UTF8 + b"x\n", "y\n", codecs.BOM_UTF8 + b"y\n"),
        (
            codecs.BOM_UTF16_LE + "x\r\n".encode("utf-16-le"),
            "é\n",
            codecs.BOM_UTF16_LE + "é\r\n".encode("utf-16-le"),
        ),
    ],
    ids=["crlf", "lf", "latin-1", "utf-8-bom", "utf-16-crlf"],
)
async def test_keeps_line_endings_and_encoding(
    ws: Path, ctx: ToolContext, original: bytes, content: str, expected: bytes
) -> None:
    f = ws / "f.txt"
    f.write_bytes(original)
    assert (await run_tool(READ, {"file_path": str(f)}, ctx)).stage == "ok"
    out = await run_tool(WRITE, {"file_path": str(f), "content": content}, ctx)
    assert out.stage == "ok", out.text
    assert f.read_bytes() == expected


async def test_unencodable_content_falls_back_to_utf8_with_a_note(
    ws: Path, ctx: ToolContext
) -> None:
    f = ws / "f.txt"
    f.write_bytes("caf\xe9\n".encode("latin-1"))
    await run_tool(READ, {"file_path": str(f)}, ctx)
    out = await run_tool(WRITE, {"file_path": str(f), "content": "snow ☃\n"}, ctx)
    assert out.stage == "ok" and "written as UTF-8" in out.text
    assert f.read_text(encoding="utf-8") == "snow ☃\n"


@pytest.mark.parametrize("target", ["symlink-to-outside-file", "symlinked-dir", "relative", "dir"])
async def test_refused_paths(ws: Path, ctx: ToolContext, target: str) -> None:
    outside_dir = ws.parent / "outside"
    outside_dir.mkdir()
    outside = outside_dir / "victim.txt"
    outside.write_text("keep\n")
    (ws / "link").symlink_to(outside)
    (ws / "linkdir").symlink_to(outside_dir)
    path = {
        "symlink-to-outside-file": str(ws / "link"),
        "symlinked-dir": str(ws / "linkdir" / "new.txt"),
        "relative": "victim.txt",
        "dir": str(ws),
    }[target]
    out = await run_tool(WRITE, {"file_path": path, "content": "pwned\n"}, ctx)
    assert out.stage == "refused"
    assert outside.read_text() == "keep\n"
    assert not (outside_dir / "new.txt").exists()
