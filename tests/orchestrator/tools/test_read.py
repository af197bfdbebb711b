"""Read: numbering, the enforced limits, refusals, images, notebooks, the read ledger."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from orchestrator.tools.base import ToolContext
from orchestrator.tools.read import MAX_IMAGE_SIDE, MAX_LINE_CHARS, MAX_LINES, ReadTool
from tests.orchestrator.tools.conftest import run_tool

READ = ReadTool()


async def test_numbers_lines_like_cat_n(ws: Path, ctx: ToolContext) -> None:
    f = ws / "a.py"
    f.write_text("import os\n\nprint(os.sep)\n")
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "ok"
    assert out.text == "     1\timport os\n     2\t\n     3\tprint(os.sep)"
    assert out.use == f"Read({f})"
    assert ctx.read_ledger.recorded_mtime(f) == f.stat().st_mtime_ns


@pytest.mark.parametrize(
    ("make_path", "expected"),
    [
        (lambda ws: "a.py", "must be an absolute path"),
        (lambda ws: str(ws.parent / "outside.txt"), "outside the workspace"),
        (lambda ws: str(ws.parent / "ws-evil" / "x.txt"), "outside the workspace"),
        (lambda ws: str(ws / "link-out"), "resolves to"),
        (lambda ws: str(ws), "is a directory"),
        (lambda ws: str(ws / "main.pyy"), "Did you mean"),
        (lambda ws: str(ws / "nodir" / "x.py"), "does not exist"),
    ],
    ids=[
        "relative",
        "outside",
        "string-prefix-sibling",
        "symlink-out",
        "directory",
        "missing",
        "missing-dir",
    ],
)
async def test_refusals(ws: Path, ctx: ToolContext, make_path: object, expected: str) -> None:
    outside = ws.parent / "outside.txt"
    outside.write_text("secret\n")
    (ws.parent / "ws-evil").mkdir()
    (ws.parent / "ws-evil" / "x.txt").write_text("evil\n")
    (ws / "link-out").symlink_to(outside)
    (ws / "main.py").write_text("pass\n")
    assert callable(make_path)
    out = await run_tool(READ, {"file_path": make_path(ws)}, ctx)
    assert out.stage == "refused"
    assert expected in out.text
    assert "secret" not in out.text
    if expected == "Did you mean":
        assert str(ws / "main.py") in out.text


async def test_empty_file_says_so(ws: Path, ctx: ToolContext) -> None:
    f = ws / "empty.txt"
    f.touch()
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "ok"
    assert "exists but is empty" in out.text


async def test_fifty_thousand_lines_default_window_and_offset(ws: Path, ctx: ToolContext) -> None:
    f = ws / "big.txt"
    f.write_text("".join(f"line {i}\n" for i in range(1, 50_001)))
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "ok"
    body, note = out.text.split("\n\n[", 1)
    lines = body.splitlines()
    assert len(lines) == MAX_LINES
    assert lines[-1] == f"{MAX_LINES:>6}\tline {MAX_LINES}"
    assert "of 50000" in note and f"offset={MAX_LINES + 1}" in note

    tail = await run_tool(READ, {"file_path": str(f), "offset": 49_990}, ctx)
    assert tail.text.splitlines()[0] == " 49990\tline 49990"
    assert " 50000\tline 50000" in tail.text
    assert "the end of the file" in tail.text

    window = await run_tool(READ, {"file_path": str(f), "offset": 100, "limit": 3}, ctx)
    assert window.text.splitlines()[:3] == [
        "   100\tline 100",
        "   101\tline 101",
        "   102\tline 102",
    ]
    assert "offset=103" in window.text
    assert window.use == f"Read({f}, lines 100-102)"

    past = await run_tool(READ, {"file_path": str(f), "offset": 60_000}, ctx)
    assert past.stage == "ok" and "past its end" in past.text


async def test_long_lines_are_cut_and_reported(ws: Path, ctx: ToolContext) -> None:
    f = ws / "min.js"
    f.write_text("short\n" + "x" * 10_000 + "\nafter\n")
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    lines = out.text.splitlines()
    assert lines[1] == "     2\t" + "x" * MAX_LINE_CHARS
    assert lines[2] == "     3\tafter"
    assert "Line(s) 2 are longer than 2000 characters" in out.text


async def test_total_output_is_capped_at_a_line(ws: Path, ctx: ToolContext) -> None:
    f = ws / "wide.txt"
    f.write_text("".join(f"{i:04d}" + "y" * 1500 + "\n" for i in range(300)))
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert len(out.text) < 110_000
    assert "Output stopped after line" in out.text
    last_shown = int(out.text.split("Output stopped after line ")[1].split()[0])
    assert f"offset={last_shown + 1}" in out.text and "has 300 lines" in out.text


async def test_crlf_and_latin1_are_shown_as_text(ws: Path, ctx: ToolContext) -> None:
    crlf = ws / "win.txt"
    crlf.write_bytes(b"one\r\ntwo\r\n")
    out = await run_tool(READ, {"file_path": str(crlf)}, ctx)
    assert out.text == "     1\tone\n     2\ttwo"
    latin = ws / "latin.txt"
    latin.write_bytes("café\n".encode("latin-1"))
    out = await run_tool(READ, {"file_path": str(latin)}, ctx)
    assert out.text == "     1\tcafé"


async def test_binary_file_is_refused_and_not_recorded(ws: Path, ctx: ToolContext) -> None:
    f = ws / "blob.dat"
    f.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "error"
    assert "binary file" in out.text
    assert ctx.read_ledger.recorded_mtime(f) is None


def _png(width: int, height: int, *, noise: bool = False) -> bytes:
    image = Image.new("RGB", (width, height), "teal")
    if noise:
        image = Image.effect_noise((width, height), 80).convert("RGB")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


async def test_small_image_is_an_image_block(ws: Path, ctx: ToolContext) -> None:
    f = ws / "pic.png"
    raw = _png(40, 30)
    f.write_bytes(raw)
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "ok"
    [image] = out.images()
    assert image.source.media_type == "image/png"
    assert base64.b64decode(image.source.data) == raw
    assert "40x30" in out.text


async def test_large_image_is_downscaled(ws: Path, ctx: ToolContext) -> None:
    f = ws / "huge.png"
    f.write_bytes(_png(3000, 1000, noise=True))
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    [image] = out.images()
    with Image.open(io.BytesIO(base64.b64decode(image.source.data))) as small:
        assert max(small.size) <= MAX_IMAGE_SIDE
        assert small.size[0] / small.size[1] == pytest.approx(3, rel=0.01)
    assert "downscaled" in out.text


async def test_notebook_is_rendered_by_cell_with_outputs(ws: Path, ctx: ToolContext) -> None:
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "intro"]},
            {
                "cell_type": "code",
                "execution_count": 2,
                "metadata": {},
                "source": "print(1 + 1)",
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": ["2\n"]},
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {
                            "text/plain": ["<Figure>"],
                            "image/png": base64.b64encode(_png(10, 10)).decode(),
                        },
                    },
                    {
                        "output_type": "error",
                        "ename": "ValueError",
                        "evalue": "bad",
                        "traceback": ["\x1b[31mValueError\x1b[0m: bad"],
                    },
                ],
            },
        ],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    f = ws / "n.ipynb"
    f.write_text(json.dumps(nb))
    out = await run_tool(READ, {"file_path": str(f)}, ctx)
    assert out.stage == "ok"
    assert '<cell index="0" type="markdown">\n# Title\nintro\n</cell>' in out.text
    assert '<cell index="1" type="code" execution_count="2">\nprint(1 + 1)\n</cell>' in out.text
    assert 'name="stdout">\n2\n</output>' in out.text
    assert "ValueError: bad" in out.text and "\x1b" not in out.text
    assert len(out.images()) == 1
    assert ctx.read_ledger.recorded_mtime(f) is not None


async def test_a_root_swapped_for_a_link_does_not_move_the_boundary(tmp_path: Path) -> None:
    """The roots are resolved once (each path check compares against them): a workspace
    renamed away and replaced by a link to `/` afterwards (possible with `--sandbox=off`)
    does not make every file on the machine "inside"."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("mine\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    ctx = ToolContext(workspace=ws, cwd=ws)
    assert (await run_tool(READ, {"file_path": str(ws / "a.txt")}, ctx)).stage == "ok"
    ws.rename(tmp_path / "moved")
    ws.symlink_to("/")
    out = await run_tool(READ, {"file_path": str(ws / secret.relative_to("/"))}, ctx)
    assert out.stage == "refused" and "outside the workspace" in out.text
    assert "secret" not in out.text.replace(str(secret), "")
