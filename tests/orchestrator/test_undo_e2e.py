"""Per-turn change sets and `warren undo` (issue 17, item 4), with the real `warren` process,
real sandboxes and the real SDK against the fake Messages API.

One session writes in two turns: Edit on one file and Bash on others (`sed -i`, `echo >>`,
`rm`, a new file, new directories), then a turn that plants a symlink to a file outside the
workspace over a file, a dangling link and a FIFO. The change sets come from the scans, never
from the model. Undoing the last turn removes what was planted without following it (the
file outside is untouched, no scan or undo hangs on the FIFO); a file changed after the first
turn makes the next undo refuse, naming it, with nothing changed; once it is back, undo puts
every file back byte for byte and removes what the turn created."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.orchestrator.test_cli_headless_e2e import env, warren, workspace

__all__ = ["env", "workspace"]  # fixtures

ORIGINAL = {
    "a.txt": b"alpha one\nalpha two\n",
    "b.txt": b"beta one\nno newline at the end",
    "c.txt": b"gamma\n",
    "d.bin": b"\x00\xff\x00binary\r\n",
}


def _tree(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every name under `root` with its kind and content (a link's target, never followed)."""
    found: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            found[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[rel] = ("dir", "")
        elif stat.S_ISREG(info.st_mode):
            found[rel] = (f"file {stat.S_IMODE(info.st_mode):o}", path.read_bytes())
        else:
            found[rel] = ("other", "")
    return found


def test_undo_restores_each_writing_turn_and_refuses_after_a_later_change(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    for name, data in ORIGINAL.items():
        (workspace / name).write_bytes(data)
    (workspace / "d.bin").chmod(0o751)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_bytes(b"not the workspace's\n")
    start = _tree(workspace)
    bash_edits = (
        "sed -i s/one/ONE/ b.txt && echo more >> c.txt && rm d.bin && printf new > e.txt"
        " && mkdir -p new/deeper && echo x > new/deeper/f.txt"
    )
    plants = f"rm b.txt && ln -s {victim} b.txt && ln -s {victim} planted && mkfifo fifo"
    replies = [
        Reply.tool_use("Read", {"file_path": str(workspace / "a.txt")}),
        Reply(
            content=[
                {
                    "type": "tool_use",
                    "name": "Edit",
                    "input": {
                        "file_path": str(workspace / "a.txt"),
                        "old_string": "alpha two",
                        "new_string": "ALPHA TWO",
                    },
                },
                {"type": "tool_use", "name": "Bash", "input": {"command": bash_edits}},
            ]
        ),
        Reply.tool_use("Bash", {"command": plants}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies) as api:
        run = warren(
            ["-p", "edit", "--cwd", str(workspace), "--permission-mode", "bypass",
             "--output-format", "json"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )  # fmt: skip
    assert run.returncode == 0, run.stderr
    session_id = json.loads(run.stdout)["session_id"]
    assert os.path.islink(workspace / "b.txt") and stat.S_ISFIFO(
        (workspace / "fifo").lstat().st_mode
    )
    after_first = {
        **{k: v for k, v in start.items() if k != "d.bin"},
        "a.txt": ("file 644", b"alpha one\nALPHA TWO\n"),
        "b.txt": ("file 644", b"beta ONE\nno newline at the end"),
        "c.txt": ("file 644", b"gamma\nmore\n"),
        "e.txt": ("file 644", b"new"),
        "new": ("dir", ""),
        "new/deeper": ("dir", ""),
        "new/deeper/f.txt": ("file 644", b"x\n"),
    }

    def undo(*args: str) -> tuple[int, str]:
        done = warren(["undo", *args, "--cwd", str(workspace)], env)
        assert "Traceback" not in done.stderr
        return done.returncode, (done.stdout + done.stderr).strip()

    # The last writing turn: the planted link, dangling link and FIFO go, b.txt comes back.
    code, said = undo()
    assert code == 0, said
    assert said.startswith(f"warren undo: session {session_id}: undid turn 2: restored b.txt")
    assert _tree(workspace) == after_first
    assert victim.read_bytes() == b"not the workspace's\n"

    # A later change to a file of the first writing turn: refused, naming it, nothing changed.
    (workspace / "c.txt").write_bytes(b"the user's own edit\n")
    before_refusal = _tree(workspace)
    code, said = undo(session_id)
    assert code == 1
    assert "turn 1 not undone, nothing changed: changed since that turn: c.txt" in said
    assert _tree(workspace) == before_refusal

    # Back as the turn left it: the first turn is undone, byte for byte, modes too.
    (workspace / "c.txt").write_bytes(b"gamma\nmore\n")
    code, said = undo()
    assert code == 0, said
    assert "undid turn 1: restored a.txt, b.txt, c.txt, d.bin; removed e.txt, new" in said
    assert _tree(workspace) == start

    code, said = undo()
    assert (code, said) == (1, f"warren undo: session {session_id}: every writing turn was "
                               "undone already; nothing changed")  # fmt: skip
