"""Edit and MultiEdit: exact literal matching, read-before-write, CRLF, atomicity."""

# Test setup and checks do small blocking file I/O directly, on purpose.
# ruff: noqa: ASYNC240

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.tools.base import ToolContext
from orchestrator.tools.edit import EditTool
from orchestrator.tools.multi_edit import MultiEditTool
from orchestrator.tools.read import ReadTool
from tests.orchestrator.tools.conftest import run_tool, set_mtime_later

EDIT = EditTool()
MULTI = MultiEditTool()
READ = ReadTool()

SOURCE = """\
def greet(name):
    return "hi " + name


def shout(name):
    return "HI " + name


print(greet("a"))
print(greet("b"))
print(greet("c"))
"""


async def _read(ctx: ToolContext, path: Path) -> None:
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"


@pytest.fixture
async def src(ws: Path, ctx: ToolContext) -> Path:
    f = ws / "m.py"
    f.write_text(SOURCE)
    await _read(ctx, f)
    return f


@pytest.mark.parametrize(
    ("edit", "stage", "expected_text", "expected_file"),
    [
        pytest.param(
            {"old_string": '    return "HI " + name', "new_string": '    return "HEY " + name'},
            "ok",
            '     6\t    return "HEY " + name',
            SOURCE.replace('"HI "', '"HEY "'),
            id="unique",
        ),
        pytest.param(
            {"old_string": 'print(greet("d"))', "new_string": "x"},
            "refused",
            "old_string was not found",
            SOURCE,
            id="zero-matches",
        ),
        pytest.param(
            {"old_string": "print(greet(", "new_string": "print(shout("},
            "refused",
            "Found 3 matches of old_string",
            SOURCE,
            id="three-matches",
        ),
        pytest.param(
            {"old_string": "print(greet(", "new_string": "print(shout(", "replace_all": True},
            "ok",
            "3 replacements",
            SOURCE.replace("print(greet(", "print(shout("),
            id="replace-all",
        ),
        pytest.param(
            {"old_string": '"hi "', "new_string": r'"$1 \\ \1 \n"'},
            "ok",
            r'return "$1 \\ \1 \n" + name',
            SOURCE.replace('"hi "', r'"$1 \\ \1 \n"'),
            id="literal-dollar-and-backslash",
        ),
        pytest.param(
            {"old_string": "def greet", "new_string": "def greet"},
            "refused",
            "identical",
            SOURCE,
            id="identical",
        ),
        pytest.param(
            {"old_string": "     1\tdef greet(name):", "new_string": "def hello(name):"},
            "refused",
            "line-number prefixes",
            SOURCE,
            id="line-number-prefix-hint",
        ),
        pytest.param(
            {"old_string": "def  greet(name):\n  return", "new_string": "x"},
            "refused",
            "differs only in whitespace",
            SOURCE,
            id="whitespace-hint",
        ),
        pytest.param(
            {"old_string": "", "new_string": "x"},
            "refused",
            "already exists",
            SOURCE,
            id="empty-old-on-existing-file",
        ),
    ],
)
async def test_edit_table(
    src: Path,
    ctx: ToolContext,
    edit: dict[str, Any],
    stage: str,
    expected_text: str,
    expected_file: str,
) -> None:
    out = await run_tool(EDIT, {"file_path": str(src), **edit}, ctx)
    assert out.stage == stage, out.text
    assert expected_text in out.text
    assert src.read_text() == expected_file


async def test_three_matches_message_says_what_to_do(src: Path, ctx: ToolContext) -> None:
    out = await run_tool(
        EDIT, {"file_path": str(src), "old_string": 'greet("', "new_string": "x"}, ctx
    )
    assert "Found 3 matches" in out.text
    assert "at lines 9, 10, 11" in out.text
    assert "surrounding lines" in out.text and "replace_all" in out.text


