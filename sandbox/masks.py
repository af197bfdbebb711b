"""Host facts: the impure step that turns a spec into plain paths the pure argv builder uses.

`bwrap_argv` must stay a pure, golden-tested function, yet masks depend on the host: whether
`~/.ssh` exists, where a symlinked secret really lives, which component of a missing
`.git/hooks` is the first one missing, whether `.git` is a worktree pointer. This module looks
once and returns a frozen `HostFacts`; nothing else in the package inspects the file system
for masks.

Rules it implements (each pinned by tests/sandbox/test_masks.py):

- A secret (deny-read) that exists is masked at its resolved target: a directory by an empty
  read-only tmpfs, a file by a `nodev` bind of /dev/null (opening it fails with EACCES).
- A protected path under a writable root that exists is bound read-only onto itself at its
  resolved target; a missing one gets no mount (nothing is created in the user's tree): it
  is listed in `watched`, and `sandbox.guard` undoes its creation.
- Every directory between a writable root and a masked path is bound onto itself (a "pin"):
  a mount point cannot be renamed, so `mv .git .git2 && mkdir -p .git/hooks` fails with EBUSY
  instead of planting a hook.
- Paths outside every writable root need no protection (the root is read-only); paths in
  the sandbox's private /tmp, /dev or /proc are not the host's and are skipped.
- The home is hidden (`hide_home`): an empty read-only tmpfs over it, then, read-only, the
  `home_allow` paths that exist, the Python runtime, and a sanitised copy of the user's git
  configuration (no credential helpers, URL rewrites, extra headers, includes, fsmonitor,
  hooks); workspaces and binds under the home keep their own mode. A workspace that *is* the
  home leaves it visible (the secret masks still apply).
- Warren's own code (`own_code`: its packages and the virtualenv it runs from) lying inside a
  writable root is bound read-only over it: a sandbox must not change what the coordinator
  imports at its next start.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox.env import build_env
from sandbox.errors import SandboxConfigError
from sandbox.git_safety import code_running_keys
from sandbox.spec import Mode, ProtectedPath, SandboxSpec

__all__ = [
    "BindMount",
    "HostFacts",
    "gather_host_facts",
    "linked_git_dirs",
    "python_runtime_paths",
    "resolve_home",
    "sanitise_gitconfig",
    "warren_code_paths",
]

_PRIVATE_IN_SANDBOX = (Path("/tmp"), Path("/dev"), Path("/proc"))
"""Mount points the sandbox replaces with its own: host paths below them are invisible."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BindMount(_Frozen):
    """A workspace or extra bind, at its resolved host path."""

    path: Path
    mode: Mode
    label: str
    """The spec field it came from (`workspaces[0]`), for error messages."""
    source: Path | None = None
    """The host directory shown at `path` (`WorkspaceRoot.source`); None: `path` itself."""


class HostFacts(_Frozen):
    """Everything `bwrap_argv` needs to know about the host, as plain values."""

    home: Path
    binds: tuple[BindMount, ...]
    pins: tuple[Path, ...]
    """Directories bound onto themselves read-write so they cannot be renamed away."""
    protected: tuple[Path, ...]
    """Existing protected paths, bound onto themselves read-only."""
    deny_dirs: tuple[Path, ...]
    """Directories hidden under an empty read-only tmpfs."""
    deny_files: tuple[Path, ...]
    """Files hidden under a /dev/null bind."""
    watched: tuple[Path, ...] = ()
    """Missing protected paths inside writable roots: not mounted, their creation is undone
    by `sandbox.guard`."""
    env: tuple[tuple[str, str], ...]
    home_mask: Path | None = None
    """The home, hidden under an empty read-only tmpfs (None: the home stays visible)."""
    file_binds: tuple[tuple[Path, Path], ...] = ()
    """(host source, path inside) files bound read-only into the hidden home (the sanitised
    git configuration)."""
    warnings: tuple[str, ...] = ()
    """Things that weaken the floor but do not stop it (a protected path that is a symlink)."""


def python_runtime_paths() -> tuple[Path, ...]:
    """Where this interpreter and everything it imports live (prefixes and `sys.path`).

    Warren's sandboxes mostly run Warren's own Python (tool hosts, workers, the probe); CI and
    users may keep that virtualenv under /tmp, which every sandbox replaces with its own.
    """
    candidates = {
        sys.prefix,
        sys.exec_prefix,
        sys.base_prefix,
        sys.base_exec_prefix,
        *(entry for entry in sys.path if entry),
    }
    return tuple(sorted({Path(c) for c in candidates if Path(c).is_absolute()}))


