"""The Read tool: a file's lines with numbers, an image as an image block, a notebook by cell.

The limits (2,000 lines, 2,000 characters per line, a total character cap) are enforced here,
not merely promised in the description: the early kernel's limit lived only in its prose. Text
is streamed line by line, so reading the start of a huge file costs only what is shown plus a
fast newline count of the rest. Every read records the file's mtime in the session's ledger,
which is what lets Write, Edit and NotebookEdit change the file afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Literal, TextIO

from pydantic import Field

from orchestrator.messages import ImageBlock, ImageSource, TextBlock
from orchestrator.text import truncate_middle
from orchestrator.tools._files import (
    SNIFF_BYTES,
    binary_problem,
    existing_file_problem,
    format_numbered,
    open_regular,
    read_failed,
    sniff_encoding,
)
from orchestrator.tools.base import BlockingTool, ToolContext, ToolError, ToolInput, ToolOutput
from policies.facts import ToolFacts

__all__ = [
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_SIDE",
    "MAX_LINES",
    "MAX_LINE_CHARS",
    "MAX_OUTPUT_CHARS",
    "ReadInput",
    "ReadTool",
]

MAX_LINES = 2000
"""Lines returned when the call gives no `limit`."""
MAX_LINE_CHARS = 2000
"""Characters kept of each line; the rest is cut and the cut is reported."""
MAX_OUTPUT_CHARS = 96_000
"""Characters of numbered text in one result (about 25k tokens); reading stops at a line.
Kept under the pipeline's 100,000-character cap, so the notes at the end always survive."""
MAX_IMAGE_SIDE = 1568
"""Pixels; a larger image is downscaled so its longer side fits (the API's own sweet spot)."""
MAX_IMAGE_BYTES = 3_750_000
"""Bytes of encoded image sent to the model (the API's per-image limit is 5 MB of base64)."""

_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})
_PIL_MEDIA: dict[str, Literal["image/png", "image/jpeg", "image/gif", "image/webp"]] = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
}
_NOTEBOOK_OUTPUT_CHARS = 5_000
_NOTEBOOK_MAX_IMAGES = 10
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ReadInput(ToolInput):
    file_path: str = Field(description="Absolute path of the file to read.")
    offset: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Line number to start reading from (1 is the first line). Only needed for files "
            "too long to read at once; the result says which offset to use next."
        ),
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        description=f"How many lines to read (default {MAX_LINES}).",
    )


@dataclass
class _TextSlice:
    lines: list[tuple[int, str]] = field(default_factory=list)
    total_lines: int = 0
    long_lines: list[int] = field(default_factory=list)
    char_capped: bool = False


def _read_slice(path: Path, raw: BinaryIO, start: int, limit: int) -> _TextSlice:
    """Lines `start`..`start+limit-1` (1-based) of a text file, plus the file's line count.

    Blocking; runs in a worker thread. Lines longer than MAX_LINE_CHARS are read in pieces, so
    a multi-megabyte minified line never sits in memory whole. `raw` is the file opened by
    `open_regular`; it is consumed and closed.
    """
    head = raw.read(SNIFF_BYTES)
    problem = binary_problem(path, head)
    if problem:
        raise ToolError(problem)
    codec, _bom = sniff_encoding(head)
    result = _TextSlice()
    chars = 0
    end = start + limit
    number = 0
    raw.seek(0)
    with io.TextIOWrapper(raw, encoding=codec, errors="replace", newline=None) as f:
        while number + 1 < end:
            line = f.readline(MAX_LINE_CHARS + 1)
            if not line:
                break
            number += 1
            if number == 1:
                line = line.removeprefix("\ufeff")
            too_long = len(line) > MAX_LINE_CHARS and not line.endswith("\n")
            if too_long:  # drain the rest of this long line
                while (more := f.readline(65_536)) and not more.endswith("\n"):
                    pass
            if number < start:
                continue
            text = line[:MAX_LINE_CHARS] if too_long else line.removesuffix("\n")
            chars += len(text) + 8
            if chars > MAX_OUTPUT_CHARS and result.lines:
                result.char_capped = True  # line `number` is counted but not shown
                break
            if too_long:
                result.long_lines.append(number)
            result.lines.append((number, text))
        result.total_lines = number + _count_lines(f)
    return result


def _count_lines(f: TextIO) -> int:
    """Lines left in `f` from its current position, counted in big chunks."""
    count = 0
    last = ""
    while chunk := f.read(1 << 20):
        count += chunk.count("\n")
        last = chunk[-1]
    return count + (1 if last and last != "\n" else 0)