async def test_result_shows_the_edited_region_with_context(src: Path, ctx: ToolContext) -> None:
    out = await run_tool(
        EDIT,
        {
            "file_path": str(src),
            "old_string": "def shout(name):\n",
            "new_string": "def shout(name):\n    name = name.upper()\n",
        },
        ctx,
    )
    assert out.stage == "ok"
    region = out.text.split("reads (line numbers as Read shows them):\n", 1)[1]
    assert region.splitlines() == [
        "     3\t",
        "     4\t",
        "     5\tdef shout(name):",
        "     6\t    name = name.upper()",
        '     7\t    return "HI " + name',
        "     8\t",
        "     9\t",
    ]
    assert "1 line added, 0 removed" in out.text


async def test_consecutive_edits_need_no_new_read(src: Path, ctx: ToolContext) -> None:
    for old, new in [('greet("a")', 'greet("A")'), ('greet("b")', 'greet("B")')]:
        out = await run_tool(
            EDIT, {"file_path": str(src), "old_string": old, "new_string": new}, ctx
        )
        assert out.stage == "ok"


async def test_unread_file_is_refused(ws: Path, ctx: ToolContext) -> None:
    f = ws / "u.py"
    f.write_text("x = 1\n")
    out = await run_tool(EDIT, {"file_path": str(f), "old_string": "1", "new_string": "2"}, ctx)
    assert out.stage == "refused" and "has not been read" in out.text
    assert f.read_text() == "x = 1\n"


async def test_file_changed_since_read_is_refused(src: Path, ctx: ToolContext) -> None:
    src.write_text(SOURCE + "# user edit\n")
    set_mtime_later(src)
    out = await run_tool(EDIT, {"file_path": str(src), "old_string": "hi", "new_string": "yo"}, ctx)
    assert out.stage == "refused" and "changed on disk" in out.text
    assert src.read_text().endswith("# user edit\n")


async def test_file_deleted_after_read(src: Path, ctx: ToolContext) -> None:
    src.unlink()
    out = await run_tool(EDIT, {"file_path": str(src), "old_string": "hi", "new_string": "yo"}, ctx)
    assert out.stage == "refused" and "no longer exists" in out.text


async def test_file_deleted_between_validation_and_edit(src: Path, ctx: ToolContext) -> None:
    out = await run_tool(
        EDIT,
        {"file_path": str(src), "old_string": '"hi "', "new_string": '"yo "'},
        ctx,
        after_validate=src.unlink,
    )
    assert out.stage == "error" and "no longer exists" in out.text
    assert not src.exists()


async def test_empty_old_string_creates_a_new_file(ws: Path, ctx: ToolContext) -> None:
    f = ws / "pkg" / "new.py"
    out = await run_tool(
        EDIT, {"file_path": str(f), "old_string": "", "new_string": "x = 1\n"}, ctx
    )
    assert out.stage == "ok" and f.read_text() == "x = 1\n"
    missing = await run_tool(
        EDIT, {"file_path": str(ws / "nope.py"), "old_string": "a", "new_string": "b"}, ctx
    )
    assert missing.stage == "refused" and "does not exist" in missing.text


async def test_crlf_file_matched_with_lf_strings_and_kept_crlf(ws: Path, ctx: ToolContext) -> None:
    f = ws / "win.py"
    f.write_bytes(b"a = 1\r\nb = 2\r\nc = 3\r\n")
    await _read(ctx, f)
    out = await run_tool(
        EDIT,
        {"file_path": str(f), "old_string": "a = 1\nb = 2", "new_string": "a = 1\nb = 20\nbb = 21"},
        ctx,
    )
    assert out.stage == "ok", out.text
    assert f.read_bytes() == b"a = 1\r\nb = 20\r\nbb = 21\r\nc = 3\r\n"
    single = await run_tool(
        EDIT, {"file_path": str(f), "old_string": "c = 3", "new_string": "c = 3\nd = 4"}, ctx
    )
    assert single.stage == "ok"
    assert f.read_bytes() == b"a = 1\r\nb = 20\r\nbb = 21\r\nc = 3\r\nd = 4\r\n"


async def test_symlink_pointing_outside_is_refused(ws: Path, ctx: ToolContext) -> None:
    outside = ws.parent / "victim.py"
    outside.write_text("x = 1\n")
    link = ws / "link.py"
    link.symlink_to(outside)
    out = await run_tool(EDIT, {"file_path": str(link), "old_string": "1", "new_string": "2"}, ctx)
    assert out.stage == "refused" and "outside the workspace" in out.text
    assert outside.read_text() == "x = 1\n"


