"""The MultiEdit tool: several Edit-style replacements in one file, all or nothing.

A refactor often needs several coordinated changes to one file; applying them one Edit at a
time leaves the file half-changed when a later one fails. Here every edit is applied in
memory, in order, each to the result of the previous one, and the file is written once, only
if all of them matched.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from orchestrator.tools._files import HARD_LINK_NOTE, TextFile, load_text
from orchestrator.tools.base import ToolContext, ToolError, ToolInput, ToolOutput
from orchestrator.tools.edit import (
    NEW_STRING_HELP,
    OLD_STRING_HELP,
    REPLACE_ALL_HELP,
    PlannedEdit,
    PlannedEditTool,
    apply_edit,
    edit_target_problem,
)
from policies.facts import ToolFacts

__all__ = ["EditSpec", "MultiEditInput", "MultiEditTool"]


class EditSpec(ToolInput):
    """One replacement of a MultiEdit."""

    old_string: str = Field(description=OLD_STRING_HELP)
    new_string: str = Field(description=NEW_STRING_HELP)
    replace_all: bool = Field(default=False, description=REPLACE_ALL_HELP)


class MultiEditInput(ToolInput):
    file_path: str = Field(description="Absolute path of the file to change.")
    edits: list[EditSpec] = Field(
        min_length=1,
        description=(
            "The replacements, applied in order; each one sees the result of the ones before."
        ),
    )


def _apply_all(input: MultiEditInput, before: TextFile | None) -> tuple[str, int]:
    """The new text after every edit, and the number of replacements made.

    **Errors:** `ToolError` naming the first edit that does not apply.
    """
    path = Path(input.file_path)
    total = len(input.edits)
    if before is None:
        text, ending, first = input.edits[0].new_string, "\n", 1
    else:
        text, ending, first = before.text, before.line_ending, 0
    count = 0
    for number, spec in enumerate(input.edits[first:], start=first + 1):
        if spec.old_string == "":
            raise ToolError(
                f"Edit {number} of {total} has an empty old_string. Only the first edit of a "
                "new file may be empty (it creates the file); give the text to replace."
            )
        try:
            text, n = apply_edit(
                text,
                spec.old_string,
                spec.new_string,
                replace_all=spec.replace_all,
                line_ending=ending,
                path=path,
            )
        except ToolError as exc:
            raise ToolError(
                f"Edit {number} of {total} does not apply, so no edit was made: {exc.message} "
                "Edits apply in order, each to the result of the previous ones."
            ) from None
        count += n
    return text, count


class MultiEditTool(PlannedEditTool[MultiEditInput]):
    name: ClassVar[str] = "MultiEdit"
    facts: ClassVar[ToolFacts] = ToolFacts(family="edit", path_fields=("file_path",))
    input_model: ClassVar[type[ToolInput]] = MultiEditInput
    description: ClassVar[str] = (
        """Makes several replacements in one file in a single call.

Prefer it to several Edit calls when you change one file in more than one place.

- Each edit works like Edit (old_string must match exactly once unless replace_all, and is \
replaced literally); the edits are applied in order, each to the result of the previous ones, \
so a later old_string must match the text as the earlier edits left it.
- All or nothing: if any edit does not apply, the file is left untouched and the error names \
the edit to fix.
- Read the file first in this session; a file that changed on disk since must be read again.
- To create a new file, give the whole content as the first edit's new_string with an empty \
old_string.
- Different files need separate calls; notebooks (.ipynb) use NotebookEdit.
"""
        + HARD_LINK_NOTE
    )

    def plan(self, input: MultiEditInput, ctx: ToolContext) -> PlannedEdit:
        path = Path(input.file_path)
        creating = input.edits[0].old_string == ""
        problem = edit_target_problem(input.file_path, ctx, creating=creating)
        if problem:
            raise ToolError(problem)
        before = None if creating else load_text(path)
        after, count = _apply_all(input, before)
        return PlannedEdit(path, before, after, count)

    def run(self, input: MultiEditInput, ctx: ToolContext) -> ToolOutput:
        edit = self.plan(input, ctx)
        edits, count = len(input.edits), edit.replacements
        what = f"{edits} edit{'s' * (edits != 1)}, {count} replacement{'s' * (count != 1)}"
        if edit.before is None:
            what = f"created the file, then {what}"
        return edit.write_and_describe(ctx, what)

    def render_use(self, input: MultiEditInput) -> str:
        return f"MultiEdit({input.file_path}, {len(input.edits)} edits)"