def _render_text(path: Path, sl: _TextSlice, start: int) -> ToolOutput:
    if sl.total_lines == 0:
        return ToolOutput.text(
            f"The file {path} exists but is empty (0 lines).", summary="Read empty file"
        )
    if not sl.lines:
        return ToolOutput.text(
            f"The file {path} has {sl.total_lines} lines; offset {start} is past its end. "
            f"Use an offset between 1 and {sl.total_lines}.",
            summary="Read nothing (offset past end)",
        )
    first, last = sl.lines[0][0], sl.lines[-1][0]
    notes: list[str] = []
    if sl.char_capped:
        notes.append(
            f"Output stopped after line {last} to stay under {MAX_OUTPUT_CHARS:,} characters. "
            f"The file has {sl.total_lines} lines; read on with offset={last + 1}."
        )
    elif last < sl.total_lines:
        notes.append(
            f"Showing lines {first}-{last} of {sl.total_lines}. "
            f"Read on with offset={last + 1} (limit up to {MAX_LINES})."
        )
    elif first > 1:
        notes.append(f"Showing lines {first}-{last} of {sl.total_lines} (the end of the file).")
    if sl.long_lines:
        shown = ", ".join(str(n) for n in sl.long_lines[:10])
        more = f" and {len(sl.long_lines) - 10} more" if len(sl.long_lines) > 10 else ""
        notes.append(
            f"Line(s) {shown}{more} are longer than {MAX_LINE_CHARS} characters and were cut "
            f"there; use Grep, or Bash with `cut -c`, to see the rest of such a line."
        )
    body = format_numbered(sl.lines)
    if notes:
        body += "\n\n" + "\n".join(f"[{n}]" for n in notes)
    if first == 1 and last == sl.total_lines:
        summary = f"Read {sl.total_lines} lines"
    else:
        summary = f"Read lines {first}-{last} of {sl.total_lines}"
    return ToolOutput.text(body, summary=summary)


# --- images ----------------------------------------------------------------------------------


def _image_block(raw: bytes, what: str) -> tuple[ImageBlock, str]:
    """An image block for `raw`, downscaled and re-encoded when too large; plus a caption."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            width, height = im.size
            media = _PIL_MEDIA.get(im.format or "")
            if media and max(width, height) <= MAX_IMAGE_SIDE and len(raw) <= MAX_IMAGE_BYTES:
                data = base64.b64encode(raw).decode("ascii")
                return _block(media, data), f"{what} ({width}x{height})"
            im.seek(0)
            frame = im.convert("RGBA" if im.mode in ("RGBA", "LA", "P") else "RGB")
    except Exception as exc:
        raise ToolError(f"{what} could not be decoded as an image: {exc}.") from exc
    side = MAX_IMAGE_SIDE
    as_jpeg = media == "image/jpeg"
    while True:
        small = frame.copy()
        small.thumbnail((side, side))
        buf = io.BytesIO()
        if as_jpeg:
            small.convert("RGB").save(buf, format="JPEG", quality=85, optimize=True)
        else:
            small.save(buf, format="PNG", optimize=True)
        if buf.tell() <= MAX_IMAGE_BYTES or side <= 200:
            break
        if not as_jpeg:
            as_jpeg = True  # PNG of a photo is large; JPEG at the same size usually fits
        else:
            side = int(side * 0.75)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    caption = f"{what} ({width}x{height}, downscaled to {small.width}x{small.height})"
    return _block("image/jpeg" if as_jpeg else "image/png", data), caption


def _block(
    media: Literal["image/png", "image/jpeg", "image/gif", "image/webp"], data: str
) -> ImageBlock:
    return ImageBlock(source=ImageSource(media_type=media, data=data))


def _read_image(path: Path, raw: bytes) -> ToolOutput:
    if not raw:
        return ToolOutput.text(f"The image file {path} is empty (0 bytes).")
    block, caption = _image_block(raw, f"Image {path}")
    return ToolOutput.blocks([TextBlock(text=caption), block], summary=caption)


# --- notebooks -------------------------------------------------------------------------------


def _joined(source: Any) -> str:
    if isinstance(source, list):
        return "".join(str(s) for s in source)
    return str(source or "")


def _render_notebook(path: Path, nb: dict[str, Any]) -> ToolOutput:
    """Cells in order with their outputs, as tagged text; image outputs as image blocks."""
    cells = nb.get("cells")
    if not isinstance(cells, list):
        raise ToolError(f"{path} is not a Jupyter notebook (no 'cells' list).")
    meta = nb.get("metadata") or {}
    language = (meta.get("language_info") or {}).get("name") or (
        (meta.get("kernelspec") or {}).get("language") or "python"
    )
    version = f"{nb.get('nbformat', '?')}.{nb.get('nbformat_minor', '?')}"
    blocks: list[TextBlock | ImageBlock] = []
    text: list[str] = [
        f"Jupyter notebook {path}: {len(cells)} cells, nbformat {version}, language {language}. "
        "Cell indexes below are the cell_number NotebookEdit takes."
    ]
    images = 0

    def flush() -> None:
        if text:
            blocks.append(TextBlock(text="\n".join(text)))
            text.clear()

    for index, cell in enumerate(cells):
        kind = cell.get("cell_type", "?")
        count = cell.get("execution_count")
        attrs = f' execution_count="{count}"' if kind == "code" and count is not None else ""
        source = _joined(cell.get("source"))
        text.append(f'<cell index="{index}" type="{kind}"{attrs}>\n{source}\n</cell>')
        for output in cell.get("outputs") or []:
            otype = output.get("output_type", "?")
            data = output.get("data") or {}
            if otype == "stream":
                body = _joined(output.get("text"))
                label = f'type="stream" name="{output.get("name", "stdout")}"'
            elif otype == "error":
                trace = "\n".join(str(t) for t in output.get("traceback") or [])
                body = trace or f"{output.get('ename')}: {output.get('evalue')}"
                label = 'type="error"'
            else:
                label = f'type="{otype}"'
                body = _joined(data.get("text/plain") or data.get("text/markdown") or "")
                for mime in ("image/png", "image/jpeg"):
                    if mime in data and images < _NOTEBOOK_MAX_IMAGES:
                        images += 1
                        raw = base64.b64decode(_joined(data[mime]))
                        block, caption = _image_block(raw, f"Output image of cell {index}")
                        text.append(f"[{caption} follows]")
                        flush()
                        blocks.append(block)
                    elif mime in data:
                        text.append(f"[Output image of cell {index} omitted: image limit reached]")
                if not body and "text/html" in data:
                    body = "[text/html output omitted]"
            body = truncate_middle(_ANSI.sub("", body).rstrip("\n"), _NOTEBOOK_OUTPUT_CHARS)
            text.append(f'<output cell="{index}" {label}>\n{body}\n</output>')
    flush()
    summary = f"Read notebook ({len(cells)} cells)"
    if all(isinstance(b, TextBlock) for b in blocks):
        joined = "\n".join(b.text for b in blocks if isinstance(b, TextBlock))
        return ToolOutput.text(truncate_middle(joined, MAX_OUTPUT_CHARS), summary=summary)
    return ToolOutput.blocks(blocks, summary=summary)


def _read_notebook(path: Path, raw: bytes) -> ToolOutput | None:
    """The rendered notebook, or None when the file is not valid JSON (read as text then)."""
    try:
        nb = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(nb, dict):
        return None
    return _render_notebook(path, nb)


# --- the tool --------------------------------------------------------------------------------


class ReadTool(BlockingTool[ReadInput]):
    name: ClassVar[str] = "Read"
    facts: ClassVar[ToolFacts] = ToolFacts(family="read", path_fields=("file_path",))
    input_model: ClassVar[type[ToolInput]] = ReadInput
    read_only: ClassVar[bool] = True
    description: ClassVar[str] = f"""Reads a file from the local filesystem and returns its content.

