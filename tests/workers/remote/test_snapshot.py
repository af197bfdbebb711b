"""The workspace snapshot a remote subagent sees (workers/remote/snapshot.py), with real git,
the real read-only sandbox and real files; no Ray.

Attacks first: a hostile repository must not run code on the host while git lists it, nor get
a secret, a FIFO or a masked file into the snapshot. Then the node side: a view mirrors a
manifest, rewrites only what changed, and is never written through a link planted in it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from policies.rules import compile_path_pattern
from tests.kit.floor import needs_sandbox
from tests.kit.git_repo import git, make_repo
from workers.remote import snapshot
from workers.remote.snapshot import (
    Manifest,
    NodeCache,
    NodeCollected,
    SnapshotBuilder,
    SnapshotEntry,
    SnapshotError,
)

pytestmark = needs_sandbox

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- secret-5e1f"
SANDBOXED = [True, False]
"""git in the read-only sandbox, and git on the host (the floor turned off), hardened."""


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A host directory outside /tmp (sandboxes have a private /tmp) holding the fake home
    with a secret and the attacks' marker files; `HOME` points at that home."""
    root = Path("/var/tmp") / f"warren-snap-{uuid.uuid4().hex[:10]}"
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / "home" / ".ssh" / "id_rsa").write_text(SECRET + "\n")
    (root / "markers").mkdir()
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root / "home" / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def plant_hooks(repo: Path, marker: Path) -> None:
    """`core.fsmonitor` (which `git ls-files` runs) and `core.hooksPath` name a script that
    drops `marker` on the host; the attack is shown to work with a plain `git ls-files`."""
    hook = repo / "x.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))
    git(repo, "config", "core.hooksPath", ".")
    for name in ("pre-commit", "post-checkout", "post-index-change"):
        (repo / name).symlink_to("x.sh")
    subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    assert marker.exists(), "the attack does not work on this git: the test proves nothing"
    marker.unlink()


def denied_by(workspace: Path, *specs: str) -> Callable[[str], bool]:
    """`Read(spec)` deny rules as `SessionPolicy.read_denied` makes them."""
    patterns = [
        compile_path_pattern(s, anchor=workspace, workspace=workspace, home=workspace)
        for s in specs
    ]
    return lambda path: any(p.matches(path) for p in patterns)


async def build(
    workspace: Path, *, sandboxed: bool = True, read_denied: Callable[[str], bool] | None = None
) -> tuple[SnapshotBuilder, Manifest]:
    builder = SnapshotBuilder(workspace, read_denied=read_denied, sandboxed=sandboxed)
    with trio.fail_after(60):  # a FIFO must not hang the build
        return builder, await builder.build()


def paths(manifest: Manifest, kind: str = "file") -> set[str]:
    return {e.path for e in manifest.entries if e.kind == kind}


def entry(manifest: Manifest, path: str) -> SnapshotEntry:
    return next(e for e in manifest.entries if e.path == path)


# --- attacks --------------------------------------------------------------------------------


@pytest.mark.parametrize("sandboxed", SANDBOXED)
async def test_repository_hooks_and_fsmonitor_do_not_run(
    tmp_path: Path, outside: Path, sandboxed: bool
) -> None:
    repo = make_repo(tmp_path / "ws")
    marker = outside / "markers" / "ran"
    plant_hooks(repo, marker)
    _, manifest = await build(repo, sandboxed=sandboxed)
    assert not marker.exists()
    assert {"README.md", "x.sh"} <= paths(manifest)  # git did list the repository


@pytest.mark.parametrize("sandboxed", SANDBOXED)
async def test_a_nested_repository_runs_nothing_and_stays_out(
    tmp_path: Path, outside: Path, sandboxed: bool
) -> None:
    """Building the outer workspace leaves the nested repository out (git lists it as one
    name); building inside the nested one runs none of its configured code either."""
    repo = make_repo(tmp_path / "ws")
    nested = make_repo(repo / "vendor" / "lib")
    marker = outside / "markers" / "nested-ran"
    plant_hooks(nested, marker)
    _, outer = await build(repo, sandboxed=sandboxed)
    assert not any(p.startswith("vendor") for p in paths(outer) | paths(outer, "dir"))
    git(repo, "add", "vendor/lib")  # now a gitlink, as a submodule is
    _, outer = await build(repo, sandboxed=sandboxed)
    assert not any(p.startswith("vendor") for p in paths(outer) | paths(outer, "dir"))
    _, inner = await build(nested, sandboxed=sandboxed)
    assert not marker.exists()
    assert "README.md" in paths(inner)


