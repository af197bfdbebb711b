"""Every write that reaches the workspace is in a change set (issue 40), through the real CLI:
real `warren`, real sandboxes and workers, the real SDK against the fake Messages API; the
workspace checked on the host, byte for byte and mode for mode.

- Three scoped writers (`dispatch_agent` with `write_paths`, a writable agent type) in one
  turn: one `warren undo` restores all three scopes and names each writer's files; a file a
  user edited since makes it refuse, naming it, with nothing changed.
- An unscoped writable subagent, a PostToolUse hook that writes (in the session's read-write
  tool host), and an MCP server granted `write = true`: three writing turns of one session,
  each undone in turn, the tree as it was before that turn after each undo.
- A `!command` typed in the REPL: a turn of its own, undone.
- A writing background shell (`Bash` with `run_in_background`): its writes, across turns, are
  a change set of its own that names it; an Edit beside it is a turn of its own (what the
  command wrote while the Edit ran stays the command's); a command that ends while a
  foreground Bash runs leaves that Bash its file. The model waits for the command's
  notification with a watch (a shell keeps no headless run going).

After the last undo, one more refuses with the reason and changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.tasks.outputs import outputs_root
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.tty import Terminal

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
HOSTILE = ROOT / "tests" / "kit" / "hostile_mcp_server.py"
SCRIBE = (
    "---\nname: scribe\ndescription: Edits files.\n"
    "tools: Bash, Read, Write, Edit\nwritable: true\n---\nEdit what you are told to.\n"
)
PACKAGES = ("billing", "catalog", "shipping")


@pytest.fixture
def home() -> Iterator[Path]:
    """A fake HOME, state and workspace outside /tmp (every sandbox has a private /tmp)."""
    path = Path("/var/tmp") / f"warren-undo-{uuid.uuid4().hex[:10]}"
    agents = path / "home" / ".config" / "warren" / "agents"
    agents.mkdir(parents=True)
    (agents / "scribe.md").write_text(SCRIBE)
    ws = path / "ws"
    for package in PACKAGES:
        (ws / package).mkdir(parents=True)
        (ws / package / "mod.py").write_text(f"def {package}():\n    return 1\n")
        (ws / package / "mod.py").chmod(0o640)
    (ws / "a.txt").write_bytes(b"alpha\nno newline")
    (ws / "a.txt").chmod(0o600)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(home: Path, api: FakeMessagesAPI | None) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home / "home"),
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        "XDG_CONFIG_HOME": str(home / "home" / ".config"),
        "XDG_STATE_HOME": str(home / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        # `warren undo` asks no model: nothing listens there.
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9" if api is None else api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",
    }


def _tree(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every name under `root` with its kind, mode and content (links never followed)."""
    found: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISDIR(info.st_mode):
            found[rel] = (f"dir {stat.S_IMODE(info.st_mode):o}", "")
        elif stat.S_ISREG(info.st_mode):
            found[rel] = (f"file {stat.S_IMODE(info.st_mode):o}", path.read_bytes())
        else:
            found[rel] = ("other", "")
    return found


