"""The workspace as a remote subagent may see it: a content-addressed snapshot, built by the
coordinator and unpacked by a node (issue 18, item 2).

A subagent that runs on another machine cannot mount the coordinator's workspace, so at
dispatch the coordinator describes it as a `Manifest` (every entry with its kind and, for a
file, its execute bit and the sha256 of its bytes), the node asks for the blobs it lacks
(`NodeCache.missing`) and mirrors the manifest into a view directory that the worker's
sandbox mounts read-only.
Unchanged files cost nothing twice: the builder does not re-read a file whose stat is the same
(`SnapshotBuilder.build`), and a node does not re-fetch a blob it has nor rewrite a view file
that already holds it (`NodeCache.sync_view`). The transport (Ray's object store) is not here:
this module is plain data and files. A dispatch goes:

    manifest = await builder.build()                      # coordinator, once per state
    wanted = cache.missing(manifest)                      # node
    blobs = {d: builder.read_blob(d) for d in wanted}     # coordinator, in a thread
    cache.add_blobs(blobs); cache.sync_view(manifest, view)   # node

`sync_view` renames files inside `view`: sync a view no running worker has mounted (one per
worker slot), and report `manifest.id` as the snapshot the subagent saw.

What the snapshot holds, in the issue's words "the workspace as the subagent is allowed to see
it":

- the files git lists, `git ls-files --cached --others --exclude-standard` (tracked, and
  untracked but not ignored), run inside the read-only sandbox start-up context gathering uses
  (`orchestrator.conversation.context.context_spec`) with git's code-running settings disabled
  (`orchestrator.conversation.context_probe.git_argv`): nothing the repository configures runs or
  is read on the host (`core.fsmonitor`, hooks, `core.excludesFile`, includes are seen only inside
  the sandbox). With the floor off (`sandboxed=False`) git runs here with those settings disabled,
  as the context probe then does. Submodules and nested
  repositories are left out (git lists them as one name; their files are another
  repository's). A worktree's git directories are bound into that sandbox read-only. A
  workspace in no repository (no `.git` from it up to the home): every file below it; a git
  that fails where a `.git` exists fails the build rather than take ignored files too;
- minus the files the policy's `Read` deny rules cover (`read_denied`, given absolute paths as
  `SessionPolicy.read_denied` expects), the paths the floor masks inside the workspace
  (`sandbox.masks.gather_host_facts`: `deny_read` entries that resolve into it), and dotenv
  files (`SECRET_NAMES`): a local subagent may read those, but a snapshot is copied to every
  node's disk and stays in its cache, so secrets a repository keeps for its own runs stay
  home;
- minus `.git` itself: the remote subagent gets no git history, only the work tree.

Files are read on the host the way the change scans read them
(`orchestrator.changes.tree_state.walk`, `sandbox.safe_read.read_unchanged_at`): directories opened
from the root down with `O_NOFOLLOW`, files with `O_NOFOLLOW | O_NONBLOCK` and checked to be
regular on the open descriptor, so a FIFO, a device or a link is never read; a link is recorded by
its target text only (inside the worker's sandbox it points at the node's path, which the node's
floor governs). Sizes are capped per file and in total (`SnapshotError` names the cap and the file).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.store_gc import inventory, sweep
from orchestrator.changes.tree_state import open_parent, walk
from orchestrator.conversation.context import context_spec, memory_root
from orchestrator.conversation.context_probe import git_argv, git_env
from orchestrator.errors import WarrenError
from sandbox.errors import SandboxError
from sandbox.host import SandboxHost
from sandbox.masks import gather_host_facts, linked_git_dirs
from sandbox.safe_read import read_unchanged_at
from sandbox.spec import Bind, SandboxSpec, WorkspaceRoot

__all__ = [
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "MAX_TOTAL_BYTES",
    "NODE_CACHE_MAX_BYTES",
    "SECRET_NAMES",
    "Manifest",
    "NodeCache",
    "NodeCollected",
    "SnapshotBuilder",
    "SnapshotEntry",
    "SnapshotError",
]

MAX_FILE_BYTES = 64 * 1024**2
"""Bytes one file of a snapshot may hold (64 MiB); a larger one fails the build."""
MAX_TOTAL_BYTES = 1024**3
"""Bytes all files of a snapshot may hold together (1 GiB); more fails the build."""
MAX_ENTRIES = 200_000
"""Entries (files, links, directories) one snapshot may hold; more fails the build."""
NODE_CACHE_MAX_BYTES = 2 * 1024**3
"""What a node's cached blobs may weigh (2 GiB; `WARREN_RAY_CACHE_MAX_BYTES` on the node
overrides) before a collection keeps only the blobs of views in use."""
NODE_GC_INTERVAL_S = 600.0
"""A node's cache is collected at most this often (at an actor's stop)."""
NODE_GC_GRACE_S = 3600.0
"""Views with no claim file and blobs younger than this are left (written by a Warren that
predates claims, or by a sync in progress)."""
MAX_LISTING_BYTES = 64 * 1024**2
"""Bytes of `git ls-files` output read (names of about a million files)."""
GIT_WALL_S = 30.0
"""Seconds `git ls-files` may take."""
RACY_NS = 2_000_000_000
"""A file whose ctime lies less than this (2 s) before a build started is read again by the
next build: a write right after it was read, within the file system's timestamp granularity,
would leave its stat unchanged (git's "racy clean" problem)."""

SECRET_NAMES = (".env", ".env.*")
"""File names (shell patterns, any directory) never put in a snapshot: dotenv files."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SECRET_NAME = re.compile("|".join(fnmatch.translate(p) for p in SECRET_NAMES) or "(?!)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class SnapshotError(WarrenError):
    """A snapshot that cannot be built, read or unpacked; the message says why (which file,
    which cap) in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SnapshotEntry(BaseModel):
    """One name of the workspace as a snapshot holds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    """Relative to the workspace, parts joined by `/`: never absolute, never `.`, `..`, an
    empty part or a `.git` part."""
    kind: Literal["file", "link", "dir"]
    digest: str | None = None
    """A file's sha256 (hex) of its bytes; None for a link or directory."""
    size: int = 0
    """A file's size in bytes; 0 otherwise."""
    executable: bool = False
    """Whether a file has its owner's execute bit (the view gives it 0755, else 0644)."""
    target: str | None = None
    """A link's target text, as `readlink` gave it (never followed); None otherwise."""

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        _check_path(value)
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> SnapshotEntry:
        if self.kind == "file":
            if self.digest is None or not _SHA256.fullmatch(self.digest) or self.size < 0:
                raise ValueError(f"file {self.path!r} needs a sha256 digest and a size")
        elif self.digest is not None or self.size != 0 or self.executable:
            raise ValueError(f"{self.kind} {self.path!r} has no digest, size or execute bit")
        if (self.kind == "link") != (self.target is not None) or "\0" in (self.target or ""):
            raise ValueError(f"{self.path!r}: a link, and only a link, has a target")
        return self


class Manifest(BaseModel):
    """A workspace state: its entries, sorted by path, and an id derived from them alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    """sha256 (hex) over the entries (`entries_id`): the same tree has the same id, whatever
    its root or when it was built."""
    root: str
    """The coordinator's workspace path (what tool paths name; the node mounts the view
    there)."""
    entries: tuple[SnapshotEntry, ...]
    """Sorted by path; each entry's parent directory is itself an entry."""

    @classmethod
    def of(cls, root: str, entries: Iterable[SnapshotEntry]) -> Manifest:
        """The manifest of these entries (in any order) with its id.

        **Errors:** `ValueError` as the model's validation raises it.
        """
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        _check_tree(ordered)
        # Validated above: constructing would check the tree and hash the entries again.
        return cls.model_construct(id=entries_id(ordered), root=root, entries=ordered)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        _check_tree(self.entries)
        if self.id != entries_id(self.entries):
            raise ValueError("manifest id does not match its entries")
        return self


