"""Memory files as users expect them (issue 11, item 7), under the security rules of issue 9.

The repository's files (from the git root down to the working directory, with `@imports`)
are read by the real context probe in a real read-only bwrap sandbox (`gather_context` with
a `ContextSandbox`), and by the same probe on the host when the sandbox is off; the user's
own files are read on the host. Attacks plant what a hostile repository could (links out,
FIFOs, endless devices, imports of secrets) and check what reached the snapshot. Secrets and
the fake home live under /var/tmp: sandboxes have a private /tmp, so a secret there would be
out of reach for the wrong reason.

Through the real CLI: the first request carries the memory in order, and a subagent's first
request (a real worker in a real sandbox, through the real pool) carries the same context.
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

import pytest
import trio

from orchestrator.conversation import context
from orchestrator.conversation.context import (
    ContextSandbox,
    ContextSnapshot,
    MemorySources,
    context_spec,
    gather_context,
    memory_root,
)
from policies.memory_files import MAX_IMPORT_DEPTH
from policies.rules import compile_path_pattern
from sandbox.host import detect_host
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

pytestmark = needs_sandbox

REPO = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SECRET = "secret-9f3e-do-not-leak"
MODES = ["required", "off"]


@pytest.fixture
def outside() -> Iterator[Path]:
    """Host directory outside /tmp and outside the fake home: a sandbox can read it (the
    root file system is visible read-only), so only Warren's own checks keep it out."""
    root = Path("/var/tmp") / f"warren-mem-{uuid.uuid4().hex[:10]}"
    (root / "home" / ".claude").mkdir(parents=True)
    (root / "home" / ".config" / "warren").mkdir(parents=True)
    (root / "secret.txt").write_text(SECRET + "\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def git_init(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(path)}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "init"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=path,
            check=True,
            env=env,
        )
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def snapshot_of(
    cwd: Path,
    mode: str,
    *,
    home: Path | None = None,
    deny: tuple[str, ...] = (),
    user: bool = False,
) -> ContextSnapshot:
    root = memory_root(cwd, home)  # pytest's tmp_path is already resolved
    patterns = tuple(
        compile_path_pattern(spec, anchor=cwd, workspace=cwd, home=home or cwd) for spec in deny
    )
    memory = MemorySources(
        root=root,
        user_files=(
            (home / ".config" / "warren" / "WARREN.md", home / ".claude" / "CLAUDE.md")
            if user and home is not None
            else ()
        ),
        home=home,
        deny=patterns,
    )
    sandbox = None
    if mode == "required":
        sandbox = ContextSandbox(context_spec(root), await detect_host())
    with trio.fail_after(30):  # a FIFO or an endless device must not hang start-up
        return await gather_context(cwd, sandbox=sandbox, memory=memory)


def labels(snapshot: ContextSnapshot) -> list[str]:
    return [name for name, _ in snapshot.memory]


def text_of(snapshot: ContextSnapshot, path: Path) -> str:
    found = dict(snapshot.memory)
    assert str(path) in found, f"{path} not in {labels(snapshot)}"
    return found[str(path)]


# --- where memory files are found ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_nested_files_from_the_git_root_down_to_cwd_in_order(
    tmp_path: Path, mode: str
) -> None:
    repo = git_init(tmp_path / "repo")
    cwd = repo / "pkg" / "sub"
    write(tmp_path / "CLAUDE.md", "above the git root")
    root_agents = write(repo / "AGENTS.md", "root agents")
    root_claude = write(repo / "CLAUDE.md", "root claude")
    middle = write(repo / "pkg" / "WARREN.md", "middle warren")
    here = write(cwd / "CLAUDE.md", "cwd claude")
    write(repo / "pkg" / "other" / "CLAUDE.md", "sibling directory")
    write(cwd / "deeper" / "CLAUDE.md", "below cwd")
    snapshot = await snapshot_of(cwd, mode)
    assert labels(snapshot) == [str(p) for p in (root_agents, root_claude, middle, here)]
    rendered = snapshot.render()
    assert rendered.index("root agents") < rendered.index("middle warren")
    assert rendered.index("middle warren") < rendered.index("cwd claude")
    for absent in ("above the git root", "sibling directory", "below cwd"):
        assert absent not in rendered
    assert f'<memory file="{here}">' in rendered  # labelled with its path
    assert snapshot.git_branch == "main"  # git works from a subdirectory (root mounted)