def _run(home: Path, api: FakeMessagesAPI, prompt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WARREN, "-p", prompt, "--cwd", str(home / "ws"), "--permission-mode", "bypass",
         "--output-format", "json"],
        env=_env(home, api), capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _undo(home: Path) -> tuple[int, str]:
    done = subprocess.run(
        [*WARREN, "undo", "--cwd", str(home / "ws")],
        env=_env(home, None), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    return done.returncode, (done.stdout + done.stderr).strip()


def _is_writer(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _writer_of(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    return text.split()[-1]


def _dispatch(package: str, scoped: bool = True) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{package}",
        "name": "dispatch_agent",
        "input": {
            "description": f"edit {package}",
            "prompt": f"Edit your package. {package}",
            "subagent_type": "scribe",
            **({"write_paths": [package]} if scoped else {}),
        },
    }


def _writes(package: str) -> str:
    """A writer's edits in its package: a new file, a changed one, a mode, a new directory."""
    return (
        f"cd {package} && printf new > new.txt && sed -i s/1/2/ mod.py && chmod 755 mod.py"
        " && mkdir -p made/deeper && echo x > made/deeper/f.txt"
    )


def test_three_scoped_writers_are_one_turn_undone_as_a_whole(home: Path) -> None:
    ws = home / "ws"
    before = _tree(ws)

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_writer(request):
            if len(request.messages) > 1:
                return Reply.text("done")
            command = _writes(_writer_of(request))
            return Reply.tool_use("Bash", {"command": f"cd {ws} && {command}"})
        if len(request.messages) == 1:
            return Reply(content=[_dispatch(package) for package in PACKAGES])
        return Reply.text("all three done")

    with FakeMessagesAPI(route=route) as api:
        done = _run(home, api, "edit the three packages")
    assert done.returncode == 0, done.stderr
    after = _tree(ws)
    for package in PACKAGES:
        assert after[f"{package}/new.txt"] == ("file 644", b"new")
        assert after[f"{package}/mod.py"][0] == "file 755"

    # A user's edit of a writer's file since: refused, naming it, nothing changed.
    (ws / "catalog" / "new.txt").write_bytes(b"the user's own\n")
    edited = _tree(ws)
    code, said = _undo(home)
    assert code == 1, said
    assert "not undone, nothing changed: changed since that turn: catalog/new.txt" in said
    assert _tree(ws) == edited

    # Back as the writers left it: one undo restores all three scopes, naming each writer's.
    (ws / "catalog" / "new.txt").write_bytes(b"new")
    code, said = _undo(home)
    assert code == 0, said
    assert _tree(ws) == before
    for package in PACKAGES:
        assert f'dispatch_agent "edit {package}": {package}/made' in said, said

    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said
    assert _tree(ws) == before


def test_an_unscoped_writer_a_writing_hook_and_a_writable_mcp_server_are_undone(
    home: Path,
) -> None:
    ws = home / "ws"
    config = home / "home" / ".config" / "warren"
    (config / "policy.toml").write_text(
        f"""
[[hooks]]
event = "PostToolUse"
matcher = "Read"
command = "printf hooked > hooked.txt && chmod 640 hooked.txt && printf more >> a.txt"

[mcp.servers.hostile]
command = "{sys.executable}"
args = ["{HOSTILE}"]
env = {{ OUTSIDE = "{home / "outside"}", WORKSPACE = "{ws}", PYTHONPATH = "{ROOT}" }}
write = true
"""
    )
    (home / "outside").mkdir()
    states = [_tree(ws)]

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_writer(request):
            if len(request.messages) > 1:
                return Reply.text("done")
            return Reply.tool_use("Bash", {"command": f"cd {ws} && {_writes('billing')}"})
        turn = len(request.messages) // 2
        if turn == 0:
            return Reply(content=[_dispatch("billing", scoped=False)])
        if turn == 1:
            return Reply.tool_use("Read", {"file_path": str(ws / "a.txt")})
        if turn == 2:
            return Reply.tool_use("mcp__hostile__attack", {"target_port": 9})
        return Reply.text("done")

    with FakeMessagesAPI(route=route) as api:
        done = _run(home, api, "write in three ways")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["subtype"] == "success", result
    assert (ws / "billing" / "new.txt").read_bytes() == b"new"  # the unscoped writer
    assert (ws / "hooked.txt").read_bytes() == b"hooked"  # the hook
    assert (ws / "a.txt").read_bytes() == b"alpha\nno newlinemore"
    assert (ws / "planted.txt").read_bytes() == b"x"  # the MCP server
    assert not (home / "outside" / "pwned").exists()

    # Each writing turn undone in turn: the MCP call's, the hook's, the subagent's.
    code, said = _undo(home)
    assert code == 0 and "removed planted.txt" in said, said
    assert not (ws / "planted.txt").exists()
    code, said = _undo(home)
    assert code == 0 and "restored a.txt" in said and "removed hooked.txt" in said, said
    code, said = _undo(home)
    assert code == 0 and "restored billing/mod.py" in said, said
    assert _tree(ws) == states[0]
    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said


def test_a_bang_command_in_the_repl_is_undone(home: Path) -> None:
    ws = home / "ws"
    before = _tree(ws)
    with FakeMessagesAPI([]) as api:
        terminal = Terminal.start(WARREN, env=_env(home, api), cwd=ws, socket_dir=home)
        try:
            terminal.wait_for(r"/help for commands", timeout=60)
            terminal.wait_for(r"\n> ?$", timeout=60)
            bang = "!printf typed > typed.txt && chmod 600 typed.txt && rm a.txt"
            terminal.type(bang + " && echo DONE-$((6*7))")
            terminal.press("Enter")
            terminal.wait_for(r"DONE-42", timeout=60)
            terminal.wait_for(r"\n> ?$", timeout=60)
            terminal.press("C-d")
            assert terminal.wait_exit() == 0
        finally:
            terminal.close()
    assert (ws / "typed.txt").read_bytes() == b"typed" and not (ws / "a.txt").exists()
    code, said = _undo(home)
    assert code == 0 and "restored a.txt" in said and "removed typed.txt" in said, said
    assert _tree(ws) == before
    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said


def test_a_writers_follow_up_writes_in_its_scope_and_is_a_turn_of_its_own(home: Path) -> None:
    """SendMessage to a scoped writer that has finished (issue 34, item 3): it runs again in
    its scope with its earlier conversation; a write outside the scope fails read-only; what it
    wrote is a writing turn of its own, undone before the first one's."""
    ws = home / "ws"
    before = _tree(ws)

    def route(request: RecordedRequest) -> FakeResponse:
        last = json.dumps(request.messages[-1])
        if _is_writer(request):
            if "follow-up" in last:
                assert "printf first" in json.dumps(request.messages), "no earlier conversation"
                command = f"cd {ws} && printf second > billing/second.txt; touch catalog/out.txt"
                return Reply.tool_use("Bash", {"command": command})
            if len(request.messages) > 1:
                return Reply.text("done")
            return Reply.tool_use(
                "Bash", {"command": f"cd {ws} && printf first > billing/first.txt"}
            )
        if len(request.messages) == 1:
            call = _dispatch("billing")
            call["input"]["name"] = "biller"
            return Reply(content=[call])
        if "toolu_billing" in last:
            return Reply.tool_use(
                "SendMessage", {"to": "biller", "message": "follow-up: add second.txt"}
            )
        return Reply.text("both done")

    with FakeMessagesAPI(route=route) as api:
        done = _run(home, api, "edit billing, then once more")
        follow_up = next(
            r for r in api.requests if _is_writer(r) and "catalog/out.txt" in json.dumps(r.messages)
            and r.messages[-1]["role"] == "user" and "tool_result" in json.dumps(r.messages[-1])
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    refused = json.dumps(follow_up.messages[-1])  # Landlock: EACCES; a bind mount: EROFS
    assert "Permission denied" in refused or "Read-only file system" in refused, refused
    after = _tree(ws)
    assert after["billing/first.txt"][1] == b"first" and after["billing/second.txt"][1] == b"second"
    assert "catalog/out.txt" not in after

    code, said = _undo(home)  # the follow-up's turn first
    assert code == 0, said
    assert "billing/second.txt" in said and "billing/first.txt" in _tree(ws)
    assert "billing/second.txt" not in _tree(ws)
    code, said = _undo(home)
    assert code == 0, said
    assert _tree(ws) == before


# -- a background shell (a writer of its own across turns) ---------------------------------

KEEP_GOING = {"description": "the background command's end", "command": "sleep 600"}
"""A watch that keeps the headless run going (a shell does not) until the command's
notification is in; then stopped."""


def _use(tool_use_id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


def _background(command: str, description: str) -> dict[str, Any]:
    """The background command's call (`toolu_bg`)."""
    input = {"command": command, "description": description, "run_in_background": True}
    return _use("toolu_bg", "Bash", input)


def _until(condition: str) -> dict[str, Any]:
    """A watch (`toolu_watch`) that ends, printing nothing, once `condition` holds: the next
    step waits for its notification."""
    command = f"until {condition}; do sleep 0.05; done"
    return _use("toolu_watch", "Monitor", {"description": condition, "command": command})


def _result_texts(request: RecordedRequest) -> dict[str, str]:
    """The tool results the request carries, by tool_use_id, as text."""
    content = request.messages[-1]["content"]
    found: dict[str, str] = {}
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            parts = [] if isinstance(inner, str) else inner or []
            text = inner if isinstance(inner, str) else "".join(p.get("text", "") for p in parts)
            found[str(block["tool_use_id"])] = text
    return found


class _WaitsForTheBackground:
    """The model's side: each step's calls in turn (the first starts the background command,
    `toolu_bg`; a step after a `_until` watch waits for the watch's end), then a watch that
    keeps the run going until the command's notification is in (waiting on that state, not
    on time), the watch stopped, and the end."""

    def __init__(self, *steps: list[dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.task_id: str | None = None
        self.watch: str | None = None
        self.keep: str | None = None
        self.stopped = False
        self.notification = ""

    def __call__(self, request: RecordedRequest) -> FakeResponse:
        for tool_use_id, text in _result_texts(request).items():
            started = re.search(r"with ID: ((?:bash|monitor)-\w+)", text)
            if started is None:
                continue
            if tool_use_id == "toolu_bg":
                self.task_id = started.group(1)
            elif tool_use_id == "toolu_watch":
                self.watch = started.group(1)
            elif tool_use_id == "toolu_keep":
                self.keep = started.group(1)
        whole = json.dumps(request.messages)
        if self.watch is not None and not _ended(self.watch, whole):
            return Reply.text("waiting for the watch")  # the run waits for its end
        self.watch = None
        if self.steps:
            return Reply(content=self.steps.pop(0))
        if self.task_id is not None and _ended(self.task_id, whole):
            self.notification = self.notification or whole
            if self.keep is not None and not self.stopped:
                self.stopped = True
                return Reply.tool_use("TaskStop", {"task_id": self.keep})
            return Reply.text("done")
        if self.keep is None:
            return Reply(content=[_use("toolu_keep", "Monitor", KEEP_GOING)])
        return Reply.text("waiting for the background command")


def _ended(task_id: str, messages: str) -> bool:
    """Whether the task's notification is in the conversation (the tasks here print no
    line a monitor would report while they run)."""
    return f"<task-id>{task_id}</task-id>" in messages


def test_a_background_shells_writes_are_its_own_change_set_undone(home: Path) -> None:
    """A writing background Bash (issue 40's last writer): it makes a directory and a file,
    appends to a file and changes its mode, deletes another; its change set names it, one
    `warren undo` puts the tree back byte for byte and mode for mode, a second refuses."""
    ws = home / "ws"
    before = _tree(ws)
    command = (
        "mkdir -p made && printf new > made/new.txt && printf '\\nmore' >> a.txt"
        " && chmod 644 a.txt && rm shipping/mod.py && echo BUILT"
    )
    model = _WaitsForTheBackground([_background(command, "build the site")])
    with FakeMessagesAPI(route=model) as api:
        done = _run(home, api, "build in the background")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == "done", done.stdout
    assert "completed (exit code 0)" in model.notification and "BUILT" in model.notification

    after = _tree(ws)
    assert after["made/new.txt"] == ("file 644", b"new")
    assert after["a.txt"] == ("file 644", b"alpha\nno newline\nmore")
    assert "shipping/mod.py" not in after

    code, said = _undo(home)
    assert code == 0, said
    assert said.endswith(
        ": undid turn 1: restored a.txt, shipping/mod.py; removed made"
        ' (by Bash (background) "build the site")'
    ), said
    assert _tree(ws) == before

    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said, said
    assert _tree(ws) == before


def test_a_background_shell_and_an_edit_beside_it_are_each_undone_on_their_own(
    home: Path,
) -> None:
    """The background command writes a file before an Edit and another once the Edit has
    landed (while the Edit's turn is being recorded); it ends only after that turn (it waits
    for a second task's output file, which a later turn starts). The Edit's turn holds
    a.txt alone, the command's own change set both of its files: undone last first, each
    puts back exactly its own."""
    ws = home / "ws"
    before = _tree(ws)
    outputs = outputs_root(ws)
    command = (
        "printf one > bg1.txt && until grep -q edited a.txt; do sleep 0.05; done"
        " && printf two > bg2.txt"
        f" && until [ $(ls {outputs}/*/*.output | wc -l) -ge 2 ]; do sleep 0.05; done"
    )
    edit = {"file_path": str(ws / "a.txt"), "old_string": "alpha", "new_string": "edited"}
    release = {"command": "echo release", "run_in_background": True}
    model = _WaitsForTheBackground(
        [
            _use("toolu_read", "Read", {"file_path": str(ws / "a.txt")}),
            _background(command, "write beside the edit"),
        ],
        [_use("toolu_edit", "Edit", edit)],
        [_use("toolu_release", "Bash", release)],
    )
    with FakeMessagesAPI(route=model) as api:
        done = _run(home, api, "edit while the background command writes")
    assert done.returncode == 0, done.stderr
    assert "completed (exit code 0)" in model.notification
    after = _tree(ws)
    assert after["a.txt"] == ("file 600", b"edited\nno newline")
    assert after["bg1.txt"][1] == b"one" and after["bg2.txt"][1] == b"two"

    # The command ended last: its change set first, its two files only.
    code, said = _undo(home)
    assert code == 0, said
    assert said.endswith(
        ': undid turn 2: removed bg1.txt, bg2.txt (by Bash (background) "write beside the edit")'
    ), said
    assert _tree(ws) == {**before, "a.txt": ("file 600", b"edited\nno newline")}

    code, said = _undo(home)  # the Edit's turn: a.txt alone
    assert code == 0 and said.endswith(": undid turn 1: restored a.txt"), said
    assert _tree(ws) == before

    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said, said
    assert _tree(ws) == before


def test_a_background_shell_ending_while_a_call_runs_leaves_the_call_its_file(
    home: Path,
) -> None:
    """The background command ends while a foreground Bash still runs (the Bash wrote c.txt
    and waits for the command's process to be gone): the command's end, recorded before the
    Bash's after-scan, once took c.txt into the command's change set, so undoing the command
    removed the Bash's file and the Bash's turn had no record. Each is its own now."""
    ws = home / "ws"
    before = _tree(ws)
    command = (
        "echo $$ > /tmp/bg.pid && printf one > bg1.txt && until [ -e c.txt ]; do sleep 0.01; done"
    )
    gone = "! kill -0 $(cat /tmp/bg.pid) 2>/dev/null"  # the tool host's own /tmp
    foreground = f"printf c > c.txt && until {gone}; do sleep 0.01; done"
    model = _WaitsForTheBackground(
        [_background(command, "wait for c")],
        [_until("[ -e bg1.txt ]")],  # bg1.txt the command's before the Bash starts
        [_use("toolu_fg", "Bash", {"command": foreground})],
    )
    with FakeMessagesAPI(route=model) as api:
        done = _run(home, api, "write while the background command ends")
    assert done.returncode == 0, done.stderr
    assert "completed (exit code 0)" in model.notification
    assert (ws / "bg1.txt").read_bytes() == b"one" and (ws / "c.txt").read_bytes() == b"c"

    # Which record comes last depends on whether the command's end or the Bash's result
    # reached the coordinator first; either way each undo puts back its own file only.
    written = {"c.txt": b"c", "bg1.txt": b"one"}
    said_by = {
        "c.txt": ": removed c.txt",
        "bg1.txt": ': removed bg1.txt (by Bash (background) "wait for c")',
    }
    undone: list[str] = []
    for _ in said_by:
        code, said = _undo(home)
        assert code == 0, said
        names = [name for name, end in said_by.items() if said.endswith(end)]
        assert len(names) == 1, said
        undone.append(names[0])
        left = {n: ("file 644", data) for n, data in written.items() if n not in undone}
        assert _tree(ws) == {**before, **left}, said
    assert _tree(ws) == before
    code, said = _undo(home)
    assert code == 1 and "every writing turn was undone already; nothing changed" in said, said