- file_path must be an absolute path inside the workspace, not a relative one.
- By default up to {MAX_LINES} lines are returned from the start of the file, and each line \
is cut at {MAX_LINE_CHARS} characters; one result holds at most {MAX_OUTPUT_CHARS:,} \
characters. For a longer file the result says how many lines it has and which offset to use \
next; read it in pieces with offset and limit, or use Grep to find the lines you need first.
- Lines are numbered like `cat -n`: the line number, a tab, then the line as it is in the \
file. The number and the tab are not part of the file: never include them in old_string \
when you Edit.
- Images (PNG, JPEG, GIF, WebP) are shown to you as images; large ones are downscaled.
- Jupyter notebooks (.ipynb) are shown cell by cell with their outputs and cell indexes.
- Binary files are refused; a missing file's error names similar files nearby. Use LS for a \
directory, Glob to find files by name, Grep to search contents.
- You must Read a file before you Write over it or Edit it; reading it again after it changed \
on disk is required too.
- When you know several files you need, read them in one response (several Read calls at \
once): they run in parallel."""

    async def validate(self, input: ReadInput, ctx: ToolContext) -> str | None:
        return existing_file_problem(input.file_path, ctx, param="file_path", writing=False)

    def run(self, input: ReadInput, ctx: ToolContext) -> ToolOutput:
        path = Path(input.file_path)
        if ctx.read_denied(path):
            raise ToolError(
                f"Reading {path} is denied by the policy (a `Read` deny rule covers it); do "
                "not try to read it another way."
            )
        try:
            # Recorded before reading: a change made while we read leaves the older mtime in
            # the ledger, so a later write is refused rather than silently clobbering it.
            # Opened without blocking and only if it is a regular file: a FIFO or a device put
            # in its place since validation is refused at once, never waited on.
            with open_regular(path) as raw:
                ctx.read_ledger.record(path)
                suffix = path.suffix.lower()
                if suffix in _IMAGE_SUFFIXES:
                    return _read_image(path, raw.read())
                if suffix == ".ipynb":
                    rendered = _read_notebook(path, raw.read())
                    if rendered is not None:
                        return rendered
                    raw.seek(0)
                start = max(1, input.offset or 1)
                limit = input.limit or MAX_LINES
                sl = _read_slice(path, raw, start, limit)
                return _render_text(path, sl, start)
        except ToolError:
            ctx.read_ledger.forget(path)  # a refused read (binary, undecodable) is no read
            raise
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                ctx.read_ledger.forget(path)
            raise read_failed(path, exc) from exc

    def render_use(self, input: ReadInput) -> str:
        extra = ""
        if input.offset is not None or input.limit is not None:
            start = max(1, input.offset or 1)
            end = f"{start + input.limit - 1}" if input.limit else "end"
            extra = f", lines {start}-{end}"
        return f"Read({input.file_path}{extra})"