def _check_path(path: str) -> None:
    """**Errors:** `ValueError` unless `path` is relative, without `.`, `..`, `.git` or
    empty parts, and without a NUL."""
    if not path or "\0" in path or any(p in ("", ".", "..", ".git") for p in path.split("/")):
        raise ValueError(
            f"snapshot path {path!r} must be relative, without '.', '..', '.git' or empty parts"
        )


def _check_tree(entries: Sequence[SnapshotEntry]) -> None:
    """Sorted by path, each once, each in a directory that is itself an entry.

    **Errors:** `ValueError` naming the first entry that is not.
    """
    kinds: dict[str, str] = {}
    previous = ""
    for entry in entries:
        if entry.path <= previous:
            raise ValueError(f"manifest entries not sorted or repeated at {entry.path!r}")
        previous = entry.path
        kinds[entry.path] = entry.kind
    for entry in entries:
        parent = entry.path.rpartition("/")[0]
        if parent and kinds.get(parent) != "dir":
            raise ValueError(f"{entry.path!r} lies in {parent!r}, which is no directory entry")


def entries_id(entries: Iterable[SnapshotEntry]) -> str:
    """The id of a manifest with these entries: sha256 over them in path order, one line
    of NUL-separated fields each (no path or target holds a NUL)."""
    lines = [
        f"{e.path}\0{e.kind}\0{e.digest or ''}\0{e.size}\0{int(e.executable)}\0"
        f"{'' if e.target is None else 'T' + e.target}\n"
        for e in sorted(entries, key=lambda e: e.path)
    ]
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


