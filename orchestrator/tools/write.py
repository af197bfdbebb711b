"""The Write tool: create a file, or replace one the agent has read, keeping its format.

Overwriting a file blind is how agents lose a user's unsaved work, so an existing file must
have been read in this session and be unchanged on disk since (the session's read ledger).
The new content keeps the old file's line endings and encoding where it can: a model writes
LF text, and a CRLF file stays CRLF. The file is replaced atomically (`write_atomically`), so a
failed write leaves it byte-identical.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from orchestrator.tools._files import (
    HARD_LINK_NOTE,
    diff_lines,
    encode_text,
    load_text,
    path_problem,
    stale_read_problem,
    to_line_ending,
    write_atomically,
)
from orchestrator.tools.base import BlockingTool, ToolContext, ToolError, ToolInput, ToolOutput
from policies.facts import ToolFacts

__all__ = ["WriteInput", "WriteTool"]


class WriteInput(ToolInput):
    file_path: str = Field(description="Absolute path of the file to write (created if missing).")
    content: str = Field(description="The complete new content of the file.")


def _check(input: WriteInput, ctx: ToolContext) -> str | None:
    problem = path_problem(input.file_path, ctx, param="file_path", writing=True)
    if problem:
        return problem
    path = Path(input.file_path)
    if path.is_dir():
        return f"{path} is a directory; give the path of a file inside it."
    return stale_read_problem(path, ctx)


class WriteTool(BlockingTool[WriteInput]):
    name: ClassVar[str] = "Write"
    facts: ClassVar[ToolFacts] = ToolFacts(family="edit", path_fields=("file_path",))
    input_model: ClassVar[type[ToolInput]] = WriteInput
    description: ClassVar[str] = (
        """Writes a file: creates it, or replaces its whole content.

- file_path must be absolute and inside the workspace; missing parent directories are created.
- An existing file can only be overwritten after you have read it with Read in this session, \
and only if it has not changed on disk since; otherwise the call is refused and you must \
Read it (again) first.
- To change part of an existing file, prefer Edit (or MultiEdit for several changes in one \
file): it sends only the changed text and cannot drop the rest of the file by accident. Use \
Write for new files or complete rewrites.
- The file's existing line endings (CRLF stays CRLF) and encoding are kept.
- Do not create documentation or README files unless the user asked for them.
"""
        + HARD_LINK_NOTE
    )

    async def validate(self, input: WriteInput, ctx: ToolContext) -> str | None:
        return _check(input, ctx)

    def run(self, input: WriteInput, ctx: ToolContext) -> ToolOutput:
        path = Path(input.file_path)
        # Checked again: the file may have changed while permission was being asked.
        problem = _check(input, ctx)
        if problem:
            raise ToolError(problem)
        content = input.content
        note: str | None = None
        if path.exists():
            old = load_text(path)
            if old.line_ending == "\r\n":
                content = to_line_ending(content, "\r\n")
            data, note = encode_text(content, old.encoding, old.bom)
            old_text: str | None = old.text
        else:
            data, old_text = content.encode("utf-8"), None
        write_atomically(path, data, ctx)
        lines = len(content.splitlines())
        if old_text is None:
            text = f"Created {path} ({lines} lines)."
            summary = f"Created ({lines} lines)"
        elif old_text == content:
            text = f"{path} already had exactly this content; nothing changed."
            summary = "Unchanged"
        else:
            diff = diff_lines(old_text, content)
            text = f"Updated {path}: {diff.describe()} ({lines} lines now)."
            summary = f"Updated (+{diff.added} -{diff.removed})"
        if note:
            text += " " + note
        return ToolOutput.text(text, summary=summary)

    def render_use(self, input: WriteInput) -> str:
        return f"Write({input.file_path})"