async def test_outside_a_repository_only_cwd_counts(tmp_path: Path) -> None:
    write(tmp_path / "CLAUDE.md", "parent, no repository")
    cwd = tmp_path / "work"
    own = write(cwd / "AGENTS.md", "cwd only")
    snapshot = await snapshot_of(cwd, "required")
    assert labels(snapshot) == [str(own)]


def test_a_home_that_is_a_repository_is_not_the_root(outside: Path) -> None:
    home = outside / "home"
    (home / ".git").mkdir()
    project = home / "src" / "project"
    project.mkdir(parents=True)
    assert memory_root(project, home) == project
    assert memory_root(home, home) == home


async def test_the_probe_compiled_ahead_by_the_server_sees_what_its_source_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's sessions run the probe from the code the server compiled
    (`context.preload_probe`, on the sandbox's stdin): the same snapshot, git and memory
    files with an import (loaded beside the probe's own file) included."""
    repo = git_init(tmp_path / "repo")
    write(repo / "CLAUDE.md", "top @docs/more.md\n")
    write(repo / "docs" / "more.md", "imported text\n")
    write(repo / "new.txt", "x\n")
    from_source = await snapshot_of(repo, "required")
    monkeypatch.setattr(context, "_compiled_probe", None)
    context.preload_probe()
    assert context._probe_code() is not None
    compiled = await snapshot_of(repo, "required")
    assert compiled == from_source
    assert compiled.git_branch == "main" and "new.txt" in (compiled.git_status or "")
    assert "imported text" in text_of(compiled, repo / "docs" / "more.md")


# --- @imports -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_imports_relative_nested_cycles_and_depth(tmp_path: Path, mode: str) -> None:
    repo = git_init(tmp_path / "repo")
    top = write(
        repo / "CLAUDE.md",
        "Style: @docs/style.md\nMail me at someone@example.com.\n"
        "```\n@docs/in-a-code-block.md\n```\nAnd `@docs/in-a-span.md`, then @chain/0.md.\n",
    )
    style = write(repo / "docs" / "style.md", "STYLE-TEXT imports @../shared/common.md")
    common = write(repo / "shared" / "common.md", "COMMON-TEXT back to @../CLAUDE.md")
    write(repo / "docs" / "in-a-code-block.md", "CODE-BLOCK-TEXT")
    write(repo / "docs" / "in-a-span.md", "SPAN-TEXT")
    deepest = MAX_IMPORT_DEPTH + 2
    for i in range(deepest):
        write(repo / "chain" / f"{i}.md", f"CHAIN-{i} next @{i + 1}.md")
    snapshot = await snapshot_of(repo, mode)
    chain = [str(repo / "chain" / f"{i}.md") for i in range(MAX_IMPORT_DEPTH)]
    # The importing file first, each import after it, depth first; the cycle back to
    # CLAUDE.md ends quietly (each file once).
    assert labels(snapshot) == [str(top), str(style), str(common), *chain]
    rendered = snapshot.render()
    assert rendered.count("COMMON-TEXT") == 1 and rendered.count("Style:") == 1
    for absent in ("CODE-BLOCK-TEXT", "SPAN-TEXT", f"CHAIN-{MAX_IMPORT_DEPTH}"):
        assert absent not in rendered
    last = text_of(snapshot, repo / "chain" / f"{MAX_IMPORT_DEPTH - 1}.md")
    assert f"not imported: deeper than {MAX_IMPORT_DEPTH} imports" in last


@pytest.mark.parametrize("mode", MODES)
async def test_imports_out_of_the_repository_are_refused_with_a_note(
    tmp_path: Path, outside: Path, mode: str
) -> None:
    repo = git_init(tmp_path / "repo")
    secret = outside / "secret.txt"
    write(tmp_path / "beside.md", f"BESIDE {SECRET}")
    (repo / "docs").mkdir()
    (repo / "docs" / "link.md").symlink_to(secret)
    (repo / "docs" / "dirlink").symlink_to(outside)
    os.mkfifo(repo / "docs" / "fifo.md")
    (repo / "docs" / "zero.md").symlink_to("/dev/zero")
    write(repo / "docs" / "fine.md", "FINE-TEXT")
    top = write(
        repo / "CLAUDE.md",
        f"@../beside.md @{secret} @docs/link.md @docs/dirlink/secret.txt @~/x.md\n"
        "@docs/fifo.md @docs/zero.md @docs/fine.md\n",
    )
    snapshot = await snapshot_of(repo, mode, home=outside / "home")
    rendered = snapshot.render()
    assert SECRET not in rendered and "BESIDE" not in rendered
    assert labels(snapshot) == [str(top), str(repo / "docs" / "fine.md")]
    note = text_of(snapshot, top)
    assert f"@{tmp_path / 'beside.md'} not imported: outside the repository" in note
    assert f"@{secret} not imported: outside the repository" in note
    assert f"@{repo / 'docs' / 'link.md'} not imported: a link leading outside" in note
    assert "dirlink/secret.txt not imported: a link leading outside" in note
    assert f"@{repo / 'docs' / 'fifo.md'} not imported" in note
    assert f"@{repo / 'docs' / 'zero.md'} not imported: a link leading outside" in note


@pytest.mark.parametrize("mode", MODES)
async def test_an_import_a_read_deny_rule_covers_is_refused(tmp_path: Path, mode: str) -> None:
    repo = git_init(tmp_path / "repo")
    write(repo / "secrets" / "keys.md", f"KEYS {SECRET}")
    write(repo / ".env", f"TOKEN={SECRET}")
    (repo / "docs").mkdir()
    (repo / "docs" / "alias.md").symlink_to("../secrets/keys.md")
    top = write(repo / "CLAUDE.md", "@secrets/keys.md @.env @docs/alias.md")
    snapshot = await snapshot_of(repo, mode, deny=("secrets/**", ".env"))
    assert SECRET not in snapshot.render()
    note = text_of(snapshot, top)
    for name in ("secrets/keys.md", ".env", "docs/alias.md"):
        assert f"@{repo / name} not imported: a Read deny rule covers it" in note


# --- the user's own files -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_user_files_come_first_and_import_only_user_files(
    tmp_path: Path, outside: Path, mode: str
) -> None:
    home = outside / "home"
    repo = git_init(tmp_path / "repo")
    project = write(repo / "CLAUDE.md", "PROJECT-TEXT")
    write(repo / "planted.md", f"PLANTED {SECRET}")
    (repo / "escape").symlink_to(outside)  # repository-controlled link to the host
    warren = write(home / ".config" / "warren" / "WARREN.md", "USER-WARREN @rules.md")
    rules = write(home / ".config" / "warren" / "rules.md", "USER-RULES")
    (home / "linked").symlink_to(repo)  # the user's link into the repository
    claude = write(
        home / ".claude" / "CLAUDE.md",
        f"USER-CLAUDE @~/notes.md @{repo / 'planted.md'} @{repo / 'escape' / 'secret.txt'}"
        " @~/linked/planted.md",
    )
    notes = write(home / "notes.md", "USER-NOTES")
    snapshot = await snapshot_of(repo, mode, home=home, user=True)
    assert labels(snapshot) == [str(p) for p in (warren, rules, claude, notes, project)]
    assert SECRET not in snapshot.render()
    note = text_of(snapshot, claude)
    assert note.count("not imported: it lies in a workspace") == 3


async def test_user_files_that_are_fifos_or_devices_do_not_hang(
    tmp_path: Path, outside: Path
) -> None:
    home = outside / "home"
    os.mkfifo(home / ".claude" / "CLAUDE.md")
    (home / ".config" / "warren" / "WARREN.md").symlink_to("/dev/zero")
    repo = git_init(tmp_path / "repo")
    write(repo / "AGENTS.md", "PROJECT")
    snapshot = await snapshot_of(repo, "required", home=home, user=True)
    assert labels(snapshot) == [str(repo / "AGENTS.md")]


# --- trust ----------------------------------------------------------------------------------


def test_nested_and_imported_memory_files_are_covered_by_trust(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from policies.trust import TrustStore, project_policy_hash

    monkeypatch.setenv("HOME", str(outside / "home"))
    repo = git_init(tmp_path / "repo")
    cwd = repo / "pkg"
    write(repo / "CLAUDE.md", "root @docs/a.md")
    write(repo / "docs" / "a.md", "a imports @b.md")
    imported = write(repo / "docs" / "b.md", "b")
    nested = write(cwd / "AGENTS.md", "nested")
    store = TrustStore(tmp_path / "trust.json")
    store.trust(cwd)
    assert store.state(cwd, project_policy_hash(cwd)) == "trusted"
    for target in (imported, nested, repo / "CLAUDE.md"):
        target.write_text(target.read_text() + " changed")
        assert store.state(cwd, project_policy_hash(cwd)) == "changed", target
        store.trust(cwd)
    write(repo / "docs" / "new.md", "n")
    write(repo / "docs" / "b.md", "now imports @new.md")  # a new import appears
    assert store.state(cwd, project_policy_hash(cwd)) == "changed"
    store.trust(cwd)
    (repo / "docs" / "new.md").write_text("changed")
    assert store.state(cwd, project_policy_hash(cwd)) == "changed"


# --- through the real CLI -------------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, outside: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(outside / "home"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(outside / "home" / ".config"),
        "ANTHROPIC_API_KEY": "sk-test-mem",
        "PYTHONPATH": str(REPO),
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def is_subagent(request: RecordedRequest) -> bool:
    return "dispatched by another agent" in json.dumps(request.system)


def test_main_agent_and_subagent_get_the_memory_and_git_snapshot(
    tmp_path: Path, outside: Path, env: dict[str, str]
) -> None:
    home = outside / "home"
    write(home / ".config" / "warren" / "WARREN.md", "USER-MEMORY-7c1")
    repo = git_init(tmp_path / "repo")
    write(repo / "CLAUDE.md", "ROOT-MEMORY-3b2 @docs/conventions.md")
    write(repo / "docs" / "conventions.md", "IMPORTED-MEMORY-5d4")
    cwd = write(repo / "pkg" / "AGENTS.md", "NESTED-MEMORY-9a0").parent
    dispatch = Reply.tool_use(
        "dispatch_agent",
        {"description": "look around", "prompt": "Report what you were told."},
    )

    def route(request: RecordedRequest) -> FakeResponse | None:
        return Reply.text("subagent report") if is_subagent(request) else None

    with FakeMessagesAPI([dispatch, Reply.text("done")], route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "survey", "--cwd", str(cwd)],
            env={**env, "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        requests = api.requests
    assert done.returncode == 0, done.stderr
    main = [r for r in requests if not is_subagent(r)]
    subagent = [r for r in requests if is_subagent(r)]
    assert main and subagent, [json.dumps(r.system)[:200] for r in requests]
    order = ["USER-MEMORY-7c1", "ROOT-MEMORY-3b2", "IMPORTED-MEMORY-5d4", "NESTED-MEMORY-9a0"]
    for request in (main[0], subagent[0]):
        system = json.dumps(request.system)
        positions = [system.find(marker) for marker in order]
        assert -1 not in positions and positions == sorted(positions), positions
        assert "Git branch: main" in system
        assert f"Working directory: {cwd}" in system
