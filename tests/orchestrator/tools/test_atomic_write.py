"""Writes are atomic: a failed write changes nothing, a killed one leaves old or new bytes.

Every writing tool (Write, Edit, MultiEdit, NotebookEdit) goes through `write_atomically`. The
faults are real: a full tmpfs (root only, it needs a mount), RLIMIT_FSIZE in a child process
(any user), SIGKILL of a child in the middle of a 40 MB Write. Afterwards the test reads the
file back from the host: byte-identical, or the complete new content, and no temporary file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ToolError
from orchestrator.tools._files import write_atomically
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.edit import EditTool
from orchestrator.tools.multi_edit import MultiEditTool
from orchestrator.tools.notebook_edit import NotebookEditTool
from orchestrator.tools.read import ReadTool
from orchestrator.tools.write import WriteTool
from sandbox.guard import remove_abandoned_temporary
from tests.orchestrator.tools.conftest import run_tool

READ = ReadTool()
TOOLS: dict[str, Tool[Any]] = {
    "Write": WriteTool(),
    "Edit": EditTool(),
    "MultiEdit": MultiEditTool(),
    "NotebookEdit": NotebookEditTool(),
}
REPO_ROOT = Path(__file__).resolve().parents[3]
IS_ROOT = os.geteuid() == 0


def make_case(tool: str, directory: Path, *, lines: int = 3000) -> tuple[Path, dict[str, Any]]:
    """A big file for `tool` in `directory` and an input that changes (and grows) it."""
    if tool == "NotebookEdit":
        path = directory / "big.ipynb"
        cells: list[dict[str, Any]] = [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
             "source": [f"x_{i} = {i}\n" for i in range(i * 10, i * 10 + 10)]}
            for i in range(lines // 10)
        ]  # fmt: skip
        notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}
        path.write_text(json.dumps(notebook, indent=1, sort_keys=True) + "\n")
        new_source = "".join(f"y_{i} = {i} * 2\n" for i in range(400))
        return path, {"notebook_path": str(path), "cell_number": 0, "new_source": new_source}
    path = directory / "big.txt"
    path.write_text("".join(f"line {i:05d} of the user's uncommitted work\n" for i in range(lines)))
    grown = "a much longer replacement line\n" * 400
    match tool:
        case "Write":
            raw: dict[str, Any] = {"content": path.read_text().replace("line", "LINE") + grown}
        case "Edit":
            raw = {"old_string": "line 00017 of", "new_string": grown}
        case _:
            raw = {
                "edits": [
                    {"old_string": "line 00017 of", "new_string": grown},
                    {"old_string": "line 00040 of", "new_string": grown},
                ]
            }
    return path, {"file_path": str(path), **raw}


def temp_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if ".warren-" in name]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- a full disk -------------------------------------------------------------------------------


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs mounted in the test's directory (root only); umounted afterwards."""
    if not IS_ROOT:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE test covers other users")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> None:
    """Write a filler file until the filesystem reports ENOSPC."""
    with (directory / "filler").open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_a_full_disk_changes_nothing(full_tmpfs: Path, tool: str) -> None:
    ctx = ToolContext(workspace=full_tmpfs, cwd=full_tmpfs)
    path, raw = make_case(tool, full_tmpfs, lines=2000)
    before = path.read_bytes()
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"
    fill(full_tmpfs)

    out = await run_tool(TOOLS[tool], raw, ctx)

    assert out.stage == "error", out.text
    assert "failed" in out.text and "Nothing changed" in out.text and "full" in out.text
    assert path.read_bytes() == before
    assert temp_files(full_tmpfs) == []
    # The file is still recorded as read: the model can retry once space is freed.
    (full_tmpfs / "filler").unlink()
    again = await run_tool(TOOLS[tool], raw, ctx)
    assert again.stage == "ok", again.text
    assert path.read_bytes() != before
    assert temp_files(full_tmpfs) == []


def run_child(spec: dict[str, Any]) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.orchestrator.tools.tool_child"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    child.stdin.write(json.dumps(spec))
    child.stdin.close()
    child.stdin = None  # sent and closed: communicate() must not flush it again
    return child


@pytest.mark.parametrize("tool", list(TOOLS))
def test_a_file_size_limit_changes_nothing(tmp_path: Path, tool: str) -> None:
    """Any user: RLIMIT_FSIZE makes the write fail (EFBIG) half-way through the new content."""
    ws = tmp_path / "ws"
    ws.mkdir()
    path, raw = make_case(tool, ws)
    before = path.read_bytes()
    spec = {"tool": tool, "input": raw, "workspace": str(ws), "fsize_limit": len(before) // 2}
    child = run_child(spec)
    stdout, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    ready, result = stdout.splitlines()
    assert ready == "ready"
    outcome = json.loads(result)
    assert outcome["stage"] == "error", outcome
    assert "failed" in outcome["text"] and "Nothing changed" in outcome["text"]
    assert path.read_bytes() == before
    assert temp_files(ws) == []


# --- SIGKILL during a 40 MB Write --------------------------------------------------------------


KILL_DELAYS_S = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
"""When each child is killed, counted from the moment its write began (fixed, not random)."""


def wait_for_the_write_to_begin(child: subprocess.Popen[str], ws: Path, target: Path) -> None:
    """Return as soon as the call touches the directory: a temporary file appears, or the
    target itself changes (an in-place write truncates it). A watch, not a timed wait."""
    before = target.stat()
    while child.poll() is None:
        if temp_files(ws):
            return
        now = target.stat()
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        ):
            return


