"""Scoped writers through the real `warren` CLI (issue 17's acceptance): real bwrap workers, the
real SDK against the fake Messages API, everything checked on the host afterwards. Run under
both ways a scope is held (workers/pool.py): Landlock in a warm worker (EACCES outside the
scope) and mounts in a fresh one (`WARREN_SCOPES=mount`: EROFS outside the scope).

One run per way does it all, to pay for one warren start:

- turn 1: the main agent reads `pkg_a/mod.py`, then dispatches three writers with the disjoint
  scopes `pkg_a`, `pkg_b`, `pkg_c`. Each writer's first reply is held until all three are in
  flight at once (seen in the fake server's request log), so they can only finish if they run
  concurrently. Each writer's Bash writes inside its scope, then attacks: outside, through
  `..`, through a symlink in its scope, into another writer's scope, a rename out of its
  scope, a hard link into it, through `/proc/self/root`, and onto a protected name (`.envrc`)
  inside its scope;
- turn 2: the main agent edits `pkg_a/mod.py`, which writer a changed: refused until it is
  read again (the read ledger dropped it); then two writers with the overlapping scopes
  `shared` and `shared/inner`, which run one after the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.landlock import MIN_ABI, abi
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SCRIBE = (
    "---\nname: scribe\ndescription: Edits the files of one package.\n"
    "tools: Bash, Read, Write, Edit\nwritable: true\n---\nEdit what you are told to.\n"
)
DENIED = {"landlock": "Permission denied", "mount": "Read-only file system"}
"""What a write outside the scope gets under each way of holding it."""
DISJOINT = ("a", "b", "c")
OVERLAPPING = {"x": "shared", "y": "shared/inner"}

ATTACKS = """\
cd {ws}
t() {{
  l=$1; shift
  if ( "$@" ) 2>/tmp/e; then echo "$l: ok"; else echo "$l: $(tr -d '\\n' </tmp/e)"; fi
}}
t inside sh -c 'echo new > pkg_{me}/new_{me}.txt && sed -i s/old_name/new_name/ pkg_{me}/mod.py'
t outside sh -c 'echo x > outside_{me}.txt'
t dotdot sh -c 'echo x > pkg_{me}/../dotdot_{me}.txt'
t symlink sh -c 'echo x > pkg_{me}/escape/via_link_{me}.txt'
t other_scope sh -c 'echo x > pkg_{other}/planted_{me}.txt'
t rename_out mv pkg_{me}/keep.txt moved_{me}.txt
t hard_link ln pkg_{other}/mod.py pkg_{me}/linked_{other}.py
t proc_root sh -c 'echo x > /proc/self/root{ws}/pkg_{other}/proc_{me}.txt'
t protected sh -c 'echo evil > pkg_{me}/.envrc'
"""


@pytest.fixture
def home() -> Iterator[Path]:
    """A fake HOME and workspace outside /tmp (every sandbox has a private /tmp)."""
    path = Path("/var/tmp") / f"warren-scoped-{uuid.uuid4().hex[:10]}"
    agents = path / "home" / ".config" / "warren" / "agents"
    agents.mkdir(parents=True)
    (agents / "scribe.md").write_text(SCRIBE)
    ws = path / "ws"
    for me in DISJOINT:
        (ws / f"pkg_{me}").mkdir(parents=True)
        (ws / f"pkg_{me}" / "mod.py").write_text("def old_name():\n    return 1\n")
        (ws / f"pkg_{me}" / "keep.txt").write_text("stays\n")
        (ws / f"pkg_{me}" / ".envrc").write_text("safe\n")  # a protected name in the scope
        (ws / f"pkg_{me}" / "escape").symlink_to(f"../pkg_{_next(me)}")  # in a scope, out of it
    (ws / "shared" / "inner").mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _next(me: str) -> str:
    return DISJOINT[(DISJOINT.index(me) + 1) % len(DISJOINT)]


def _dispatch(me: str, scope: str) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_writer_{me}",
        "name": "dispatch_agent",
        "input": {
            "description": f"edit {scope}",
            "prompt": f"Edit your package. {me}",
            "subagent_type": "scribe",
            "write_paths": [scope],
        },
    }


def _is_writer(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def _token(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
    return text.split()[-1]


def _results(request: RecordedRequest) -> dict[str, str]:
    """The tool_results of a request's last message, by tool_use id."""
    out = {}
    for block in request.messages[-1]["content"]:
        inner = block["content"]
        out[block["tool_use_id"]] = inner if isinstance(inner, str) else json.dumps(inner)
    return out