def warren_code_paths() -> tuple[Path, ...]:
    """Where the code the coordinator imports lives: Warren's four packages (side by side in
    one distribution) and, when it runs from a virtualenv, that virtualenv."""
    root = Path(__file__).resolve().parents[1]
    out = [root / name for name in ("sandbox", "policies", "orchestrator", "workers")]
    if sys.prefix != sys.base_prefix:
        out.append(Path(sys.prefix))
    return tuple(p for p in out if p.exists())


def resolve_home(spec: SandboxSpec, environ: Mapping[str, str]) -> Path:
    """The spec's home, else `$HOME`, else the password database entry of our uid."""
    if spec.home is not None:
        return spec.home
    home = environ.get("HOME")
    if home and Path(home).is_absolute():
        return Path(home)
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def gather_host_facts(
    spec: SandboxSpec,
    *,
    environ: Mapping[str, str] | None = None,
    executables: Sequence[Path] = (),
    runtime: Sequence[Path] = (),
    nested: Sequence[Path] = (),
    own_code: Sequence[Path] = (),
    scratch: Path | None = None,
) -> HostFacts:
    """Look at the host once and return what the sandbox's mounts and environment will be.

    `executables` are host binaries we will run outside the sandbox (bwrap, prlimit): one
    inside a writable root could be replaced by the sandbox and run by us later, so that is
    refused.

    `runtime` are host paths the sandboxed program needs to run at all (our Python and its
    imports, `python_runtime_paths()`): any of them the sandbox would hide (a virtualenv under
    /tmp, which the sandbox replaces, or one in the hidden home) is bound read-only at its own
    path.

    `own_code` are Warren's packages and virtualenv (`warren_code_paths()`): any inside a
    writable root is bound read-only. `scratch` is a host directory of ours where the
    sanitised git configuration is written (None: no git configuration in a hidden home).

    `nested` are existing protected paths below the roots' top level (found by
    `sandbox.guard.survey`): each is bound read-only like a top-level one.

    Errors: `SandboxConfigError` for a missing workspace or bind, a root inside a masked
    secret, an executable inside a writable root, or Warren's code being a writable root.
    """
    env_map = os.environ if environ is None else environ
    home = resolve_home(spec, env_map)
    builder = _FactsBuilder(spec, home, env_map)
    builder.hide_home(scratch)
    builder.add_runtime(runtime)
    builder.protect_own_code(own_code)
    builder.check_executables(executables)
    builder.add_protected()
    for path in nested:
        builder.protect_nested(path)
    builder.add_deny_read()
    return builder.build()


