"""The Edit tool: replace one exact piece of text in a file the agent has read.

Exact, literal matching is what makes an edit safe to apply without a human looking: the text
to replace must occur once (or `replace_all` says every occurrence is meant), and nothing in
`new_string` is interpreted (`$1` and backslashes are kept). Models send LF text; in a CRLF
file both strings are matched and written with CRLF. MultiEdit reuses `apply_edit`,
`PlannedEdit` and `PlannedEditTool` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import trio
from pydantic import Field

from orchestrator.tools._files import (
    HARD_LINK_NOTE,
    TextFile,
    diff_lines,
    encode_text,
    load_text,
    missing_file_message,
    path_problem,
    snippet,
    stale_read_problem,
    to_line_ending,
    write_atomically,
)
from orchestrator.tools.base import BlockingTool, ToolContext, ToolError, ToolInput, ToolOutput
from policies.facts import ToolFacts

__all__ = [
    "NEW_STRING_HELP",
    "OLD_STRING_HELP",
    "REPLACE_ALL_HELP",
    "EditInput",
    "EditTool",
    "PlannedEdit",
    "PlannedEditTool",
    "apply_edit",
    "edit_target_problem",
]

OLD_STRING_HELP = (
    "The exact text to replace, copied from the file as it is now (same indentation and "
    "whitespace, without the line-number prefix Read shows). Include enough surrounding lines "
    "to make it unique. Empty only to create a new file."
)
NEW_STRING_HELP = "The text to put in its place (must differ from old_string). Taken literally."
REPLACE_ALL_HELP = "Replace every occurrence of old_string instead of exactly one (default false)."

InputT = TypeVar("InputT", bound=ToolInput)


class EditInput(ToolInput):
    file_path: str = Field(description="Absolute path of the file to change.")
    old_string: str = Field(description=OLD_STRING_HELP)
    new_string: str = Field(description=NEW_STRING_HELP)
    replace_all: bool = Field(default=False, description=REPLACE_ALL_HELP)


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def apply_edit(
    text: str, old: str, new: str, *, replace_all: bool, line_ending: str, path: Path
) -> tuple[str, int]:
    """`text` with `old` replaced by `new`, literally, and how many occurrences were replaced.

    In a CRLF file the model's LF strings are matched and inserted as CRLF; if the CRLF form
    does not occur the string is tried as given (a file with mixed endings).

    **Errors:** `ToolError` when `old` occurs nowhere, or more than once without `replace_all`;
    the message says how to fix the call.
    """
    if old == new:
        raise ToolError(
            "old_string and new_string are identical, so there is nothing to change. "
            "Give the new text in new_string."
        )
    if line_ending == "\r\n":
        old_form, new_form = to_line_ending(old, "\r\n"), to_line_ending(new, "\r\n")
    else:
        old_form, new_form = old, new
    count = text.count(old_form)
    if count == 0 and old_form != old:
        old_form, count = old, text.count(old)
    if count == 0:
        raise ToolError(_not_found_message(text, old, path))
    if count > 1 and not replace_all:
        lines: list[int] = []
        at = text.find(old_form)
        while at != -1 and len(lines) < 10:
            lines.append(_line_of(text, at))
            at = text.find(old_form, at + len(old_form))
        where = ", ".join(str(n) for n in lines) + (", ..." if count > len(lines) else "")
        raise ToolError(
            f"Found {count} matches of old_string in {path} (at lines {where}), but replace_all "
            "is false. Add more surrounding lines to old_string so that it matches exactly one "
            "place, or set replace_all to true to replace every occurrence."
        )
    return text.replace(old_form, new_form), count


def _not_found_message(text: str, old: str, path: Path) -> str:
    message = (
        f"old_string was not found in {path}. It must match the file exactly, including "
        "whitespace and indentation. Read the file again and copy the current text."
    )
    lines = old.splitlines()
    if lines and all(line.lstrip()[:1].isdigit() and "\t" in line for line in lines):
        stripped = "\n".join(line.split("\t", 1)[1] for line in lines)
        if stripped in text.replace("\r\n", "\n"):
            return (
                message + " old_string seems to include the line-number prefixes Read shows "
                "(number and tab); leave them out."
            )
    if " ".join(old.split()) in " ".join(text.split()):
        return message + " A match exists that differs only in whitespace or indentation."
    return message


def edit_target_problem(raw: str, ctx: ToolContext, *, creating: bool) -> str | None:
    """Checks shared by Edit and MultiEdit before any text is matched.

    `creating` is true when the (first) old_string is empty: that creates a new file and is
    only allowed when none exists.
    """
    problem = path_problem(raw, ctx, param="file_path", writing=True)
    if problem:
        return problem
    path = Path(raw)
    if path.suffix.lower() == ".ipynb":
        return f"{path} is a Jupyter notebook; use NotebookEdit to change its cells."
    if path.is_dir():
        return f"{path} is a directory, not a file."
    if not path.exists():
        return None if creating else missing_file_message(path, ctx)
    if creating:
        return (
            f"{path} already exists; an empty old_string only creates new files. To change "
            "it, Read it and give the text to replace in old_string (or use Write to replace "
            "the whole file)."
        )
    return stale_read_problem(path, ctx)


@dataclass(frozen=True)
class PlannedEdit:
    """A change to one file worked out in memory (Edit, MultiEdit), not yet written."""

    path: Path
    before: TextFile | None
    """The file as it is; None when the call creates it."""
    after: str
    """Its text after the change."""
    replacements: int

    def write(self, ctx: ToolContext) -> str | None:
        """Write `after` in the encoding of `before` (UTF-8 for a new file), atomically, and
        record the new mtime.

        Returns a note for the model when the encoding could not be kept.
        **Errors:** `ToolError` saying nothing changed when the write fails (`write_atomically`).
        """
        if self.before is None:
            data, note = self.after.encode("utf-8"), None
        else:
            data, note = encode_text(self.after, self.before.encoding, self.before.bom)
        write_atomically(self.path, data, ctx)
        return note

    def write_and_describe(self, ctx: ToolContext, what: str) -> ToolOutput:
        """`write`, then the result for the model: `what` changed, the changed region with line
        numbers, and the encoding note if any."""
        note = self.write(ctx)
        before = self.before.text if self.before is not None else ""
        diff = diff_lines(before, self.after)
        view = snippet(self.after, diff.regions)
        text = f"Edited {self.path}: {what} ({diff.describe()})."
        if view:
            text += f" The changed region now reads (line numbers as Read shows them):\n{view}"
        if note:
            text += "\n" + note
        return ToolOutput.text(text, summary=f"{what} (+{diff.added} -{diff.removed})")


class PlannedEditTool(BlockingTool[InputT]):
    """Edit and MultiEdit: the change to `file_path` is worked out in memory first (`plan`).
    Validation is that plan made dry, in a worker thread (it reads the file); the call plans
    again, since the file may have changed (or appeared) while permission was asked, and
    writes it."""

    def plan(self, input: InputT, ctx: ToolContext) -> PlannedEdit:
        """The change worked out in memory; nothing is written.

        **Errors:** `ToolError` with the refusal for the model.
        """
        raise NotImplementedError

    async def validate(self, input: InputT, ctx: ToolContext) -> str | None:
        return await trio.to_thread.run_sync(self._dry_run, input, ctx)

    def _dry_run(self, input: InputT, ctx: ToolContext) -> str | None:
        try:
            self.plan(input, ctx)
        except ToolError as exc:
            return exc.message
        return None


class EditTool(PlannedEditTool[EditInput]):
    name: ClassVar[str] = "Edit"
    facts: ClassVar[ToolFacts] = ToolFacts(family="edit", path_fields=("file_path",))
    input_model: ClassVar[type[ToolInput]] = EditInput
    description: ClassVar[str] = (
        """Replaces exact text in a file: old_string becomes new_string.