def _release_when_all_in_flight(api: FakeMessagesAPI, stop: threading.Event) -> None:
    """Release the three held first replies once all three are in flight together (never, if
    the writers run one after another: then, after the deadline, the test fails)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not stop.is_set():
        held = [
            r
            for r in api.requests
            if _is_writer(r) and len(r.messages) == 1 and _token(r) in DISJOINT
        ]
        if len(held) == 3 and all(r.ended_at is None for r in held):
            break
        time.sleep(0.02)
    api.release(3)


@pytest.mark.parametrize(
    "scopes",
    [
        pytest.param(
            "landlock",
            marks=pytest.mark.skipif(abi() < MIN_ABI, reason=f"no Landlock ABI {MIN_ABI}"),
        ),
        "mount",
    ],
)
def test_scoped_writers_run_at_once_inside_their_scopes_only(home: Path, scopes: str) -> None:
    ws = home / "ws"

    def route(request: RecordedRequest) -> FakeResponse:
        if _is_writer(request):
            me = _token(request)
            if len(request.messages) > 1:
                return Reply.text(f"done {me}")
            if me in OVERLAPPING:
                script = f"echo {me} > {ws}/{OVERLAPPING[me]}/{me}.txt"
                return Reply.tool_use("Bash", {"command": script})
            script = ATTACKS.format(ws=ws, me=me, other=_next(me))
            return Reply.tool_use("Bash", {"command": script}, hold_before_stop=True)
        turn = len(request.messages) // 2
        if turn == 0:
            read = {"type": "tool_use", "id": "toolu_read", "name": "Read",
                    "input": {"file_path": str(ws / "pkg_a" / "mod.py")}}  # fmt: skip
            return Reply(content=[read, *(_dispatch(me, f"pkg_{me}") for me in DISJOINT)])
        if turn == 1:
            edit = {"type": "tool_use", "id": "toolu_edit", "name": "Edit",
                    "input": {"file_path": str(ws / "pkg_a" / "mod.py"),
                              "old_string": "return 1", "new_string": "return 2"}}  # fmt: skip
            return Reply(content=[edit, *(_dispatch(me, s) for me, s in OVERLAPPING.items())])
        return Reply.text("all done")

    env = {
        **os.environ,
        "HOME": str(home / "home"),
        "XDG_CONFIG_HOME": str(home / "home" / ".config"),
        "XDG_STATE_HOME": str(home / "state"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
        "WARREN_SCOPES": "mount" if scopes == "mount" else "auto",
    }
    stop = threading.Event()
    with FakeMessagesAPI(route=route) as api:
        env["ANTHROPIC_BASE_URL"] = api.base_url
        releaser = threading.Thread(target=_release_when_all_in_flight, args=(api, stop))
        releaser.start()
        try:
            done = subprocess.run(
                [*WARREN, "-p", "go", "--cwd", str(ws), "--output-format", "stream-json",
                 "--permission-mode", "bypass"],
                env=env, capture_output=True, text=True, timeout=180,
            )  # fmt: skip
        finally:
            stop.set()
            releaser.join()
        requests = api.requests
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    writers = [r for r in requests if _is_writer(r)]

    # The three disjoint writers were in flight at the same time (the fake server's log).
    firsts = [r for r in writers if len(r.messages) == 1 and _token(r) in DISJOINT]
    assert len(firsts) == 3
    assert max(r.started_at for r in firsts) < min(r.ended_at or 0 for r in firsts)

    # Each wrote inside its scope and nowhere else; verified on the host.
    for me in DISJOINT:
        (second,) = [r for r in writers if _token(r) == me and len(r.messages) == 3]
        report = next(iter(_results(second).values()))
        outcome = dict(line.split(": ", 1) for line in report.splitlines() if ": " in line)
        assert outcome["inside"] == "ok", report
        attacks = ("outside", "dotdot", "symlink", "other_scope", "rename_out", "proc_root")
        for attack in attacks:
            assert DENIED[scopes] in outcome[attack], (attack, report)
        # A protected name in the scope stays read-only: the floor mounts it so either way.
        assert "Read-only file system" in outcome["protected"], report
        assert "Invalid cross-device link" in outcome["hard_link"], report
        assert (ws / f"pkg_{me}" / f"new_{me}.txt").read_text() == "new\n"
        assert "new_name" in (ws / f"pkg_{me}" / "mod.py").read_text()
        assert (ws / f"pkg_{me}" / "keep.txt").read_text() == "stays\n"
        assert (ws / f"pkg_{me}" / ".envrc").read_text() == "safe\n"
    names = sorted(
        (Path(d) / f).relative_to(ws).as_posix() for d, _, files in os.walk(ws) for f in files
    )
    assert names == sorted(
        [
            f"pkg_{me}/{f}"
            for me in DISJOINT
            for f in ("mod.py", "keep.txt", ".envrc", f"new_{me}.txt")
        ]
        + ["shared/x.txt", "shared/inner/y.txt"]
    )

    # Each dispatch's result lists what changed, with sha256 before and after.
    main = [r for r in requests if not _is_writer(r)]
    first_results = _results(main[1])
    new_hash = hashlib.sha256(b"new\n").hexdigest()
    for me in DISJOINT:
        text = first_results[f"toolu_writer_{me}"]
        assert f"{ws}/pkg_{me}/new_{me}.txt: created (sha256 - -> {new_hash})" in text, text
        assert f"{ws}/pkg_{me}/mod.py: modified" in text
        assert "keep.txt" not in text
    # The main agent read pkg_a/mod.py before writer a changed it: it must read it again.
    edit = _results(main[2])["toolu_edit"]
    assert "has not been read in this session" in edit, edit

    # The overlapping pair ran one after the other, y after x: the request log and the plan.
    spans = {me: [r for r in writers if _token(r) == me] for me in OVERLAPPING}
    assert max(r.ended_at or 0 for r in spans["x"]) < min(r.started_at for r in spans["y"])
    schedule = {
        line["tool_use_id"]: line for line in lines if line.get("subtype") == "tool_schedule"
    }
    assert schedule["toolu_writer_a"]["waits_for"] == ["toolu_read"]  # it reads a's scope
    assert schedule["toolu_writer_b"]["waits_for"] == []
    assert schedule["toolu_writer_c"]["runs_with"] == [
        "toolu_read",
        "toolu_writer_a",
        "toolu_writer_b",
    ]
    assert schedule["toolu_writer_y"]["waits_for"] == ["toolu_edit", "toolu_writer_x"]
    assert schedule["toolu_writer_x"]["write_scope"] == [str(ws / "shared")]
    audit = next((home / "state").rglob("*.audit.jsonl")).read_text().splitlines()
    kinds = [json.loads(line) for line in audit]
    assert {k["tool_use_id"] for k in kinds if k["kind"] == "schedule"} == set(schedule)