class _FactsBuilder:
    def __init__(self, spec: SandboxSpec, home: Path, environ: Mapping[str, str]) -> None:
        self.spec = spec
        self.home = home
        self.environ = environ
        self.binds = self._resolve_binds()
        self.pins: set[Path] = set()
        self.protected: set[Path] = set()
        self.protected_dirs: set[Path] = set()
        self.deny_dirs: set[Path] = set()
        self.deny_files: set[Path] = set()
        self.watched: set[Path] = set()
        self.warnings: list[str] = []
        self.home_mask: Path | None = None
        self.own_code: list[Path] = []
        self.file_binds: list[tuple[Path, Path]] = []

    def _resolve_binds(self) -> list[BindMount]:
        binds: dict[Path, BindMount] = {}
        entries: list[tuple[str, Path, Mode]] = []
        for i, root in enumerate(self.spec.workspaces):
            label = f"workspaces[{i}]"
            if root.source is None:
                entries.append((label, root.path, root.mode))
                continue
            if not root.source.is_dir():
                raise SandboxConfigError(
                    f"{label}: {root.source} is not a directory", fields=(label,)
                )
            # `path` names a place inside the sandbox: on this host it need not exist.
            inside = Path(os.path.normpath(root.path))
            binds[inside] = BindMount(
                path=inside, mode="ro", label=label, source=root.source.resolve()
            )
        entries += [
            (f"extra_binds[{i}]", b.path, b.mode) for i, b in enumerate(self.spec.extra_binds)
        ]
        for label, path, mode in entries:
            if not path.exists():
                raise SandboxConfigError(f"{label}: {path} does not exist", fields=(label,))
            resolved = path.resolve()
            previous = binds.get(resolved)
            if previous is not None and previous.mode != mode:
                raise SandboxConfigError(
                    f"{previous.label} and {label} both resolve to {resolved}, "
                    f"one {previous.mode!r} and one {mode!r}",
                    fields=(previous.label, label),
                )
            binds.setdefault(resolved, BindMount(path=resolved, mode=mode, label=label))
        return list(binds.values())

    # -- where a host path ends up inside the sandbox ------------------------------------

    def _covering_bind(self, path: Path) -> BindMount | None:
        best: BindMount | None = None
        for bind in self.binds:
            if _within(path, bind.path) and (
                best is None or len(bind.path.parts) > len(best.path.parts)
            ):
                best = bind
        return best

    def writable_root(self, path: Path) -> Path | None:
        """The writable bind whose contents `path` is part of, or None if read-only there."""
        bind = self._covering_bind(path)
        if bind is None or bind.mode != "rw" or bind.path == path:
            return None
        return bind.path

    def visible(self, path: Path) -> bool:
        if self._covering_bind(path) is not None:
            return True
        if self.home_mask is not None and _within(path, self.home_mask):
            return False
        return not any(_within(path, private) for private in _PRIVATE_IN_SANDBOX)

    # -- the hidden home -----------------------------------------------------------------

    def hide_home(self, scratch: Path | None) -> None:
        if not self.spec.hide_home:
            return
        home = Path(os.path.realpath(self.home))
        if home == Path("/") or any(_within(home, p) for p in _PRIVATE_IN_SANDBOX):
            return
        if any(bind.path == home or _within(home, bind.path) for bind in self.binds):
            return  # the home is (inside) a workspace: it must stay as the workspace shows it
        if not home.is_dir():
            return
        self.home_mask = home
        for i, pattern in enumerate(self.spec.all_home_allow):
            for path in self._expand(pattern):
                if not os.path.lexists(path):
                    continue
                target = path.resolve()
                if target.exists() and _within(target, home) and target != home:
                    self.binds.append(BindMount(path=target, mode="ro", label=f"home_allow[{i}]"))
        if scratch is not None:
            for name in (Path(".gitconfig"), Path(".config/git/config")):
                source = home / name
                if os.path.isfile(source):
                    copy = sanitise_gitconfig(source, scratch)
                    if copy is not None:
                        self.file_binds.append((copy, source))

    # -- Warren's own code -----------------------------------------------------------------

    def protect_own_code(self, paths: Sequence[Path]) -> None:
        for path in paths:
            target = path.resolve()
            bind = self._covering_bind(target)
            if bind is None or bind.mode != "rw":
                continue
            if bind.path == target:
                raise SandboxConfigError(
                    f"{bind.label} ({bind.path}) is Warren's own code; a sandbox writing it "
                    "would change what Warren runs next. Use another workspace.",
                    fields=(bind.label,),
                )
            self._pin_between(bind.path, target)
            self.protected.add(target)
            self.own_code.append(target)
            if target.is_dir():
                self.protected_dirs.add(target)

    def add_runtime(self, paths: Sequence[Path]) -> None:
        for i, path in enumerate(paths):
            resolved = path.resolve()
            if resolved.exists() and not self.visible(resolved):
                self.binds.append(BindMount(path=resolved, mode="ro", label=f"runtime[{i}]"))

    # -- executables ---------------------------------------------------------------------

    def check_executables(self, executables: Sequence[Path]) -> None:
        for exe in executables:
            resolved = exe.resolve()
            bind = self._covering_bind(resolved)
            if any(_within(resolved, code) for code in self.own_code):
                continue  # inside Warren's own code, which is bound read-only
            if bind is not None and bind.mode == "rw":
                raise SandboxConfigError(
                    f"{exe} lies inside the writable {bind.label} ({bind.path}); a sandboxed "
                    "process could replace it and we would run it outside the sandbox. "
                    "Install Warren outside the workspace.",
                    fields=(bind.label,),
                )

    # -- protected paths ---------------------------------------------------------------

    def add_protected(self) -> None:
        entries = self.spec.all_protected
        absolute = [e for e in entries if Path(e.path).is_absolute()]
        relative = [e for e in entries if not Path(e.path).is_absolute()]
        for entry in absolute:
            self._protect(Path(entry.path), entry)
        for bind in self.binds:
            if bind.mode == "rw":
                for path, entry in self._candidates(bind.path, relative):
                    self._protect(path, entry)

    def _candidates(
        self, root: Path, entries: Sequence[ProtectedPath]
    ) -> list[tuple[Path, ProtectedPath]]:
        dotgit = root / ".git"
        git_dirs = [dotgit]
        out: list[tuple[Path, ProtectedPath]] = []
        if dotgit.is_file():
            # A worktree or submodule: `.git` is a pointer, and the hooks and config that
            # git will run live in its gitdir and common dir. The pointer itself is protected
            # so it cannot be redirected at a gitdir the sandbox wrote.
            out.append((dotgit, ProtectedPath(path=".git", stub="file")))
            git_dirs, warning = linked_git_dirs(dotgit)
            if warning is not None:
                self.warnings.append(warning)
        for entry in entries:
            if entry.path.startswith(".git/"):
                rest = entry.path.removeprefix(".git/")
                out.extend((git_dir / rest, entry) for git_dir in git_dirs)
            else:
                out.append((root / entry.path, entry))
        return out

    def protect_nested(self, path: Path) -> None:
        if os.path.lexists(path) and not path.is_symlink():
            root = self.writable_root(path)
            if root is not None:
                self._pin_between(root, path)
                self.protected.add(path)
                if path.is_dir():
                    self.protected_dirs.add(path)

    def _protect(self, path: Path, entry: ProtectedPath) -> None:
        if os.path.lexists(path) and path.exists():
            target = path.resolve()
            root = self.writable_root(target)
            if root is None:
                return
            if path.is_symlink():
                self.warnings.append(
                    f"protected path {path} is a symlink: its target {target} is read-only, "
                    "but the link itself can be replaced"
                )
            self._pin_between(root, target)
            self.protected.add(target)
            if target.is_dir():
                self.protected_dirs.add(target)
            return
        missing = _first_missing(path.resolve())
        root = self.writable_root(missing)
        if root is None:
            return
        self._pin_between(root, missing)
        self.watched.add(path.resolve())

    def _pin_between(self, root: Path, target: Path) -> None:
        for ancestor in target.parents:
            if ancestor == root or not _within(ancestor, root):
                break
            self.pins.add(ancestor)

    # -- secrets -------------------------------------------------------------------------

    def add_deny_read(self) -> None:
        for pattern in self.spec.all_deny_read:
            for path in self._expand(pattern):
                self._deny(pattern, path)

    def _expand(self, pattern: str) -> list[Path]:
        bases = [pattern]
        if pattern.startswith("~"):
            bases = [str(self.home) + pattern[1:]]
        elif pattern.startswith("{config}"):
            bases = [
                str(d) + pattern.removeprefix("{config}")
                for d in _xdg(self.environ, "XDG_CONFIG_HOME", self.home / ".config")
            ]
        elif pattern.startswith("{state}"):
            bases = [
                str(d) + pattern.removeprefix("{state}")
                for d in _xdg(self.environ, "XDG_STATE_HOME", self.home / ".local" / "state")
            ]
        out: list[Path] = []
        for base in bases:
            path = Path(base)
            if not path.is_absolute():
                raise SandboxConfigError(
                    f"deny_read pattern {pattern!r} is not absolute after expansion",
                    fields=("deny_read",),
                )
            if any(ch in path.name for ch in "*?["):
                out.extend(sorted(path.parent.glob(path.name)))
            else:
                out.append(path)
        return out

    def _deny(self, pattern: str, path: Path) -> None:
        if (
            self.home_mask is not None
            and _within(path, self.home_mask)
            and self._covering_bind(path) is None
            and not os.path.islink(path)
        ):
            return  # already hidden with the home (a link is still masked at its target)
        if not os.path.lexists(path):
            self._deny_missing(path)
            return
        target = path.resolve()
        if not target.exists():
            self._deny_missing(target)
            return
        for bind in self.binds:
            if _within(bind.path, target):
                raise SandboxConfigError(
                    f"{bind.label} ({bind.path}) lies inside the masked secret {target} "
                    f"(deny_read {pattern!r}); bind something else or drop the pattern",
                    fields=(bind.label, "deny_read"),
                )
        if not self.visible(target):
            return
        root = self.writable_root(target)
        if root is not None:
            self._pin_between(root, target)
        if target.is_dir():
            self.deny_dirs.add(target)
        else:
            self.deny_files.add(target)

    def _deny_missing(self, path: Path) -> None:
        # A missing secret only matters where the sandbox could create it (a writable root
        # containing the home): there it is watched like a missing protected path.
        self._protect(path, ProtectedPath(path=str(path)))

    # -- result --------------------------------------------------------------------------

    def build(self) -> HostFacts:
        def covered(path: Path) -> bool:
            return any(parent in self.protected_dirs for parent in path.parents)

        protected = {p for p in self.protected if not covered(p)}
        pins = {p for p in self.pins if not covered(p) and p not in protected}
        watched = {p for p in self.watched if not covered(p)}
        return HostFacts(
            home=self.home,
            binds=tuple(self.binds),
            pins=_ordered(pins),
            protected=_ordered(protected),
            deny_dirs=_ordered(self.deny_dirs),
            deny_files=_ordered(self.deny_files),
            watched=_ordered(watched),
            env=build_env(self.spec.env, self.environ, home=self.home),
            warnings=tuple(self.warnings),
            home_mask=self.home_mask,
            file_binds=tuple(self.file_binds),
        )