async def test_a_link_to_a_secret_is_recorded_never_followed(tmp_path: Path, outside: Path) -> None:
    repo = make_repo(tmp_path / "ws")
    secret = outside / "home" / ".ssh" / "id_rsa"
    (repo / "notes.md").symlink_to(secret)
    (repo / "docs").mkdir()
    (repo / "docs" / "key").symlink_to(secret)  # untracked, not ignored
    git(repo, "add", "notes.md")
    builder, manifest = await build(repo)
    assert entry(manifest, "notes.md").target == str(secret)
    assert entry(manifest, "docs/key").kind == "link"
    blobs = {e.digest: builder.read_blob(e.digest) for e in manifest.entries if e.digest}
    assert all(b"secret-5e1f" not in data for data in blobs.values())
    # On a node the link stays a link with the same text.
    cache = NodeCache(tmp_path / "node")
    cache.add_blobs(blobs)
    cache.sync_view(manifest, tmp_path / "view")
    assert os.readlink(tmp_path / "view" / "notes.md") == str(secret)


@pytest.mark.parametrize("git_repo", [True, False])
async def test_a_fifo_named_like_a_source_file_does_not_hang(
    tmp_path: Path, outside: Path, git_repo: bool
) -> None:
    ws = make_repo(tmp_path / "ws") if git_repo else tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "ok.py").write_text("x = 1\n")
    os.mkfifo(ws / "src" / "main.py")
    _, manifest = await build(ws)
    assert "src/ok.py" in paths(manifest)
    assert not any(e.path == "src/main.py" for e in manifest.entries)


@pytest.mark.parametrize("sandboxed", SANDBOXED)
async def test_secrets_masks_and_ignored_files_stay_out(
    tmp_path: Path, outside: Path, sandboxed: bool
) -> None:
    """Dotenv files, `Read` deny rules, a `deny_read` path the floor masks (which the sandbox
    also hides from git itself), ignored files and `.git` stay out; untracked files are in."""
    repo = make_repo(tmp_path / "ws")
    (repo / ".gitignore").write_text("*.log\nbuild/\n")
    files = {
        ".env": "API_KEY=1",
        "app/.env.local": "API_KEY=2",
        "secrets/prod.key": "k",
        "config/token.txt": "t",
        "masked/inner.txt": "m",
        "debug.log": "ignored",
        "build/out.bin": "ignored",
        "app/main.py": "print()",  # untracked, not ignored
        "tracked.txt": "t",
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-f", "tracked.txt", ".env", "debug.log")  # tracked and ignored: listed
    denied = denied_by(repo, "secrets", "config/token.txt")
    builder = SnapshotBuilder(
        repo, read_denied=denied, deny_read=(str(repo / "masked"),), sandboxed=sandboxed
    )
    manifest = await builder.build()
    assert paths(manifest) == {".gitignore", "README.md", "app/main.py", "tracked.txt", "debug.log"}
    assert paths(manifest, "dir") == {"app"}
    assert not any(".git" in e.path.split("/") for e in manifest.entries)


async def test_a_workspace_without_git_holds_every_file(tmp_path: Path) -> None:
    ws = tmp_path / "plain"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "c.txt").write_text("c")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    _, manifest = await build(ws)
    assert paths(manifest) == {"a/b/c.txt", "run.sh"}
    assert paths(manifest, "dir") == {"a", "a/b"}
    assert entry(manifest, "run.sh").executable
    assert not entry(manifest, "a/b/c.txt").executable
    # A `.git` git does not take for a repository: not "every file" (ignored ones too).
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("[core]\n")
    with pytest.raises(SnapshotError, match="git ls-files failed"):
        await build(ws)


async def test_a_worktree_is_listed_by_git(tmp_path: Path, outside: Path) -> None:
    """A worktree's `.git` points at its main repository's, which the sandbox shows only
    through the read-only binds (here the main repository lies in the host's /tmp)."""
    main = make_repo(tmp_path / "main")
    (main / ".gitignore").write_text("*.log\n")
    git(main, "add", ".gitignore")
    git(main, "commit", "-q", "-m", "ignore")
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"))
    (tmp_path / "wt" / "debug.log").write_text("ignored")
    _, manifest = await build(tmp_path / "wt")
    assert paths(manifest) == {".gitignore", "README.md"}


