"""What one sandbox may see and do: `SandboxSpec`, a frozen value with the floor's defaults.

The policy layer builds a spec per call (read-only for auto-approved reads, writable for edits),
the tool host and the worker pool build one per process. Nothing here touches the host: paths
are taken as given and resolved later by `sandbox.masks.gather_host_facts`, and the bwrap argv
is derived by the pure `sandbox.argv.bwrap_argv`.

Path patterns in `deny_read` use three expansions, resolved against the host at start-up:
`~` (the spec's home), `{config}` (`$XDG_CONFIG_HOME` and `~/.config`, both when they differ)
and `{state}` (`$XDG_STATE_HOME` and `~/.local/state`); a shell glob (`*`) in the last part
matches existing files only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

__all__ = [
    "DEFAULT_DENY_READ",
    "DEFAULT_ENV_ALLOW",
    "DEFAULT_ENV_SCRUB",
    "DEFAULT_HOME_ALLOW",
    "DEFAULT_PROTECTED",
    "Bind",
    "EnvPolicy",
    "LimitName",
    "Limits",
    "Mode",
    "NetworkMode",
    "ProtectedPath",
    "SandboxSpec",
    "WorkspaceRoot",
]

Mode = Literal["ro", "rw"]
"""How a bound host path appears inside the sandbox: read-only or read-write."""

NetworkMode = Literal["off", "host"]
"""`off`: a private network namespace with nothing but loopback (every tool, hook and worker).
`host`: the host's network namespace, for an MCP server whose policy says `network = true`."""

LimitName = Literal["wall_time", "output", "processes", "memory", "cpu_time", "file_size"]
"""The limits a sandbox can be stopped by (`SandboxResult.killed_by_limit`)."""

