"""Auto-approved git never runs a program a repository configured (issue 33, class 1), through
the real `warren` CLI: real sandboxes, the real SDK against the fake Messages API.

A workspace holds a nested repository, a gitlink (a submodule's repository) and a linked
worktree, each configuring programs git runs on read-only commands (`core.fsmonitor` on
status, `gpg.program` on `log --show-signature`, `core.sshCommand` on `remote show`, an
included file's fsmonitor, a worktree's own config). Each planted program
prints a marker and writes a marker file into an extra root outside the workspace (`--add-dir`)
that the sandbox may write; each attack is first shown to work with a plain git on the host, so
the test can fail. The model runs those read-only git commands without asking: they run, and
no marker reaches a tool result or the host. A repository that configures a driver's program
(`diff.<d>.textconv`) or `diff.external`, which no fixed override reaches, makes git ask
instead (denied headless, with the reason); one configured after start-up (in a file the
repository includes from outside the workspace) is refused when the command runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.git_repo import git, make_repo

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SIGNED = (
    "tree {tree}\nparent {parent}\n"
    "author t <t@t> 1700000000 +0000\ncommitter t <t@t> 1700000000 +0000\n"
    "gpgsig -----BEGIN PGP SIGNATURE-----\n \n"
    " iQEzBAABCAAdFiEEsignaturesignaturesignaturesignatureAAoJEAAAAAAAAAAAAAAA\n"
    " =abcd\n -----END PGP SIGNATURE-----\n\na signed commit\n"
)


@pytest.fixture
def place() -> Iterator[Path]:
    """The workspace, the fake home, the planted programs and the extra root, outside /tmp
    (every sandbox has a private /tmp)."""
    root = Path("/var/tmp") / f"warren-git-{uuid.uuid4().hex[:10]}"
    for part in ("home", "bin", "extra", "state"):
        (root / part).mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _evil(place: Path, name: str) -> str:
    """A program that prints `MARKER-name` and drops a file of that name in the extra root."""
    path = place / "bin" / f"evil-{name}"
    path.write_text(
        f"#!/bin/sh\necho MARKER-{name}\necho MARKER-{name} >&2\n"
        f"touch {place / 'extra' / name}\nexit 1\n"
    )
    path.chmod(0o755)
    return str(path)


def _host_git(cwd: Path, *args: str) -> None:
    """A plain git on the host (the attack must work there, else the test proves nothing)."""
    env = {**os.environ, "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, timeout=30)


def _live(place: Path, name: str, cwd: Path, *args: str) -> None:
    marker = place / "extra" / name
    _host_git(cwd, *args)
    assert marker.exists(), f"{name}: the attack does not work on this git"
    marker.unlink()


def _sign(repo: Path) -> None:
    """HEAD becomes a commit with a (bogus) signature: `log --show-signature` calls gpg."""
    tree = subprocess.run(["git", "write-tree"], cwd=repo, capture_output=True, text=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    text = SIGNED.format(tree=tree.stdout.strip(), parent=head.stdout.strip())
    made = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
        cwd=repo, input=text, capture_output=True, text=True, check=True,
    )  # fmt: skip
    git(repo, "update-ref", "HEAD", made.stdout.strip())


def _run(
    place: Path, replies: list[Reply], *extra: str, route: Any = None
) -> dict[str, Any]:
    with FakeMessagesAPI(replies, route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "look around", "--cwd", str(place / "ws"), "--output-format", "json",
             "--add-dir", str(place / "extra"), *extra],
            env={
                **os.environ,
                "HOME": str(place / "home"),
                "XDG_STATE_HOME": str(place / "state"),
                "XDG_CONFIG_HOME": str(place / "home" / ".config"),
                "ANTHROPIC_API_KEY": "sk-test-git",
                "ANTHROPIC_BASE_URL": api.base_url,
                "PYTHONPATH": str(ROOT),
                "WARREN_NO_SERVER": "1",
            },
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        sent = api.requests
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    results = {
        block["tool_use_id"]: json.dumps(block["content"])
        for block in sent[-1].messages[-1]["content"]
        if block.get("type") == "tool_result"
    }
    seen = [
        block
        for request in sent
        for message in request.messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    result["tool_results"] = {b["tool_use_id"]: json.dumps(b["content"]) for b in seen}
    result["last_results"] = results
    return result


def _calls(*commands: str) -> list[Reply]:
    blocks = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": c}}
        for i, c in enumerate(commands)
    ]
    return [Reply(content=[block]) for block in blocks] + [Reply.text("done")]


def test_code_running_settings_of_every_repository_run_nothing(place: Path) -> None:
    ws = make_repo(place / "ws")
    # A nested repository with four live attacks.
    vendor = make_repo(ws / "vendor")
    git(vendor, "config", "core.fsmonitor", _evil(place, "fsmonitor"))
    git(vendor, "config", "gpg.program", _evil(place, "gpg"))
    git(vendor, "config", "core.sshCommand", _evil(place, "ssh"))
    git(vendor, "config", "core.pager", _evil(place, "pager"))
    git(vendor, "config", "core.hooksPath", str(place / "bin"))
    git(vendor, "remote", "add", "origin", "ssh://example.invalid/x.git")
    _sign(vendor)
    (vendor / "README.md").write_text("changed\n")
    # A nested repository whose fsmonitor comes from an included file.
    included = make_repo(ws / "included")
    (place / "evil.inc").write_text(f"[core]\n\tfsmonitor = {_evil(place, 'include')}\n")
    git(included, "config", "include.path", str(place / "evil.inc"))
    # A gitlink: a repository recorded in the workspace's index, with its own fsmonitor.
    sub = make_repo(ws / "sub")
    git(sub, "config", "core.fsmonitor", _evil(place, "gitlink"))
    git(ws, "add", "sub")
    git(ws, "commit", "-q", "-m", "gitlink")
    (sub / "README.md").write_text("dirty\n")
    # A linked worktree of the workspace's repository, with a worktree-only fsmonitor.
    git(ws, "config", "extensions.worktreeConfig", "true")
    git(ws, "worktree", "add", "-q", "wt")
    git(ws / "wt", "config", "--worktree", "core.fsmonitor", _evil(place, "worktree"))

    _live(place, "fsmonitor", vendor, "status")
    _live(place, "gpg", vendor, "log", "--show-signature", "-1")
    _live(place, "ssh", vendor, "remote", "show", "origin")
    _live(place, "include", included, "status")
    _live(place, "gitlink", ws, "status")
    _live(place, "worktree", ws / "wt", "status")
    for marker in (place / "extra").iterdir():  # one host check can fire another's program
        marker.unlink()

    commands = (
        "git -C vendor status --short",
        "cd vendor && git diff",
        "git -C vendor log --show-signature -1 --format=%s",
        "git -C vendor remote show origin",
        "git -C included status --short",
        "git status --short",
        "git -C wt status --short",
    )
    result = _run(place, _calls(*commands))
    assert result["permission_denials"] == [], result["permission_denials"]
    outputs = result["tool_results"]
    assert len(outputs) == len(commands)
    for text in outputs.values():
        assert "MARKER" not in text, text
    assert "README.md" in outputs["toolu_0"], "the read-only git ran and answered"
    assert "a signed commit" in outputs["toolu_2"], outputs["toolu_2"]
    ran = {p.name: p.read_text() for p in (place / "extra").iterdir()}
    assert ran == {}, ran


def test_a_repository_that_configures_a_driver_makes_git_ask(place: Path) -> None:
    ws = make_repo(place / "ws")
    drivers = make_repo(ws / "drivers")
    (drivers / ".gitattributes").write_text("*.md diff=evil\n")
    git(drivers, "config", "diff.evil.textconv", _evil(place, "textconv"))
    (drivers / "README.md").write_text("changed\n")
    _live(place, "textconv", drivers, "diff")
    external = make_repo(ws / "external")
    git(external, "config", "diff.external", _evil(place, "external"))
    (external / "README.md").write_text("changed\n")
    _live(place, "external", external, "diff")

    commands = ("git -C drivers diff", "git -C external diff", "git status --short")
    result = _run(place, _calls(*commands))
    denied = {d["tool_input"]["command"]: d for d in result["permission_denials"]}
    assert set(denied) == set(commands), denied
    for text in result["tool_results"].values():
        assert "MARKER" not in text
        # The reason, for the model: the first repository found that configures a program.
        assert "diff.evil.textconv" in text or "diff.external" in text, text
    assert list((place / "extra").iterdir()) == []


def test_a_driver_planted_after_start_up_is_refused_when_git_runs(place: Path) -> None:
    """A driver configured once the session runs, in a file outside the workspace that a
    repository includes (the floor keeps a sandbox from writing a repository's own
    configuration, and removes a `.git` made while it runs; here the user writes the file
    between two turns): the start-up probe did not see it; the one-shot's git refuses it."""
    ws = make_repo(place / "ws")
    evil = _evil(place, "late")
    late = make_repo(ws / "late")
    (late / ".gitattributes").write_text("*.md diff=evil\n")
    (late / "README.md").write_text("changed\n")
    shared = place / "shared.inc"  # a file the repository includes, outside the workspace
    shared.write_text("[color]\n\tui = false\n")
    git(late, "config", "include.path", str(shared))

    def plant() -> None:
        shared.write_text(f'[diff "evil"]\n\ttextconv = {evil}\n')

    replies = _calls("git status --short", "git -C late diff")
    turns = iter(replies)

    def route(request: Any) -> Reply:
        if len(request.messages) == 3:  # the first result is in: the user plants it now
            plant()
            _live(place, "late", late, "diff")
        return next(turns)

    result = _run(place, [], route=route)
    refused = result["tool_results"]["toolu_1"]
    assert "MARKER" not in refused
    assert "git was not run" in refused and "diff.evil.textconv" in refused, refused
    assert not (place / "extra" / "late").exists()