async def test_deny_rules_hold_for_a_workspace_reached_through_a_link(tmp_path: Path) -> None:
    """Rules are anchored at the workspace path the session was given, which may be a link;
    the snapshot reads the resolved tree and asks about both."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "secret.txt").write_text("s")
    (real / "ok.txt").write_text("o")
    (tmp_path / "link").symlink_to(real)
    builder = SnapshotBuilder(
        tmp_path / "link", read_denied=denied_by(tmp_path / "link", "secret.txt")
    )
    manifest = await builder.build()
    assert paths(manifest) == {"ok.txt"}
    assert manifest.root == str(tmp_path / "link")


async def test_caps_fail_the_build_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.bin").write_bytes(b"x" * 100)
    (ws / "small.txt").write_bytes(b"y" * 60)
    monkeypatch.setattr(snapshot, "MAX_FILE_BYTES", 99)
    with pytest.raises(SnapshotError, match=r"big\.bin .*per-file cap"):
        await build(ws)
    monkeypatch.setattr(snapshot, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(snapshot, "MAX_TOTAL_BYTES", 150)
    with pytest.raises(SnapshotError, match="total cap"):
        await build(ws)


# --- the coordinator's side -----------------------------------------------------------------


async def test_builds_are_incremental_and_ids_deterministic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "RACY_NS", 0)  # files just written count as settled
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    for i in range(5):
        (ws / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    builder, first = await build(ws)
    assert builder.reads == 5
    again = await builder.build()
    assert builder.reads == 5  # nothing re-read
    assert again == first
    (ws / "pkg" / "m3.py").write_text("x = 33\n")
    changed = await builder.build()
    assert builder.reads == 6
    assert changed.id != first.id
    # The same tree elsewhere (other inodes and times) has the same id.
    shutil.copytree(ws, tmp_path / "copy")
    _, copy = await build(tmp_path / "copy")
    assert copy.id == changed.id


async def test_a_file_changed_just_before_a_build_is_read_again(tmp_path: Path) -> None:
    """A write in the same timestamp tick as the read would leave the stat unchanged: a file
    changed within `RACY_NS` of a build is read again by the next one."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha")
    builder, _ = await build(ws)
    await builder.build()
    assert builder.reads == 2


