"""The NotebookEdit tool: replace, insert or delete one cell of a Jupyter notebook.

Editing a notebook's JSON with Edit is fragile (sources are lists of lines, outputs are huge
and stale after a change), so cells are addressed by index, a replaced cell loses its stale
outputs, and the file is written back as Jupyter writes it (nbformat 4, one-space indent,
sorted keys, metadata kept) so the diff stays small. The early kernel's notebook tool skipped
read-before-write; this one applies the same ledger rule as Write and Edit.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal

import trio
from pydantic import Field

from orchestrator.tools._files import (
    HARD_LINK_NOTE,
    missing_file_message,
    non_regular_problem,
    open_regular,
    path_problem,
    stale_read_problem,
    write_atomically,
)
from orchestrator.tools.base import BlockingTool, ToolContext, ToolError, ToolInput, ToolOutput
from policies.facts import ToolFacts

__all__ = ["NotebookEditInput", "NotebookEditTool"]


class NotebookEditInput(ToolInput):
    notebook_path: str = Field(description="Absolute path of the .ipynb file to change.")
    cell_number: int = Field(
        ge=0,
        description=(
            "0-based index of the cell, as Read shows it. With edit_mode=insert the new cell is "
            "inserted at this index (the number of cells appends at the end)."
        ),
    )
    new_source: str = Field(
        description="The new source of the cell (ignored for delete; pass an empty string)."
    )
    cell_type: Literal["code", "markdown"] | None = Field(
        default=None,
        description=(
            "The cell's type. Required for insert; for replace, changes the type when given "
            "(default: keep it)."
        ),
    )
    edit_mode: Literal["replace", "insert", "delete"] = Field(
        default="replace", description="replace (default), insert a new cell, or delete one."
    )


def _load(path: Path) -> dict[str, Any]:
    """The notebook's JSON. **Errors:** `ToolError` when it is not an nbformat 4 notebook."""
    try:
        with open_regular(path) as f:
            nb = json.loads(f.read())
    except FileNotFoundError:
        raise ToolError(f"{path} no longer exists (it was deleted or moved).") from None
    except (OSError, ValueError) as exc:
        raise ToolError(
            f"{path} is not a readable notebook ({exc}). Fix it with Edit or Write instead."
        ) from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ToolError(f"{path} is not a Jupyter notebook (no 'cells' list).")
    if nb.get("nbformat") != 4:
        raise ToolError(
            f"{path} uses nbformat {nb.get('nbformat')}; only nbformat 4 notebooks can be "
            "edited. Convert it with `jupyter nbconvert --to notebook` first."
        )
    return nb


def _check(input: NotebookEditInput, ctx: ToolContext) -> str | None:
    problem = path_problem(input.notebook_path, ctx, param="notebook_path", writing=True)
    if problem:
        return problem
    path = Path(input.notebook_path)
    if path.suffix.lower() != ".ipynb":
        return f"{path} is not a notebook (.ipynb); use Edit or Write for other files."
    if not path.exists():
        return missing_file_message(path, ctx)
    problem = non_regular_problem(path)
    if problem:
        return problem
    if not path.is_file():
        return f"{path} is a directory, not a notebook file."
    problem = stale_read_problem(path, ctx)
    if problem:
        return problem
    try:
        cells = len(_load(path)["cells"])
    except ToolError as exc:
        return exc.message
    if input.edit_mode == "insert":
        if input.cell_type is None:
            return "cell_type is required when edit_mode is insert (code or markdown)."
        if input.cell_number > cells:
            return (
                f"cell_number {input.cell_number} is out of range for insert: the notebook has "
                f"{cells} cells, so use 0 to {cells} (that last one appends)."
            )
    elif input.cell_number >= cells:
        valid = f"0 to {cells - 1}" if cells else "none: it has no cells; use edit_mode=insert"
        return (
            f"cell_number {input.cell_number} does not exist: the notebook has {cells} cells "
            f"(valid indexes: {valid})."
        )
    return None


def _source_lines(source: str) -> list[str]:
    """Jupyter's on-disk form of a source: lines, each but the last keeping its newline."""
    return source.splitlines(keepends=True)


def _new_cell(cell_type: str, source: str, nb: dict[str, Any]) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": cell_type, "metadata": {}, "source": _source_lines(source)}
    if cell_type == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    if (nb.get("nbformat_minor") or 0) >= 5:  # cell ids are required from nbformat 4.5
        taken = {c.get("id") for c in nb["cells"]}
        while (cell_id := uuid.uuid4().hex[:8]) in taken:
            pass
        cell["id"] = cell_id
    return cell


def _retype(cell: dict[str, Any], cell_type: str) -> None:
    if cell.get("cell_type") == cell_type:
        return
    cell["cell_type"] = cell_type
    if cell_type == "code":
        cell.setdefault("outputs", [])
        cell.setdefault("execution_count", None)
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


class NotebookEditTool(BlockingTool[NotebookEditInput]):
    name: ClassVar[str] = "NotebookEdit"
    facts: ClassVar[ToolFacts] = ToolFacts(family="edit", path_fields=("notebook_path",))
    input_model: ClassVar[type[ToolInput]] = NotebookEditInput
    description: ClassVar[str] = (
        """Replaces, inserts or deletes one cell of a Jupyter \
notebook (.ipynb).

- notebook_path must be absolute. Read the notebook first in this session (Read shows each \
cell with its 0-based index); a notebook that changed on disk since must be read again.
- edit_mode=replace (default) sets the cell's source to new_source; a code cell's outputs and \
execution count are cleared because they no longer match the code. Give cell_type to change \
the cell's type.
- edit_mode=insert adds a new cell at index cell_number (cell_type is required); \
edit_mode=delete removes the cell. Indexes of later cells shift after an insert or delete: \
Read the notebook again before the next edit by index if unsure.
- Use this instead of Edit or Write for notebooks: it keeps the JSON valid and the metadata.
"""
        + HARD_LINK_NOTE
    )

    async def validate(self, input: NotebookEditInput, ctx: ToolContext) -> str | None:
        return await trio.to_thread.run_sync(_check, input, ctx)

    def run(self, input: NotebookEditInput, ctx: ToolContext) -> ToolOutput:
        path = Path(input.notebook_path)
        problem = _check(input, ctx)  # again: the file may have changed while permission was asked
        if problem:
            raise ToolError(problem)
        nb = _load(path)
        cells: list[dict[str, Any]] = nb["cells"]
        index = input.cell_number
        match input.edit_mode:
            case "insert":
                assert input.cell_type is not None  # _check refused it otherwise
                cells.insert(index, _new_cell(input.cell_type, input.new_source, nb))
                text = f"Inserted a {input.cell_type} cell at index {index} of {path}."
            case "delete":
                kind = cells.pop(index).get("cell_type", "?")
                text = f"Deleted cell {index} ({kind}) of {path}; later cells moved up by one."
            case "replace":
                cell = cells[index]
                if input.cell_type is not None:
                    _retype(cell, input.cell_type)
                cell["source"] = _source_lines(input.new_source)
                text = f"Replaced the source of cell {index} ({cell.get('cell_type')}) of {path}."
                if cell.get("cell_type") == "code":
                    cell["outputs"] = []
                    cell["execution_count"] = None
                    text += " Its outputs and execution count were cleared."
        data = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        write_atomically(path, data.encode("utf-8"), ctx)
        return ToolOutput.text(f"{text} The notebook now has {len(cells)} cells.", summary=text)

    def render_use(self, input: NotebookEditInput) -> str:
        return f"NotebookEdit({input.notebook_path}, {input.edit_mode} cell {input.cell_number})"