- Read the file first in this session; an edit of an unread file, or of a file that changed \
on disk since you read it, is refused (Read it again, then retry).
- old_string must match the file exactly, character for character, including indentation. \
Copy it from Read's output without the line-number prefix (the number and the tab before \
each line).
- old_string must occur exactly once. If it occurs several times, add surrounding lines to \
make it unique, or set replace_all to true to change every occurrence (useful for renaming). \
Keep it short otherwise: the lines you change plus just enough context to be unique.
- Replacement is literal: nothing in new_string is a regex or escape ($1 and backslashes are \
written as given).
- An empty old_string creates a new file with new_string as content (only if the file does \
not exist yet).
- Several changes to one file: use MultiEdit (one call, applied all or nothing). Whole-file \
rewrites: Write. Notebooks (.ipynb): NotebookEdit.
- The result shows the changed region with line numbers; no need to Read the file again to \
check it.
"""
        + HARD_LINK_NOTE
    )

    def plan(self, input: EditInput, ctx: ToolContext) -> PlannedEdit:
        path = Path(input.file_path)
        creating = input.old_string == ""
        problem = edit_target_problem(input.file_path, ctx, creating=creating)
        if problem:
            raise ToolError(problem)
        if creating:
            return PlannedEdit(path, None, input.new_string, 0)
        before = load_text(path)
        after, count = apply_edit(
            before.text,
            input.old_string,
            input.new_string,
            replace_all=input.replace_all,
            line_ending=before.line_ending,
            path=path,
        )
        return PlannedEdit(path, before, after, count)

    def run(self, input: EditInput, ctx: ToolContext) -> ToolOutput:
        edit = self.plan(input, ctx)
        if edit.before is None:
            edit.write(ctx)
            lines = len(edit.after.splitlines())
            text = f"Created {edit.path} ({lines} lines)."
            return ToolOutput.text(text, summary=f"Created ({lines} lines)")
        count = edit.replacements
        return edit.write_and_describe(
            ctx, "1 replacement" if count == 1 else f"{count} replacements"
        )

    def render_use(self, input: EditInput) -> str:
        suffix = ", replace_all" if input.replace_all else ""
        return f"Edit({input.file_path}{suffix})"