# -- coordinator side ------------------------------------------------------------------------

_Stamp = tuple[int, int, int, int, int, int]
"""(dev, inode, size, mtime_ns, ctime_ns, mode): a file with the same stamp is not read again."""


def _stamp(info: os.stat_result) -> _Stamp:
    return (
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
        info.st_mode,
    )


class SnapshotBuilder:
    """Builds the manifests of one workspace for one session, and serves their blobs.

    One build at a time (a lock); `read_blob` between builds. Keeps each file's stat and
    digest from the last build, so a build reads only the files that changed since.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        read_denied: Callable[[str], bool] | None,
        deny_read: Sequence[str] = (),
        host: SandboxHost | None = None,
        sandboxed: bool = True,
    ) -> None:
        """`read_denied`: the policy's `Read` deny rules (`SessionPolicy.read_denied`, an
        absolute path -> is it covered; None: no rule). `deny_read`: the policy's `[sandbox]
        deny_read` paths, masked by the floor like its defaults. `host`: the session's sandbox
        host (detected on first use when None). `sandboxed`: False only when the user turned
        the floor off; git then runs here, with its code-running settings disabled."""
        self.workspace = workspace
        self._top = Path(os.path.realpath(workspace))
        self._read_denied = read_denied
        self._deny_read = tuple(deny_read)
        self._host = host
        self._sandboxed = sandboxed
        self._known: dict[str, tuple[_Stamp, SnapshotEntry]] = {}
        """Each file of the last build: its stat then, and its entry."""
        self._blobs: dict[str, str] = {}
        """digest -> a path holding it, in the last manifest."""
        self._lock = trio.Lock()
        self.reads = 0
        """Files read and hashed by all builds so far (a file with an unchanged stat is not)."""

    async def build(self) -> Manifest:
        """The workspace now, as a manifest (see the module docstring for what it holds).

        **Cancellation:** git's sandbox is killed; a walk under way finishes first (it is
        bounded by `MAX_ENTRIES` and `MAX_TOTAL_BYTES`).

        **Errors:** `SnapshotError`: git failed (a `.git` exists but git sees no repository
        there, or cannot run in the sandbox), a cap was
        passed, a file kept changing while it was read, or the floor cannot be set up.
        """
        async with self._lock:
            listed = await self._listed()
            return await trio.to_thread.run_sync(self._scan, listed)

    def read_blob(self, digest: str) -> bytes:
        """The bytes of a file of the last manifest whose sha256 is `digest`, read again
        without following links and checked against `digest`. Blocking: call it in a thread.

        **Errors:** `SnapshotError` when no file of the last manifest has that digest, or the
        file changed since (build again).
        """
        rel = self._blobs.get(digest)
        if rel is None:
            raise SnapshotError(f"no file of the last snapshot has the digest {digest}")
        try:
            parent = open_parent(self._top, rel)
            if parent is None:
                raise FileNotFoundError(rel)
            dir_fd, name = parent
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                data = (
                    read_unchanged_at(dir_fd, name, info, MAX_FILE_BYTES)
                    if stat.S_ISREG(info.st_mode)
                    else None
                )
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise SnapshotError(f"{rel} cannot be read again ({exc.strerror or exc})") from exc
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            raise SnapshotError(f"{rel} changed since the snapshot was built; build it again")
        return data

    # -- what git lists --------------------------------------------------------------------

    async def _listed(self) -> frozenset[str] | None:
        """The paths git lists relative to the workspace; None when no directory from it up
        to the home holds a `.git` (the only case where every file is taken)."""
        root = await trio.to_thread.run_sync(self._repository)
        if root is None:
            return None  # no repository by name: git need not even run
        argv = git_argv("ls-files", "-z", "--cached", "--others", "--exclude-standard")
        if self._sandboxed:
            code, out, err = await self._git_sandboxed(root, argv)
        else:
            code, out, err = await self._git_here(argv)
        if code != 0:
            # Not "every file" then: that would ship what the repository ignores (build
            # output, and the secrets many repositories keep in ignored files).
            line = err.decode("utf-8", "replace").strip().splitlines()[:1]
            raise SnapshotError(
                f"git ls-files failed in {self.workspace} (exit {code}), which lies in the "
                f"repository {root}: " + (line[0] if line else "no message")
            )
        names = (os.fsdecode(raw) for raw in out.split(b"\0"))
        # A name ending in `/` is a nested repository git does not enter.
        return frozenset(name for name in names if name and not name.endswith("/"))

    def _repository(self) -> Path | None:
        """The root of the repository holding the workspace, found by name (`.git`)."""
        root = memory_root(self._top)
        return root if os.path.lexists(root / ".git") else None

    async def _git_sandboxed(self, root: Path, argv: list[str]) -> tuple[int, bytes, bytes]:
        from sandbox.host import detect_host
        from sandbox.run import run_sandboxed

        try:
            if self._host is None:
                self._host = await detect_host()
            spec = await trio.to_thread.run_sync(_listing_spec, root, self._deny_read)
            done = await run_sandboxed(spec, argv, cwd=self._top, host=self._host)
        except (SandboxError, OSError) as exc:
            raise SnapshotError(f"git cannot run in the read-only sandbox: {exc}") from exc
        if done.timed_out or done.killed_by_limit is not None or done.output_truncated:
            why = done.killed_by_limit or ("time" if done.timed_out else "output")
            raise SnapshotError(f"git ls-files in {self.workspace} was stopped by its {why} limit")
        return done.exit_code, done.stdout, done.stderr

    async def _git_here(self, argv: list[str]) -> tuple[int, bytes, bytes]:
        try:
            with trio.fail_after(GIT_WALL_S):
                done = await trio.run_process(
                    argv,
                    cwd=self._top,
                    env=git_env(os.environ),
                    stdin=b"",
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
        except (OSError, trio.TooSlowError) as exc:
            raise SnapshotError(f"git ls-files in {self.workspace} failed: {exc}") from exc
        return done.returncode, done.stdout, done.stderr

    # -- reading the files -----------------------------------------------------------------

    def _scan(self, listed: frozenset[str] | None) -> Manifest:
        masked = self._masked()
        wanted_dirs = None if listed is None else _parents(listed)

        def enter(rel: str) -> bool:
            if wanted_dirs is not None and rel not in wanted_dirs:
                return False
            return not self._excluded(rel, masked)

        entries: list[SnapshotEntry] = []
        total = 0
        trusted_before = time.time_ns() - RACY_NS
        known: dict[str, tuple[_Stamp, SnapshotEntry]] = {}
        try:
            root_fd = os.open(self._top, _DIR_FLAGS)
        except OSError as exc:
            raise SnapshotError(f"the workspace {self.workspace} cannot be opened: {exc}") from exc
        try:
            for rel, name, info, dir_fd in walk(root_fd, enter=enter):
                if name == ".git" or stat.S_ISDIR(info.st_mode):
                    continue  # a `.git` file (a worktree's pointer) too; directories follow files
                if listed is not None and rel not in listed:
                    continue
                if self._excluded(rel, masked):
                    continue
                entry = self._entry(rel, name, info, dir_fd, known, trusted_before)
                if entry is None:
                    continue
                total += entry.size
                if total > MAX_TOTAL_BYTES:
                    raise SnapshotError(
                        f"the files of {self.workspace} hold more than {MAX_TOTAL_BYTES} bytes, "
                        f"the snapshot's total cap (MAX_TOTAL_BYTES; passed at {rel}): ignore "
                        "large files in .gitignore or deny reading them to leave them out"
                    )
                entries.append(entry)
                if len(entries) > MAX_ENTRIES:
                    raise SnapshotError(
                        f"{self.workspace} holds more than {MAX_ENTRIES} files, the snapshot's "
                        "cap (MAX_ENTRIES): ignore generated files in .gitignore"
                    )
        finally:
            os.close(root_fd)
        dirs = _parents(entry.path for entry in entries)
        entries += [SnapshotEntry(path=d, kind="dir") for d in dirs]
        manifest = Manifest.of(str(self.workspace), entries)
        self._known = known
        self._blobs = {e.digest: rel for rel, (_, e) in known.items() if e.digest is not None}
        return manifest

    def _entry(
        self,
        rel: str,
        name: str,
        info: os.stat_result,
        dir_fd: int,
        known: dict[str, tuple[_Stamp, SnapshotEntry]],
        trusted_before: int,
    ) -> SnapshotEntry | None:
        """The entry of one name the walk found; None for what is no file or link (a FIFO,
        device or socket is never opened) or an unreadable file. A file's stat and digest go
        into `known`, its stat made unusable when it changed after `trusted_before` (ns)."""
        for _ in range(3):
            if stat.S_ISLNK(info.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    return None
                return SnapshotEntry(path=rel, kind="link", target=target)
            if not stat.S_ISREG(info.st_mode):
                return None
            if info.st_size > MAX_FILE_BYTES:
                raise SnapshotError(
                    f"{rel} holds {info.st_size} bytes, more than the snapshot's per-file cap "
                    f"of {MAX_FILE_BYTES} (MAX_FILE_BYTES): ignore it in .gitignore or deny "
                    "reading it to leave it out"
                )
            stamp = _stamp(info)
            old = self._known.get(rel)
            if old is not None and old[0] == stamp:
                known[rel] = old
                return old[1]
            try:
                data = read_unchanged_at(dir_fd, name, info, MAX_FILE_BYTES)
            except OSError:
                return None  # unreadable: the subagent could not read it either
            self.reads += 1
            if data is None:  # swapped or written since the listing: look again
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    return None
                continue
            entry = SnapshotEntry(
                path=rel,
                kind="file",
                digest=hashlib.sha256(data).hexdigest(),
                size=info.st_size,
                executable=bool(info.st_mode & stat.S_IXUSR),
            )
            if info.st_ctime_ns >= trusted_before:
                stamp = (-1, *stamp[1:])  # racy: matches no stat, read again next time
            known[rel] = (stamp, entry)
            return entry
        raise SnapshotError(f"{rel} kept changing while the snapshot read it; build it again")

    def _excluded(self, rel: str, masked: frozenset[str]) -> bool:
        """Whether a name is left out: the floor masks it, a `Read` deny rule covers it, or
        it is a dotenv file."""
        if rel in masked:
            return True
        if _SECRET_NAME.match(rel.rpartition("/")[2]):
            return True
        if self._read_denied is None:
            return False
        # As given and resolved: a rule may name either (`SessionPolicy` anchors rules at the
        # workspace it was given).
        return self._read_denied(str(self._top / rel)) or (
            self._top != self.workspace and self._read_denied(str(self.workspace / rel))
        )

    def _masked(self) -> frozenset[str]:
        """The paths below the workspace that the floor masks (its `deny_read` defaults and
        the policy's, at their resolved targets), relative to it."""
        spec = SandboxSpec(
            workspaces=(WorkspaceRoot(path=self._top, mode="ro"),),
            extra_deny_read=self._deny_read,
        )
        try:
            facts = gather_host_facts(spec)
        except SandboxError as exc:
            raise SnapshotError(f"the floor's masks for {self.workspace}: {exc}") from exc
        return frozenset(
            str(path.relative_to(self._top))
            for path in (*facts.deny_dirs, *facts.deny_files)
            if path.is_relative_to(self._top) and path != self._top
        )


def _listing_spec(root: Path, deny_read: tuple[str, ...]) -> SandboxSpec:
    """Start-up context gathering's read-only sandbox (`context_spec`), with room for the
    names of a large repository and git's safe environment; a worktree's or submodule's real
    git directories (its `.git` a regular file: `linked_git_dirs`) bound read-only, since
    they may lie where the sandbox shows nothing (the hidden home, the host's /tmp)."""
    spec = context_spec(root, deny_read=deny_read)
    limits = spec.limits.model_copy(
        update={"output_bytes": MAX_LISTING_BYTES, "wall_time_s": GIT_WALL_S}
    )
    env = spec.env.model_copy(update={"values": {**spec.env.values, **git_env({})}})
    binds: tuple[Bind, ...] = ()
    dotgit = root / ".git"
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(dotgit).st_mode):
            dirs, _ = linked_git_dirs(dotgit)
            binds = tuple(
                Bind(path=d, mode="ro") for d in dirs if d.is_dir() and not d.is_relative_to(root)
            )
    return spec.model_copy(update={"limits": limits, "env": env, "extra_binds": binds})


def _parents(paths: Iterable[str]) -> frozenset[str]:
    """Every directory that holds one of `paths` (relative), the root excepted."""
    out: set[str] = set()
    for path in paths:
        parent = path.rpartition("/")[0]
        while parent and parent not in out:
            out.add(parent)
            parent = parent.rpartition("/")[0]
    return frozenset(out)


# -- node side -------------------------------------------------------------------------------

_ViewState = dict[str, list[object]]
"""Per view path: [digest, executable, dev, inode, size, mtime_ns, ctime_ns] of each file
written, so an unchanged one is recognised by its stat alone."""


@dataclass(frozen=True)
class NodeCollected:
    """What one collection of a node's cache did."""

    views: int = 0
    """Views removed: their actor is gone (however it ended)."""
    blobs: int = 0
    freed: int = 0
    """Blobs removed and the bytes they held (only when the cache was over its cap)."""
    kept: int = 0
    """Bytes of blobs left."""


class NodeCache:
    """A node's blobs (content-addressed, `root/blobs`) and the views it unpacks them into
    (`root/mounts/NAME`, one per actor).

    Plain blocking code: the Ray actor calls it from its own thread. One `sync_view` per view
    at a time. `root` (made 0700 when missing) and a view made by `sync_view` (0700) are
    private to this user.

    **Collection** (`collect`): blobs outlive sessions (a later one sends only what changed),
    so without one a node's disk fills with every workspace state it ever ran. An actor
    claims its view for its whole life (`claim_view`: a lock the kernel lets go of when the
    actor dies, however it dies), so a collection removes exactly the views no actor holds,
    and, when the blobs weigh more than their cap, every blob no claimed view holds. Syncs
    hold the cache shared (`using`) and a collection exclusively, never waiting: no blob goes
    between a sync's `missing` and its `sync_view`. A blob a node lost is sent again by the
    coordinator (`SnapshotShipper`).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.blobs = ContentStore(root / "blobs")
        self._states = root / "views"
        self.writes = 0
        """Files written into views so far (an unchanged file is not)."""

    def view_path(self, name: str) -> Path:
        """Where the view called `name` (one path component) lives."""
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise SnapshotError(f"not a view name: {name!r}")
        return self.root / "mounts" / name

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """A shared hold on the cache (a sync, a view being claimed): a collection waits for
        none and runs only while no one holds it."""
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def claim_view(self, view: Path) -> int:
        """Make `view` (0755, so the worker's sandbox user reads it) and claim it for as long
        as the returned descriptor stays open: hold it for the actor's life, then
        `release_view`. Call inside `using`.

        **Errors:** `OSError` from the file system.
        """
        view.mkdir(parents=True, exist_ok=True, mode=0o755)
        self._states.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self._claim_path(view), flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise
        return fd

    def release_view(self, view: Path, claim: int) -> None:
        """Remove `view` and what is kept about it, then let go of its claim."""
        try:
            self._remove_view(view)
        finally:
            os.close(claim)

    def collect_when_due(self) -> NodeCollected | None:
        """`collect` when the last one is older than `NODE_GC_INTERVAL_S` (a stat
        otherwise); never raises (a failed collection is tried again later)."""
        with contextlib.suppress(FileNotFoundError, OSError):
            if time.time() - (self.root / ".collected").stat().st_mtime < NODE_GC_INTERVAL_S:
                return None
        with contextlib.suppress(OSError, ValueError):
            return self.collect()
        return None

    def collect(
        self, *, max_bytes: int | None = None, grace_s: float = NODE_GC_GRACE_S
    ) -> NodeCollected | None:
        """Remove the views no actor claims (and their states), then, when the blobs weigh
        more than `max_bytes` (default: `WARREN_RAY_CACHE_MAX_BYTES`, else
        `NODE_CACHE_MAX_BYTES`), every blob no claimed view holds. None when someone holds
        the cache (`using`): nothing is done then.

        **Errors:** `OSError` from the file system.
        """
        if max_bytes is None:
            max_bytes = _max_cache_bytes()
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            young = time.time() - grace_s
            live: set[str] = set()
            removed_views = 0
            for view in self._views():
                if self._claimed(view, young):
                    live.update(
                        str(state[0])
                        for state in self._load_state(view).values()
                        if state and isinstance(state[0], str)
                    )
                    continue
                self._remove_view(view)
                removed_views += 1
            sizes = inventory(self.blobs.root)
            kept = sum(sizes.values())
            blobs = freed = 0
            if kept > max_bytes:
                blobs, freed = sweep(self.blobs.root, live, young)
                self.blobs = ContentStore(self.blobs.root)  # its pack index is stale now
                kept = sum(inventory(self.blobs.root).values())
            (self.root / ".collected").touch()
            return NodeCollected(views=removed_views, blobs=blobs, freed=freed, kept=kept)
        finally:
            os.close(fd)

    def _remove_view(self, view: Path) -> None:
        """`view` and what is kept about it (its state, its claim file)."""
        shutil.rmtree(view, ignore_errors=True)
        for path in (self._state_path(view), self._claim_path(view)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def unclaimed_views(self, *, grace_s: float = NODE_GC_GRACE_S) -> list[str]:
        """The names of the views no actor holds (what the next `collect` removes), sorted."""
        young = time.time() - grace_s
        return [view.name for view in self._views() if not self._claimed(view, young)]

    def _views(self) -> list[Path]:
        """The views of this node's actors, sorted (what is not a directory is no view)."""
        mounts = self.root / "mounts"
        views = sorted(mounts.iterdir()) if mounts.is_dir() else []
        return [view for view in views if not view.is_symlink() and view.is_dir()]

    def _claim_path(self, view: Path) -> Path:
        return self._state_path(view).with_suffix(".claim")

    def _claimed(self, view: Path, young: float) -> bool:
        """Whether an actor holds `view`; a view with no claim file (a Warren before claims,
        or an actor between making it and claiming it) counts as held while it is young."""
        try:
            fd = os.open(self._claim_path(view), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            try:
                return view.stat().st_mtime >= young
            except OSError:
                return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def missing(self, manifest: Manifest) -> list[str]:
        """The digests of the manifest's files this node lacks, sorted, each once."""
        digests = {e.digest for e in manifest.entries if e.digest is not None}
        return sorted(d for d in digests if not self.blobs.has(d))

    def add_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Keep each blob under its digest.

        **Errors:** `SnapshotError` when a blob's sha256 is not its digest: nothing is kept.
        """
        for digest, data in blobs.items():
            if hashlib.sha256(data).hexdigest() != digest:
                raise SnapshotError(f"a blob sent as {digest} has another sha256; refused")
        if not blobs:
            return
        with self.blobs.packing():
            for data in blobs.values():
                self.blobs.put(data)

    def sync_view(self, manifest: Manifest, view: Path) -> None:
        """Make `view` hold exactly the manifest's entries: files whose content or execute
        bit changed are written beside their name and renamed over it, what the manifest
        lacks (or holds as another kind, or a link with another target) is removed, links are
        made as links. Every name is reached from `view` down through `O_NOFOLLOW`
        directory descriptors, so a link planted in the view is replaced, never written
        through.

        **Errors:** `SnapshotError` when a blob is missing (`missing` first) or a name cannot
        be written; `view` may then be half-synced (a later sync repairs it).
        """
        for entry in manifest.entries:  # again: a manifest unpickled was never validated
            try:
                _check_path(entry.path)
            except ValueError as exc:
                raise SnapshotError(str(exc)) from exc
        # Private when made here: the workspace's files are the user's, not the node's other
        # users' (the worker runs as this user and reads it through its own mount).
        view.mkdir(parents=True, exist_ok=True, mode=0o700)
        states = self._load_state(view)
        touched = 0
        try:
            current = self._current(view)
            wanted = {entry.path: entry for entry in manifest.entries}
            stale = [
                rel
                for rel, (info, target) in current.items()
                if not _still(wanted.get(rel), info, target)
            ]
            # Deepest first, then shallowest first, so siblings come in a row and share
            # their directory's descriptor (`_Parents`).
            with _Parents(view) as parents:
                for rel in sorted(stale, key=lambda r: (-r.count("/"), r)):
                    _remove(*parents.of(rel), current.pop(rel)[0])
                    states.pop(rel, None)
                    touched += 1
            with _Parents(view) as parents:
                for entry in sorted(manifest.entries, key=lambda e: (e.path.count("/"), e.path)):
                    if entry.path in current and (
                        entry.kind != "file" or _unchanged(entry, current[entry.path][0], states)
                    ):
                        continue
                    states.pop(entry.path, None)
                    touched += 1
                    written = self._make(*parents.of(entry.path), entry)
                    if written is not None:
                        states[entry.path] = written
            for rel in [rel for rel in states if rel not in wanted]:
                del states[rel]
                touched += 1
        except OSError as exc:
            raise SnapshotError(f"the view {view} cannot be synced: {exc}") from exc
        finally:
            if touched:
                self._save_state(view, states)

    def _current(self, view: Path) -> dict[str, tuple[os.stat_result, str | None]]:
        """Every name in the view (its `.git` too) with its lstat and, for a link, target."""
        out: dict[str, tuple[os.stat_result, str | None]] = {}
        fd = os.open(view, _DIR_FLAGS | os.O_NOFOLLOW)
        try:
            for rel, name, info, dir_fd in walk(fd, skipped_dirs=frozenset()):
                target = None
                if stat.S_ISLNK(info.st_mode):
                    with contextlib.suppress(OSError):
                        target = os.readlink(name, dir_fd=dir_fd)
                out[rel] = (info, target)
        finally:
            os.close(fd)
        return out

    def _make(self, dir_fd: int, name: str, entry: SnapshotEntry) -> list[object] | None:
        """Make one entry as `name` in `dir_fd`; a file's state (`_ViewState`) when one was
        written."""
        match entry.kind:
            case "dir":
                os.mkdir(name, 0o755, dir_fd=dir_fd)
                return None
            case "link":
                os.symlink(entry.target or "", name, dir_fd=dir_fd)
                return None
            case "file":
                return self._write(dir_fd, name, entry)

    def _write(self, dir_fd: int, name: str, entry: SnapshotEntry) -> list[object]:
        assert entry.digest is not None
        data = self.blobs.get(entry.digest)
        if data is None:
            raise SnapshotError(f"this node lacks the blob of {entry.path} ({entry.digest})")
        temp = f".warren-sync-{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, 0o755 if entry.executable else 0o644)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        self.writes += 1
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return [entry.digest, entry.executable, *_stamp(info)[:5]]

    def _state_path(self, view: Path) -> Path:
        key = hashlib.sha256(os.fsencode(os.path.abspath(view))).hexdigest()[:32]
        return self._states / f"{key}.json"

    def _load_state(self, view: Path) -> _ViewState:
        try:
            data = json.loads(self._state_path(view).read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("view") != os.path.abspath(view):
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}

    def _save_state(self, view: Path, states: _ViewState) -> None:
        path = self._state_path(view)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temp.write_text(json.dumps({"view": os.path.abspath(view), "files": states}))
            os.replace(temp, path)


def _max_cache_bytes() -> int:
    raw = os.environ.get("WARREN_RAY_CACHE_MAX_BYTES", "")
    with contextlib.suppress(ValueError):
        if int(raw) >= 0:
            return int(raw)
    return NODE_CACHE_MAX_BYTES


class _Parents:
    """The descriptor of the directory of the last name asked for, opened from the view
    down with `O_NOFOLLOW` (`open_parent`) and kept while the next names share it."""

    def __init__(self, view: Path) -> None:
        self.view = view
        self._rel: str | None = None
        self._fd = -1

    def of(self, rel: str) -> tuple[int, str]:
        """(descriptor of `rel`'s directory, its last name).

        **Errors:** `SnapshotError` when that directory is missing; `OSError` when a name on
        the way is a link or no directory.
        """
        parent, _, name = rel.rpartition("/")
        if parent != self._rel:
            self.close()
            opened = open_parent(self.view, rel)
            if opened is None:
                raise SnapshotError(f"the view {self.view} lacks the directory of {rel}")
            self._fd, self._rel = opened[0], parent
        return self._fd, name

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._rel = -1, None

    def __enter__(self) -> _Parents:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _remove(dir_fd: int, name: str, info: os.stat_result) -> None:
    """Remove `name` from `dir_fd`: an (empty by now) directory or anything else."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)


def _still(entry: SnapshotEntry | None, info: os.stat_result, target: str | None) -> bool:
    """Whether a name found in a view may stay for `entry` (None: the manifest lacks it):
    the same kind, and for a link the same target (a file's content is checked later)."""
    if entry is None:
        return False
    match entry.kind:
        case "dir":
            return stat.S_ISDIR(info.st_mode)
        case "link":
            return stat.S_ISLNK(info.st_mode) and target == entry.target
        case "file":
            return stat.S_ISREG(info.st_mode)


def _unchanged(entry: SnapshotEntry, info: os.stat_result, states: _ViewState) -> bool:
    """Whether the view's file already holds `entry`: written by a sync with that digest and
    execute bit, and not touched since (the same stat)."""
    return states.get(entry.path) == [entry.digest, entry.executable, *_stamp(info)[:5]]