_GiB = 1024**3
_MiB = 1024**2


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _absolute(what: str) -> AfterValidator:
    """Refuses a relative path, naming it as `what` in the message."""

    def check(value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{what} must be absolute, got {value}")
        return value

    return AfterValidator(check)


class WorkspaceRoot(_Frozen):
    """A host directory bound into the sandbox at the same path (or `source` shown at `path`)."""

    path: Annotated[Path, _absolute("workspace path")]
    """Absolute host path of the directory. Required; it must exist when the sandbox starts
    (unless `source` is set: then it is where `source` appears inside)."""
    mode: Mode = "rw"
    """`rw` lets the sandbox write (except protected paths), `ro` refuses every write. Default
    `rw`; auto-approved read-only commands get `ro`."""
    source: Annotated[Path, _absolute("workspace path")] | None = None
    """A host directory shown read-only at `path` inside (a remote worker's snapshot of the
    coordinator's workspace, workers/remote/actor.py), so tools name the user's paths.
    Default None: `path` itself. Only with `mode = "ro"`: protected paths and the guard work
    on host paths, which a root shown elsewhere does not have."""

    @model_validator(mode="after")
    def _source_read_only(self) -> WorkspaceRoot:
        if self.source is not None and self.mode != "ro":
            raise ValueError("a workspace root with a `source` must have mode 'ro'")
        return self


class Bind(_Frozen):
    """An extra host path bound at the same path (a toolchain cache, a shared gitdir...)."""

    path: Annotated[Path, _absolute("bind path")]
    """Absolute host path (file or directory). Required; it must exist when the sandbox
    starts."""
    mode: Mode = "ro"
    """`ro` (default) or `rw`. Protected paths apply inside `rw` binds as in workspaces."""


class ProtectedPath(_Frozen):
    """A path that stays read-only inside every writable root, whether it exists or not.

    A missing one is masked at its first missing component with a host stub (see
    `sandbox.stubs`), so it cannot be created either.
    """

    path: str
    """Relative to each writable root (`.git/hooks`), or absolute. Entries starting with
    `.git/` are applied to the root's real git directories: for a worktree or submodule whose
    `.git` is a file, to its gitdir and common dir, and the `.git` file itself is protected."""
    stub: Literal["dir", "file"] = "dir"
    """What to create on the host when the path is missing. Default `dir`: an empty directory
    is invisible to git (it never shows up as untracked) and makes writes fail with EISDIR."""
    stub_content: str = ""
    """Content of a `file` stub (must be valid for whoever reads it: `.git/commondir` gets
    `.`, which points git back at the same directory). Default empty."""


DEFAULT_PROTECTED: tuple[ProtectedPath, ...] = (
    ProtectedPath(path=".git/hooks"),
    ProtectedPath(path=".git/config", stub="file"),
    # git follows `commondir` even in a main repository: creating it redirects hooks and
    # config to a directory the sandbox controls (pinned by test_escape::git_commondir).
    ProtectedPath(path=".git/commondir", stub="file", stub_content="."),
    ProtectedPath(path=".git/config.worktree", stub="file"),
    ProtectedPath(path=".git/modules"),
    ProtectedPath(path=".warren"),
    ProtectedPath(path=".gitmodules"),
    ProtectedPath(path=".bashrc"),
    ProtectedPath(path=".bash_profile"),
    ProtectedPath(path=".bash_login"),
    ProtectedPath(path=".bash_logout"),
    ProtectedPath(path=".profile"),
    ProtectedPath(path=".zshrc"),
    ProtectedPath(path=".zshenv"),
    ProtectedPath(path=".zprofile"),
    ProtectedPath(path=".envrc"),
    ProtectedPath(path=".vscode"),
    ProtectedPath(path=".idea"),
    ProtectedPath(path=".github/workflows"),
    ProtectedPath(path=".gitlab-ci.yml"),
)
"""Files that run code outside the sandbox later (git hooks and config, shell rc files, direnv,
editor and CI configuration, Warren's own policy). Nested occurrences below the root (a
`sub/.envrc`) are not covered: finding them would mean walking the whole tree."""

DEFAULT_DENY_READ: tuple[str, ...] = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "{config}/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.pypirc",
    "~/.npmrc",
    "~/.git-credentials",
    "{config}/gh",
    "{config}/warren",
    "{state}/warren",
    "~/.vault-token",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.ray/auth_token",  # a Ray cluster's token (`ray get-auth-token --generate`)
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/ssh/*_key",
    # Root-owned secrets: with no capabilities, root inside can still read what root owns.
    "/etc/ssl/private",
    "/etc/wireguard",
    "/etc/letsencrypt",
    "/etc/NetworkManager/system-connections",
    "/etc/kubernetes",
    # Agent, bus and container sockets; unreachable anyway while AF_UNIX sockets are blocked.
    "/run/user",
    "/run/docker.sock",
)
"""Secrets masked from reads: directories become an empty read-only tmpfs, files a /dev/null
that cannot be opened (the bind is `nodev`). Symlinks are masked at their resolved target."""

DEFAULT_HOME_ALLOW: tuple[str, ...] = (
    # Language toolchains and version managers.
    "~/.pyenv",
    "~/.rbenv",
    "~/.nvm",
    "~/.volta",
    "~/.bun",
    "~/.deno",
    "~/.sdkman",
    "~/.rustup",
    "~/.cargo/bin",
    "~/.cargo/env",
    "~/.cargo/registry",
    "~/.cargo/git",
    "~/go/bin",
    "~/go/pkg/mod",
    "~/.local/bin",
    "~/.local/lib",
    "~/.local/share/uv/python",
    "~/.local/share/pnpm",
    # Package caches (not their credential files: `~/.m2/settings.xml`, `~/.npmrc`).
    "~/.cache/pip",
    "~/.cache/uv",
    "~/.cache/go-build",
    "~/.cache/pre-commit",
    "~/.npm/_cacache",
    "~/.m2/repository",
    "~/.gradle/caches",
    "~/.gradle/wrapper",
    # Configuration that holds no secrets.
    "{config}/git/ignore",
)
"""Home paths bound back, read-only, into the hidden home (`~` and `{config}` expand as in
`deny_read`); missing ones are skipped. The user's git configuration is bound as a sanitised
copy (see `sandbox.masks`), never as is."""

DEFAULT_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "USER",
    "LOGNAME",
    "SHELL",
    "TZ",
)
"""Variables copied from the host environment (shell patterns, case-sensitive)."""

DEFAULT_ENV_SCRUB: tuple[str, ...] = (
    "ANTHROPIC_*",
    "*_TOKEN",
    "*_TOKEN_*",
    "*_SECRET*",
    "*_KEY",
    "*_KEY_*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "SSH_AUTH_SOCK",
    "AWS_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_*",
    "RAY_*",
)
"""Variables dropped even when an allow pattern matches (case-insensitive). An exact name in
`EnvPolicy.allow` overrides this list: allowing `GITHUB_TOKEN` by name lets it through.
`RAY_*`: a Ray cluster's token, auth mode and address are for Ray alone (`policies.pool`)."""


class EnvPolicy(_Frozen):
    """The sandbox's environment: built from an allowlist, never inherited wholesale."""

    allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    """Shell patterns of host variables to copy. Default `DEFAULT_ENV_ALLOW`."""
    scrub: tuple[str, ...] = DEFAULT_ENV_SCRUB
    """Shell patterns (case-insensitive) dropped even when allowed by pattern. Default
    `DEFAULT_ENV_SCRUB`."""
    values: dict[str, str] = Field(default_factory=dict)
    """Variables set explicitly, after the copy (they win over host values, scrub does not
    apply: the caller chose them). Default none. `HOME` is always set to the spec's home."""


class Limits(_Frozen):
    """Resource limits. `None` means unlimited. Enforcement: rlimits set inside the sandbox
    (`prlimit`), a cgroup where the host lets us create one, and the runner (wall time,
    output, process count)."""

    wall_time_s: float | None = 600.0
    """Seconds from start until the runner kills the sandbox. Default 600."""
    cpu_time_s: int | None = 1800
    """CPU seconds per process (RLIMIT_CPU): SIGXCPU at the limit, SIGKILL a second later.
    Default 1800."""
    memory_bytes: int | None = 4 * _GiB
    """Address space per process (RLIMIT_AS), and the cgroup memory limit of the whole sandbox
    where a cgroup v2 memory controller is available. Default 4 GiB."""
    processes: int | None = 512
    """Processes and threads in the sandbox (RLIMIT_NPROC, cgroup pids.max, and a runner
    watchdog: RLIMIT_NPROC is not enforced for host root). Reaching it kills the sandbox.
    Default 512."""
    file_size_bytes: int | None = 1 * _GiB
    """Largest file a process may write (RLIMIT_FSIZE): SIGXFSZ or EFBIG beyond. Default
    1 GiB."""
    open_files: int | None = 4096
    """Open file descriptors per process (RLIMIT_NOFILE). Default 4096."""
    output_bytes: int | None = 8 * _MiB
    """Captured stdout plus stderr; more kills the sandbox. Not enforced for inherited stdio.
    Default 8 MiB."""
    tmp_bytes: int | None = 1 * _GiB
    """Size of each private tmpfs (`/tmp`, `/dev/shm`), which lives in host memory. Default
    1 GiB."""

    @model_validator(mode="after")
    def _positive(self) -> Limits:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"limits.{name} must be positive or None, got {value}")
        return self


class SandboxSpec(_Frozen):
    """What one sandbox may see and do. The floor's mandatory parts (namespaces, no
    capabilities, read-only root, private /tmp, seccomp) are not options: they are always on."""

    workspaces: tuple[WorkspaceRoot, ...] = ()
    """Workspace roots bound at their own paths. The first is the default working directory
    (`/` when there is none). Default none: a sandbox that can read but write nothing."""
    extra_binds: tuple[Bind, ...] = ()
    """Extra host paths to bind (read-only by default). Default none."""
    deny_read: tuple[str, ...] = DEFAULT_DENY_READ
    """Secrets masked from reads (patterns, see the module docstring). Default
    `DEFAULT_DENY_READ`."""
    extra_deny_read: tuple[str, ...] = ()
    """Additions to `deny_read`. Default none."""
    protected: tuple[ProtectedPath, ...] = DEFAULT_PROTECTED
    """Paths kept read-only inside writable roots, existing or not. Default
    `DEFAULT_PROTECTED`."""
    extra_protected: tuple[ProtectedPath, ...] = ()
    """Additions to `protected`; plain strings are accepted (directory stubs). Default none."""
    network: NetworkMode = "off"
    """`off` (default): a private network namespace with nothing but loopback. `host`: no
    network namespace of its own, so the sandbox reaches whatever the user's processes reach
    (the internet, services on the host's 127.0.0.1, a cloud metadata address) and may listen
    on unprivileged ports; everything else of the floor stays. Only an MCP server whose policy
    says `network = true` gets it (`orchestrator.cli.wiring.open_mcp`). The seam for later is
    an allowlist proxy reached through a socket bound into the sandbox."""
    allow_unix_sockets: bool = False
    """Let the sandbox create AF_UNIX sockets. Default False: a seccomp filter refuses them,
    because a host socket reachable through the read-only root (a D-Bus session bus, an agent,
    docker.sock) would be a way out. `socketpair()` keeps working either way."""
    home: Annotated[Path, _absolute("home")] | None = None
    """The home whose secrets are masked and which the sandbox sees as `$HOME`. Default None:
    the invoking user's (`$HOME`, else the password database)."""
    hide_home: bool = True
    """Cover the home with an empty read-only tmpfs, then bind back `home_allow` (read-only),
    workspaces and binds under it, and the Python runtime. Default True: a secret in the home
    is hidden whether or not `deny_read` names it."""
    home_allow: tuple[str, ...] = DEFAULT_HOME_ALLOW
    """Home paths visible (read-only) when `hide_home` is on. Default `DEFAULT_HOME_ALLOW`."""
    extra_home_allow: tuple[str, ...] = ()
    """Additions to `home_allow` (the policy's `[sandbox] home_allow`). Default none."""
    env: EnvPolicy = EnvPolicy()
    """How the environment is built. Default: `EnvPolicy()`."""
    limits: Limits = Limits()
    """Resource limits. Default: `Limits()`."""

    @field_validator("extra_protected", mode="before")
    @classmethod
    def _coerce_protected(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            return tuple(ProtectedPath(path=v) if isinstance(v, str) else v for v in value)
        return value

    @model_validator(mode="after")
    def _no_contradictions(self) -> SandboxSpec:
        if self.network == "host" and self.allow_unix_sockets:
            # Abstract Unix sockets belong to the network namespace, not the file system: in
            # the host's, a read-only root no longer keeps X11's or a session bus's from view.
            raise ValueError(
                "network 'host' and allow_unix_sockets together would reach the host's "
                "abstract Unix sockets; allow one or the other"
            )
        seen: dict[Path, tuple[str, Mode]] = {}
        entries = [(f"workspaces[{i}]", w.path, w.mode) for i, w in enumerate(self.workspaces)]
        entries += [(f"extra_binds[{i}]", b.path, b.mode) for i, b in enumerate(self.extra_binds)]
        for label, path, mode in entries:
            if path == Path("/"):
                raise ValueError(f"{label} binds `/`, which is already the read-only root")
            previous = seen.get(path)
            if previous is not None and previous[1] != mode:
                raise ValueError(
                    f"{previous[0]} binds {path} {previous[1]!r} but {label} binds it {mode!r}"
                )
            seen[path] = (label, mode)
        return self

    @property
    def all_deny_read(self) -> tuple[str, ...]:
        """`deny_read` plus `extra_deny_read`, in order, without duplicates."""
        return tuple(dict.fromkeys(self.deny_read + self.extra_deny_read))

    @property
    def all_home_allow(self) -> tuple[str, ...]:
        """`home_allow` plus `extra_home_allow`, in order, without duplicates."""
        return tuple(dict.fromkeys(self.home_allow + self.extra_home_allow))

    @property
    def all_protected(self) -> tuple[ProtectedPath, ...]:
        """`protected` plus `extra_protected`, first entry per path wins."""
        merged: dict[str, ProtectedPath] = {}
        for entry in self.protected + self.extra_protected:
            merged.setdefault(entry.path, entry)
        return tuple(merged.values())

    def read_only(self) -> SandboxSpec:
        """The same spec with every workspace and bind read-only (for read-only batches)."""
        return self.model_copy(
            update={
                "workspaces": tuple(w.model_copy(update={"mode": "ro"}) for w in self.workspaces),
                "extra_binds": tuple(b.model_copy(update={"mode": "ro"}) for b in self.extra_binds),
            }
        )