_GIT_SECTIONS_KEPT = frozenset(
    {
        "user",
        "init",
        "core",
        "color",
        "alias",
        "pull",
        "push",
        "merge",
        "rebase",
        "diff",
        "log",
        "format",
        "status",
        "branch",
        "advice",
        "grep",
        "pretty",
        "column",
        "help",
        "rerere",
        "commit",
        "tag",
        "fetch",
        "blame",
        "apply",
        "feature",
        "safe",
    }
)
"""git configuration sections copied into a hidden home; everything else (`credential`,
`http`, `url` with tokens in rewrites, `include`/`includeIf`, `remote`, `sendemail`, ...) is
dropped."""

_GIT_KEYS_DROPPED = code_running_keys() | {"commit.gpgsign", "tag.gpgsign"}
"""Keys dropped from kept sections: they run programs (`sandbox.git_safety`, the one list) or
need secrets the sandbox lacks."""


def sanitise_gitconfig(source: Path, scratch: Path) -> Path | None:
    """A copy of the git configuration at `source` with only `_GIT_SECTIONS_KEPT` (minus
    `_GIT_KEYS_DROPPED`), written once per distinct content under `scratch` (atomically).
    None when the file cannot be read or written."""
    try:
        with open(source, "rb") as file:
            data = file.read(1 << 20)
    except OSError:
        return None
    digest = hashlib.sha256(data).hexdigest()[:20]
    target = scratch / f"gitconfig-{digest}"
    if target.is_file():
        return target
    kept: list[str] = []
    section = ""
    keep_section = False
    keep_line = False
    continued = False
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if continued:  # the rest of a value whose line ended in a backslash
            continued = line.endswith("\\")
            if keep_line:
                kept.append(raw)
            continue
        if line.startswith("["):
            head = line[1 : line.find("]")] if "]" in line else line[1:]
            section = head.split(None, 1)[0].split(".", 1)[0].strip().lower() if head else ""
            keep_section = section in _GIT_SECTIONS_KEPT and '"' not in head
            if keep_section:
                kept.append(f"[{section}]")
            continue
        if not line or line[0] in "#;":
            continue
        key = line.split("=", 1)[0].strip().lower()
        keep_line = keep_section and f"{section}.{key}" not in _GIT_KEYS_DROPPED
        continued = line.endswith("\\")
        if keep_line:
            kept.append(raw)
    text = "\n".join(kept) + "\n"
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=scratch, prefix=".gitconfig-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError:
        return None
    return target