@pytest.mark.slow
def test_sigkill_at_any_moment_of_a_40_mb_write_leaves_old_or_new_bytes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    target = ws / "data.txt"
    line = "0123456789abcdef" * 4 + "\n"
    old = (line * (40_000_000 // len(line))).encode()
    new_text = line.upper() * (40_000_000 // len(line))
    content_file = tmp_path / "new-content.txt"
    content_file.write_text(new_text)
    old_digest = hashlib.sha256(old).hexdigest()
    new_digest = hashlib.sha256(new_text.encode()).hexdigest()
    spec = {
        "tool": "Write",
        "input": {"file_path": str(target), "content": ""},
        "workspace": str(ws),
        "content_file": str(content_file),
    }

    def start() -> subprocess.Popen[str]:
        target.write_bytes(old)
        child = run_child(spec)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        return child

    # Uninterrupted, the call writes the complete new bytes.
    child = start()
    stdout, _ = child.communicate(timeout=120)
    assert child.returncode == 0 and '"ok"' in stdout
    assert digest(target) == new_digest

    # Killed at ten moments from the start of its write (creating, writing, fsyncing,
    # renaming): the file holds the old bytes or the new ones, whole, every time.
    seen: list[str] = []
    for delay in KILL_DELAYS_S:
        child = start()
        wait_for_the_write_to_begin(child, ws, target)
        time.sleep(delay)  # the moment of the kill, not a wait for something to happen
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        found = digest(target)
        assert found in (old_digest, new_digest), f"torn file after a kill at +{delay}s"
        seen.append("new" if found == new_digest else "old")
        # A killed write may leave its hidden temporary file, never anything else; its lock
        # died with it, so the next sandbox's sweep takes it.
        for name in temp_files(ws):
            assert name.startswith(".data.txt.warren-") and name.endswith(".tmp")
            assert remove_abandoned_temporary(ws / name)
    assert seen[0] == "old"  # the first kill did interrupt the write


# --- symlinks, hard links, owner and mode -------------------------------------------------------


@pytest.mark.parametrize("tool", ["Write", "Edit", "MultiEdit", "NotebookEdit"])
async def test_a_symlink_inside_the_workspace_is_written_through(
    ws: Path, ctx: ToolContext, tool: str
) -> None:
    real_dir = ws / "real"
    real_dir.mkdir()
    target, raw = make_case(tool, real_dir, lines=50)
    link = ws / f"link{target.suffix}"
    link.symlink_to(Path("real") / target.name)
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    raw = {**raw, key: str(link)}
    before = target.read_bytes()
    assert (await run_tool(READ, {"file_path": str(link)}, ctx)).stage == "ok"

    out = await run_tool(TOOLS[tool], raw, ctx)

    assert out.stage == "ok", out.text
    assert link.is_symlink() and os.readlink(link) == f"real/{target.name}"
    assert target.read_bytes() != before
    assert temp_files(ws) == [] and temp_files(real_dir) == []
    # The ledger holds the new file: a second change needs no new Read.
    assert ctx.read_ledger.recorded_mtime(link) == target.stat().st_mtime_ns


async def test_a_link_through_a_linked_directory_is_written_through(
    ws: Path, ctx: ToolContext
) -> None:
    (ws / "real").mkdir()
    (ws / "alias").symlink_to("real", target_is_directory=True)
    path = ws / "alias" / "new.txt"
    out = await run_tool(TOOLS["Write"], {"file_path": str(path), "content": "x\n"}, ctx)
    assert out.stage == "ok", out.text
    assert (ws / "real" / "new.txt").read_text() == "x\n"
    assert (ws / "alias").is_symlink()


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_a_symlink_leading_outside_is_refused(
    tmp_path: Path, ws: Path, ctx: ToolContext, tool: str
) -> None:
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    outside, raw = make_case(tool, outside_dir, lines=50)
    before = outside.read_bytes()
    link = ws / f"link{outside.suffix}"
    link.symlink_to(outside)
    key = "notebook_path" if tool == "NotebookEdit" else "file_path"
    raw = {**raw, key: str(link)}
    # Even with the file in the ledger (read before the link was planted), no write leaves.
    ctx.read_ledger.record(link)

    out = await run_tool(TOOLS[tool], raw, ctx)

    assert out.stage == "refused"
    assert "outside the workspace" in out.text
    assert outside.read_bytes() == before
    assert link.is_symlink()
    assert temp_files(outside_dir) == [] and temp_files(ws) == []


@pytest.mark.parametrize("tool", ["Write", "Edit"])
async def test_a_symlink_repointed_outside_after_validation_is_refused(
    tmp_path: Path, ws: Path, ctx: ToolContext, tool: str
) -> None:
    inside, raw = make_case(tool, ws, lines=50)
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    outside, _ = make_case(tool, outside_dir, lines=50)
    before = outside.read_bytes()
    link = ws / "link.txt"
    link.symlink_to(inside)
    raw = {**raw, "file_path": str(link)}
    assert (await run_tool(READ, {"file_path": str(link)}, ctx)).stage == "ok"

    def repoint() -> None:
        link.unlink()
        link.symlink_to(outside)

    out = await run_tool(TOOLS[tool], raw, ctx, after_validate=repoint)

    assert out.stage == "error"
    assert "outside the workspace" in out.text
    assert outside.read_bytes() == before
    assert temp_files(outside_dir) == []


def test_the_writer_itself_refuses_a_link_leading_outside(tmp_path: Path, ws: Path) -> None:
    """The last line of defence, whatever the tool checked before."""
    ctx = ToolContext(workspace=ws, cwd=ws)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    for link, target in ((ws / "l1", outside), (ws / "l2", ws / "l1"), (ws / "d", tmp_path)):
        link.symlink_to(target)
    for path in (ws / "l1", ws / "l2", ws / "d" / "outside.txt", ws / "d" / "new.txt"):
        with pytest.raises(ToolError, match=r"outside the workspace.*Nothing changed"):
            write_atomically(path, b"x\n", ctx)
    assert outside.read_text() == "secret\n"
    assert not (tmp_path / "new.txt").exists()
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_mode_is_kept(ws: Path, ctx: ToolContext, tool: str) -> None:
    path, raw = make_case(tool, ws, lines=50)
    for mode in (0o640, 0o755, 0o600):
        path.chmod(mode)
        assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"
        before = path.read_bytes()
        out = await run_tool(TOOLS[tool], raw, ctx)
        assert out.stage == "ok", out.text
        assert path.read_bytes() != before
        assert oct(path.stat().st_mode & 0o7777) == oct(mode)
        path.write_bytes(before)


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another user needs root")
@pytest.mark.parametrize("tool", list(TOOLS))
async def test_owner_and_group_are_kept(ws: Path, ctx: ToolContext, tool: str) -> None:
    path, raw = make_case(tool, ws, lines=50)
    os.chown(path, 12345, 23456)
    path.chmod(0o4750)  # set-user-ID survives: the chown of the copy comes before its chmod
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"

    out = await run_tool(TOOLS[tool], raw, ctx)

    assert out.stage == "ok", out.text
    st = path.stat()
    assert (st.st_uid, st.st_gid) == (12345, 23456)
    assert st.st_mode & 0o7777 == 0o4750


async def test_a_new_file_gets_the_usual_mode(ws: Path, ctx: ToolContext) -> None:
    path = ws / "new.txt"
    out = await run_tool(TOOLS["Write"], {"file_path": str(path), "content": "x\n"}, ctx)
    assert out.stage == "ok"
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_a_hard_link_is_replaced_not_written_through(
    ws: Path, ctx: ToolContext, tool: str
) -> None:
    path, raw = make_case(tool, ws, lines=50)
    other = ws / "other-name"
    os.link(path, other)
    before = path.read_bytes()
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"

    out = await run_tool(TOOLS[tool], raw, ctx)

    assert out.stage == "ok", out.text
    assert path.read_bytes() != before
    assert other.read_bytes() == before  # the other name keeps the old content
    assert path.stat().st_nlink == 1 and other.stat().st_nlink == 1
    assert "hard-linked file is replaced, not written through" in TOOLS[tool].description


@pytest.mark.parametrize("tool", ["Write", "Edit", "MultiEdit"])  # notebooks: Jupyter's form
async def test_crlf_and_encoding_survive_the_atomic_write(
    ws: Path, ctx: ToolContext, tool: str
) -> None:
    path = ws / "crlf.txt"
    path.write_bytes("caf\xe9 one\r\ntwo\r\n".encode("latin-1"))
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"
    raw: dict[str, Any] = {"file_path": str(path)}
    if tool == "Write":
        raw["content"] = "caf\xe9 one\nthree\n"
    elif tool == "Edit":
        raw |= {"old_string": "two\n", "new_string": "three\n"}
    else:
        raw["edits"] = [{"old_string": "two\n", "new_string": "three\n"}]
    out = await run_tool(TOOLS[tool], raw, ctx)
    assert out.stage == "ok", out.text
    assert path.read_bytes() == "caf\xe9 one\r\nthree\r\n".encode("latin-1")


@pytest.mark.skipif(IS_ROOT, reason="root writes through any permission bits")
async def test_an_unwritable_file_is_not_replaced(ws: Path, ctx: ToolContext) -> None:
    path = ws / "locked.txt"
    path.write_text("keep\n")
    path.chmod(0o444)
    assert (await run_tool(READ, {"file_path": str(path)}, ctx)).stage == "ok"
    out = await run_tool(TOOLS["Write"], {"file_path": str(path), "content": "x\n"}, ctx)
    assert out.stage == "error" and "Nothing changed" in out.text
    assert path.read_text() == "keep\n"