async def test_read_blob_reads_again_and_checks_the_digest(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha")
    builder, manifest = await build(ws)
    digest = entry(manifest, "a.txt").digest
    assert digest is not None
    assert builder.read_blob(digest) == b"alpha"
    (ws / "a.txt").write_text("beta!")
    with pytest.raises(SnapshotError, match="changed since"):
        builder.read_blob(digest)
    with pytest.raises(SnapshotError, match="no file"):
        builder.read_blob("0" * 64)


def test_manifests_refuse_unsafe_paths_and_a_wrong_id() -> None:
    for bad in ("/etc/passwd", "../x", "a/../b", "a//b", ".git/config", ""):
        with pytest.raises(ValueError):
            SnapshotEntry(path=bad, kind="link", target="x")
    orphan = SnapshotEntry(path="d/x", kind="link", target="y")
    with pytest.raises(ValueError, match="no directory entry"):
        Manifest.of("/ws", [orphan])
    good = Manifest.of("/ws", [SnapshotEntry(path="x", kind="link", target="y")])
    with pytest.raises(ValueError, match="id"):
        Manifest(id="0" * 64, root="/ws", entries=good.entries)


# --- the node's side ------------------------------------------------------------------------


def manifest_of(
    root: str, files: dict[str, bytes | str], execs: frozenset[str] = frozenset()
) -> tuple[Manifest, dict[str, bytes]]:
    """A manifest of `files` (bytes: a file; str: a link's target) and its blobs."""
    entries: list[SnapshotEntry] = []
    blobs: dict[str, bytes] = {}
    dirs: set[str] = set()
    for path, content in files.items():
        parts = path.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if isinstance(content, str):
            entries.append(SnapshotEntry(path=path, kind="link", target=content))
            continue
        digest = hashlib.sha256(content).hexdigest()
        blobs[digest] = content
        entries.append(
            SnapshotEntry(
                path=path,
                kind="file",
                digest=digest,
                size=len(content),
                executable=path in execs,
            )
        )
    entries += [SnapshotEntry(path=d, kind="dir") for d in dirs]
    return Manifest.of(root, entries), blobs


def view_tree(view: Path) -> dict[str, object]:
    """What a view holds: file bytes and exec bit, link targets, directories."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(view):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(view))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
                if name in dirnames:
                    dirnames.remove(name)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = (path.read_bytes(), bool(path.stat().st_mode & stat.S_IXUSR))
    return out


def sync(cache: NodeCache, manifest: Manifest, blobs: dict[str, bytes], view: Path) -> None:
    cache.add_blobs({d: blobs[d] for d in cache.missing(manifest)})
    assert cache.missing(manifest) == []
    cache.sync_view(manifest, view)


async def test_a_view_mirrors_a_built_manifest(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src" / "deep").mkdir(parents=True)
    (ws / "src" / "deep" / "a.py").write_text("a")
    (ws / "tool.sh").write_text("#!/bin/sh\n")
    (ws / "tool.sh").chmod(0o755)
    (ws / "src" / "alias.py").symlink_to("deep/a.py")
    builder, manifest = await build(ws)
    cache = NodeCache(tmp_path / "node")
    blobs = {d: builder.read_blob(d) for d in cache.missing(manifest)}
    view = tmp_path / "view"
    sync(cache, manifest, blobs, view)
    assert view_tree(view) == view_tree(ws)
    assert stat.S_IMODE(view.stat().st_mode) == 0o700  # the user's files, not the node's


def test_a_second_manifest_rewrites_only_what_changed(tmp_path: Path) -> None:
    cache, view = NodeCache(tmp_path / "node"), tmp_path / "view"
    first, blobs = manifest_of(
        "/ws",
        {"a.txt": b"a", "b/c.txt": b"c", "b/d.txt": b"d", "run": b"#!", "gone/x": b"x"},
        frozenset({"run"}),
    )
    sync(cache, first, blobs, view)
    assert cache.writes == 5
    inodes = {p: (view / p).stat().st_ino for p in ("a.txt", "b/c.txt", "run")}
    second, more = manifest_of(
        "/ws", {"a.txt": b"a", "b/c.txt": b"c", "b/d.txt": b"D!", "run": b"#!"}, frozenset({"run"})
    )
    sync(cache, second, {**blobs, **more}, view)
    assert cache.writes == 6  # only b/d.txt
    assert {p: (view / p).stat().st_ino for p in inodes} == inodes
    assert view_tree(view) == {
        "a.txt": (b"a", False),
        "b": "dir",
        "b/c.txt": (b"c", False),
        "b/d.txt": (b"D!", False),
        "run": (b"#!", True),
    }
    # A fresh cache object on the same node (an actor restart) still rewrites nothing.
    again = NodeCache(tmp_path / "node")
    again.sync_view(second, view)
    assert again.writes == 0


def test_a_blob_with_a_wrong_digest_is_refused(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "node")
    manifest, blobs = manifest_of("/ws", {"a.txt": b"right"})
    (digest,) = blobs
    with pytest.raises(SnapshotError, match="refused"):
        cache.add_blobs({digest: b"wrong"})
    assert cache.missing(manifest) == [digest]
    with pytest.raises(SnapshotError, match="lacks the blob"):
        cache.sync_view(manifest, tmp_path / "view")


def test_sync_never_writes_through_a_link_planted_in_the_view(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "victim.txt").write_text("host file")
    cache, view = NodeCache(tmp_path / "node"), tmp_path / "view"
    manifest, blobs = manifest_of("/ws", {"a.txt": b"snapshot a", "sub/b.txt": b"snapshot b"})
    sync(cache, manifest, blobs, view)
    (view / "a.txt").unlink()
    (view / "a.txt").symlink_to(host / "victim.txt")
    shutil.rmtree(view / "sub")
    (view / "sub").symlink_to(host)
    (view / ".git").mkdir()  # an extra of any name goes
    cache.sync_view(manifest, view)
    assert (host / "victim.txt").read_text() == "host file"
    assert sorted(os.listdir(host)) == ["victim.txt"]
    assert view_tree(view) == {
        "a.txt": (b"snapshot a", False),
        "sub": "dir",
        "sub/b.txt": (b"snapshot b", False),
    }


def test_sync_refuses_a_manifest_that_escapes_the_view(tmp_path: Path) -> None:
    """A manifest that skipped validation (unpickled, or built with `model_construct`) still
    cannot name a path outside the view."""
    escape = SnapshotEntry.model_construct(path="../escaped", kind="link", target="x")
    manifest = Manifest.model_construct(id="0" * 64, root="/ws", entries=(escape,))
    with pytest.raises(SnapshotError, match="must be relative"):
        NodeCache(tmp_path / "node").sync_view(manifest, tmp_path / "view")
    assert not (tmp_path / "escaped").exists()


# -- a node's cache is collected -------------------------------------------------------------

_CLAIMER = """
import sys
from pathlib import Path
from workers.remote.snapshot import NodeCache
cache = NodeCache(Path(sys.argv[1]))
with cache.using():
    cache.claim_view(cache.view_path(sys.argv[2]))
print("claimed", flush=True)
sys.stdin.read()
"""


def test_a_collection_removes_what_dead_actors_left_and_keeps_what_live_views_hold(
    tmp_path: Path,
) -> None:
    root = tmp_path / "node"
    cache = NodeCache(root)
    live, dead = cache.view_path("live"), cache.view_path("dead")
    shared = b"shared by both views\n"
    live_manifest, live_blobs = manifest_of("/ws", {"a.py": b"live only\n", "s.py": shared})
    dead_manifest, dead_blobs = manifest_of("/ws", {"b.py": b"dead only\n" * 100, "s.py": shared})
    # The dead view's actor is a real process, killed: the kernel lets go of its claim.
    with subprocess.Popen(
        [sys.executable, "-c", _CLAIMER, str(root), "dead"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=Path(__file__).parents[3],
    ) as actor:
        assert actor.stdout is not None and actor.stdout.readline() == b"claimed\n"
        with cache.using():
            claim = cache.claim_view(live)
        sync(cache, live_manifest, live_blobs, live)
        sync(cache, dead_manifest, dead_blobs, dead)
        done = cache.collect(max_bytes=0, grace_s=0)  # both views claimed: nothing goes
        assert done is not None and (done.views, done.blobs) == (0, 0)
        assert dead.is_dir() and cache.missing(dead_manifest) == []
        assert cache.unclaimed_views(grace_s=0) == []
        actor.kill()

    assert cache.unclaimed_views(grace_s=0) == ["dead"]
    before = view_tree(live)
    # Under the cap: the dead actor's view goes, every blob stays (a later session sends none).
    done = cache.collect(max_bytes=1 << 40, grace_s=0)
    assert done is not None and (done.views, done.blobs) == (1, 0)
    assert not dead.exists() and cache.missing(dead_manifest) == []
    assert sorted(p.suffix for p in (root / "views").iterdir()) == [".claim", ".json"]
    # Over it: only what the live view holds stays; the live view is untouched.
    done = cache.collect(max_bytes=0, grace_s=0)
    assert done is not None and done.blobs == 1 and done.freed >= 1000
    assert cache.missing(live_manifest) == []
    assert cache.missing(dead_manifest) == [hashlib.sha256(b"dead only\n" * 100).hexdigest()]
    assert NodeCache(root).missing(dead_manifest) == cache.missing(dead_manifest)
    assert view_tree(live) == before

    # The live actor stops: its view and what is kept about it go with its claim.
    cache.release_view(live, claim)
    assert not live.exists() and list((root / "views").iterdir()) == []
    done = cache.collect(max_bytes=0, grace_s=0)
    assert done == NodeCollected(views=0, blobs=2, freed=len(b"live only\n") + len(shared))


def test_a_collection_never_runs_beside_a_sync_and_spares_young_unclaimed_views(
    tmp_path: Path,
) -> None:
    cache = NodeCache(tmp_path / "node")
    manifest, blobs = manifest_of("/ws", {"a.py": b"a\n"})
    cache.add_blobs(blobs)
    with cache.using():  # a sync in progress: the collection does nothing, and never waits
        assert cache.collect(max_bytes=0, grace_s=0) is None
    assert cache.missing(manifest) == []
    # A view with no claim (made by a Warren before claims): kept while young, then removed.
    old = cache.view_path("old")
    cache.sync_view(manifest, old)
    done = cache.collect(max_bytes=1 << 40)
    assert done is not None and (done.views, done.blobs) == (0, 0) and done.kept == 2
    assert old.is_dir()
    os.utime(old, (0, 0))
    done = cache.collect(max_bytes=1 << 40)
    assert done is not None and done.views == 1 and not old.exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../up", "x\0y"])
def test_a_view_name_is_one_path_component(tmp_path: Path, name: str) -> None:
    with pytest.raises(SnapshotError):
        NodeCache(tmp_path / "node").view_path(name)