def linked_git_dirs(dotgit: Path) -> tuple[list[Path], str | None]:
    """The real git directories of a worktree or submodule whose `.git` is a file (a
    `gitdir:` pointer): its gitdir and, when it has one, its common dir, resolved; and a
    warning when the pointer cannot be read (then no directory)."""
    try:
        text = dotgit.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return [], f"cannot read {dotgit}: {exc}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    if not first.startswith("gitdir:"):
        return [], f"{dotgit} is a file without a `gitdir:` line"
    gitdir = (dotgit.parent / first.removeprefix("gitdir:").strip()).resolve()
    dirs = [gitdir]
    commondir_file = gitdir / "commondir"
    warning = None
    if commondir_file.is_file():
        try:
            common = commondir_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError as exc:
            warning = f"cannot read {commondir_file}: {exc}"
        else:
            dirs.append((gitdir / common).resolve())
    return list(dict.fromkeys(dirs)), warning


def _within(path: Path, root: Path) -> bool:
    """`path.is_relative_to(root)`, without the cost of pathlib's version (hot here)."""
    parts = root.parts
    return path.parts[: len(parts)] == parts


def _first_missing(path: Path) -> Path:
    """The first component of `path` (already resolved, so no links on the way) that does not
    exist. Walks up: usually only the leaf is missing."""
    missing = path
    for ancestor in path.parents:
        if os.path.lexists(ancestor):
            break
        missing = ancestor
    return missing


def _xdg(environ: Mapping[str, str], var: str, default: Path) -> list[Path]:
    value = environ.get(var, "")
    dirs = [Path(value)] if value and Path(value).is_absolute() else []
    return list(dict.fromkeys([*dirs, default]))


def _depth_key(path: Path) -> tuple[int, str]:
    return (len(path.parts), str(path))


def _ordered(paths: set[Path]) -> tuple[Path, ...]:
    return tuple(sorted(paths, key=_depth_key))