async def test_notebooks_go_to_notebook_edit(ws: Path, ctx: ToolContext) -> None:
    f = ws / "n.ipynb"
    f.write_text("{}")
    out = await run_tool(EDIT, {"file_path": str(f), "old_string": "{", "new_string": "["}, ctx)
    assert out.stage == "refused" and "NotebookEdit" in out.text


async def test_edit_in_a_fifty_thousand_line_file(ws: Path, ctx: ToolContext) -> None:
    f = ws / "big.py"
    f.write_text("".join(f"v{i} = {i}\n" for i in range(50_000)))
    await _read(ctx, f)
    out = await run_tool(
        EDIT,
        {"file_path": str(f), "old_string": "v41999 = 41999\n", "new_string": "v41999 = -1\n"},
        ctx,
    )
    assert out.stage == "ok"
    assert " 42000\tv41999 = -1" in out.text
    assert f.read_text().count("\n") == 50_000


# --- MultiEdit --------------------------------------------------------------------------------


async def test_multi_edit_applies_in_order(src: Path, ctx: ToolContext) -> None:
    edits = [
        {"old_string": "def greet(name):", "new_string": "def welcome(name):"},
        {"old_string": "print(greet(", "new_string": "print(welcome(", "replace_all": True},
        {
            "old_string": 'def welcome(name):\n    return "hi "',
            "new_string": 'def welcome(name):\n    return "hello "',
        },
    ]
    out = await run_tool(MULTI, {"file_path": str(src), "edits": edits}, ctx)
    assert out.stage == "ok", out.text
    text = src.read_text()
    assert "greet" not in text and 'return "hello " + name' in text
    assert "3 edits, 5 replacements" in out.text
    assert out.use == f"MultiEdit({src}, 3 edits)"


async def test_multi_edit_is_all_or_nothing(src: Path, ctx: ToolContext) -> None:
    before = src.read_bytes()
    mtime = src.stat().st_mtime_ns
    edits = [
        {"old_string": "def greet(name):", "new_string": "def welcome(name):"},
        {"old_string": "no such text", "new_string": "x"},
    ]
    out = await run_tool(MULTI, {"file_path": str(src), "edits": edits}, ctx)
    assert out.stage == "refused"
    assert out.text.startswith("Edit 2 of 2 does not apply, so no edit was made")
    assert src.read_bytes() == before and src.stat().st_mtime_ns == mtime


async def test_multi_edit_failure_during_call_writes_nothing(src: Path, ctx: ToolContext) -> None:
    before = SOURCE.replace("greet", "GREET")

    def change_on_disk() -> None:
        src.write_text(before)
        ctx.read_ledger.record(src)  # as if re-read: only the content check can stop it now

    edits = [
        {"old_string": "def shout", "new_string": "def yell"},
        {"old_string": 'print(greet("a"))', "new_string": "pass"},
    ]
    out = await run_tool(
        MULTI, {"file_path": str(src), "edits": edits}, ctx, after_validate=change_on_disk
    )
    assert out.stage == "error" and "Edit 2 of 2" in out.text
    assert src.read_text() == before


async def test_multi_edit_creates_a_file_and_refuses_unread(ws: Path, ctx: ToolContext) -> None:
    f = ws / "new.txt"
    edits = [
        {"old_string": "", "new_string": "alpha beta\n"},
        {"old_string": "beta", "new_string": "gamma"},
    ]
    out = await run_tool(MULTI, {"file_path": str(f), "edits": edits}, ctx)
    assert out.stage == "ok" and f.read_text() == "alpha gamma\n"

    other = ws / "other.txt"
    other.write_text("a\n")
    os.utime(other)
    out = await run_tool(
        MULTI, {"file_path": str(other), "edits": [{"old_string": "a", "new_string": "b"}]}, ctx
    )
    assert out.stage == "refused" and "has not been read" in out.text


async def test_multi_edit_needs_at_least_one_edit(src: Path, ctx: ToolContext) -> None:
    out = await run_tool(MULTI, {"file_path": str(src), "edits": []}, ctx)
    assert out.stage == "schema_error"
