"""NotebookEdit: read-before-write, replace/insert/delete, Jupyter's on-disk form."""

# Test setup and checks do small blocking file I/O directly, on purpose.
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.tools.base import ToolContext
from orchestrator.tools.notebook_edit import NotebookEditTool
from orchestrator.tools.read import ReadTool
from tests.orchestrator.tools.conftest import run_tool, set_mtime_later

NB_EDIT = NotebookEditTool()
READ = ReadTool()


def _notebook() -> dict[str, Any]:
    return {
        "cells": [
            {"cell_type": "markdown", "id": "aaaa0001", "metadata": {}, "source": ["# Title"]},
            {
                "cell_type": "code",
                "execution_count": 7,
                "id": "aaaa0002",
                "metadata": {"tags": ["keep"]},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["old\n"]}],
                "source": ["x = 1\n", "print(x)"],
            },
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture
async def nb_path(ws: Path, ctx: ToolContext) -> Path:
    path = ws / "analysis.ipynb"
    path.write_text(json.dumps(_notebook(), indent=1))
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"
    return path


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def test_replace_clears_outputs_and_keeps_metadata(nb_path: Path, ctx: ToolContext) -> None:
    raw = {"notebook_path": str(nb_path), "cell_number": 1, "new_source": "y = 2\nprint(y)"}
    out = await run_tool(NB_EDIT, raw, ctx)
    assert out.stage == "ok", out.text
    assert "outputs and execution count were cleared" in out.text
    nb = _load(nb_path)
    cell = nb["cells"][1]
    assert cell["source"] == ["y = 2\n", "print(y)"]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"tags": ["keep"]} and cell["id"] == "aaaa0002"
    assert nb["metadata"] == _notebook()["metadata"]
    text = nb_path.read_text()
    assert text.startswith('{\n "cells": [\n  {\n   "cell_type"') and text.endswith("}\n")
    assert out.use == f"NotebookEdit({nb_path}, replace cell 1)"


async def test_replace_can_change_the_cell_type(nb_path: Path, ctx: ToolContext) -> None:
    raw = {
        "notebook_path": str(nb_path),
        "cell_number": 1,
        "new_source": "Now prose.",
        "cell_type": "markdown",
    }
    assert (await run_tool(NB_EDIT, raw, ctx)).stage == "ok"
    cell = _load(nb_path)["cells"][1]
    assert cell["cell_type"] == "markdown"
    assert "outputs" not in cell and "execution_count" not in cell


async def test_insert_and_delete(nb_path: Path, ctx: ToolContext) -> None:
    insert = {
        "notebook_path": str(nb_path),
        "cell_number": 1,
        "new_source": "import os",
        "cell_type": "code",
        "edit_mode": "insert",
    }
    assert (await run_tool(NB_EDIT, insert, ctx)).stage == "ok"
    cells = _load(nb_path)["cells"]
    assert [c["source"] for c in cells] == [["# Title"], ["import os"], ["x = 1\n", "print(x)"]]
    new = cells[1]
    assert new["outputs"] == [] and new["execution_count"] is None
    assert len(new["id"]) == 8 and new["id"] not in {"aaaa0001", "aaaa0002"}

    delete = {
        "notebook_path": str(nb_path),
        "cell_number": 0,
        "new_source": "",
        "edit_mode": "delete",
    }
    out = await run_tool(NB_EDIT, delete, ctx)
    assert out.stage == "ok" and "now has 2 cells" in out.text
    assert [c["cell_type"] for c in _load(nb_path)["cells"]] == ["code", "code"]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"cell_number": 2}, "does not exist: the notebook has 2 cells"),
        ({"cell_number": 3, "edit_mode": "insert", "cell_type": "code"}, "use 0 to 2"),
        ({"edit_mode": "insert"}, "cell_type is required"),
        ({"notebook_path": "analysis.ipynb"}, "must be an absolute path"),
    ],
    ids=["out-of-range", "insert-out-of-range", "insert-without-type", "relative"],
)
async def test_refusals(
    nb_path: Path, ctx: ToolContext, changes: dict[str, Any], expected: str
) -> None:
    before = nb_path.read_bytes()
    raw = {"notebook_path": str(nb_path), "cell_number": 0, "new_source": "z", **changes}
    out = await run_tool(NB_EDIT, raw, ctx)
    assert out.stage == "refused"
    assert expected in out.text
    assert nb_path.read_bytes() == before


async def test_notebook_edit_without_prior_read_is_refused(ws: Path, ctx: ToolContext) -> None:
    path = ws / "unread.ipynb"
    path.write_text(json.dumps(_notebook()))
    raw = {"notebook_path": str(path), "cell_number": 0, "new_source": "# New"}
    out = await run_tool(NB_EDIT, raw, ctx)
    assert out.stage == "refused" and "has not been read" in out.text
    assert _load(path) == _notebook()


async def test_notebook_changed_since_read_is_refused(nb_path: Path, ctx: ToolContext) -> None:
    set_mtime_later(nb_path)
    raw = {"notebook_path": str(nb_path), "cell_number": 0, "new_source": "# New"}
    out = await run_tool(NB_EDIT, raw, ctx)
    assert out.stage == "refused" and "changed on disk" in out.text


async def test_consecutive_notebook_edits_need_no_new_read(nb_path: Path, ctx: ToolContext) -> None:
    for source in ("# One", "# Two"):
        raw = {"notebook_path": str(nb_path), "cell_number": 0, "new_source": source}
        assert (await run_tool(NB_EDIT, raw, ctx)).stage == "ok"
    assert _load(nb_path)["cells"][0]["source"] == ["# Two"]
