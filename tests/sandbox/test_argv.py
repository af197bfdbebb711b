"""Golden and structural tests of the pure spec -> bwrap argv function.

The golden files (tests/sandbox/golden/*.txt, one argument per line) are the floor written out:
review a diff in them as you would a firewall rule change. Regenerate with
`WARREN_UPDATE_GOLDEN=1 .venv/bin/pytest tests/sandbox/test_argv.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.argv import MANDATORY_FLAGS, bwrap_argv, prlimit_argv
from sandbox.masks import BindMount, HostFacts
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

GOLDEN = Path(__file__).parent / "golden"
BWRAP = Path("/opt/bwrap")
PRLIMIT = Path("/usr/bin/prlimit")
WS = Path("/home/dev/project")


def _facts(**overrides: object) -> HostFacts:
    values: dict[str, object] = {
        "home": Path("/home/dev"),
        "binds": (BindMount(path=WS, mode="rw", label="workspaces[0]"),),
        "pins": (WS / ".git",),
        "protected": (WS / ".envrc", WS / ".git" / "config", WS / ".git" / "hooks"),
        "deny_dirs": (Path("/home/dev/.ssh"), Path("/home/dev/.aws")),
        "deny_files": (Path("/etc/shadow"), Path("/home/dev/.netrc")),
        "watched": (WS / ".vscode",),
        "env": (("HOME", "/home/dev"), ("LANG", "C.UTF-8"), ("PATH", "/usr/bin:/bin")),
    }
    values.update(overrides)
    return HostFacts.model_validate(values)


@dataclass(frozen=True)
class Options:
    prlimit: Path | None = PRLIMIT
    seccomp_fd: int | None = 3
    cwd: Path | None = None


CASES: dict[str, tuple[SandboxSpec, HostFacts, Options]] = {
    "rw_workspace": (
        SandboxSpec(workspaces=(WorkspaceRoot(path=WS),)),
        _facts(),
        Options(),
    ),
    "ro_workspace_unlimited": (
        SandboxSpec(
            workspaces=(WorkspaceRoot(path=WS, mode="ro"),),
            limits=Limits(
                wall_time_s=None,
                cpu_time_s=None,
                memory_bytes=None,
                processes=None,
                file_size_bytes=None,
                open_files=None,
                output_bytes=None,
                tmp_bytes=None,
            ),
        ),
        _facts(
            binds=(BindMount(path=WS, mode="ro", label="workspaces[0]"),),
            pins=(),
            protected=(),
            watched=(),
        ),
        Options(prlimit=None, seccomp_fd=None),
    ),
    "no_workspace": (
        SandboxSpec(),
        _facts(binds=(), pins=(), protected=(), watched=(), deny_dirs=(), deny_files=()),
        Options(seccomp_fd=5),
    ),
    "nested_binds_and_cwd": (
        SandboxSpec(workspaces=(WorkspaceRoot(path=WS),)),
        _facts(
            binds=(
                BindMount(path=WS / "vendor", mode="ro", label="extra_binds[0]"),
                BindMount(path=WS, mode="rw", label="workspaces[0]"),
                BindMount(path=Path("/srv/cache"), mode="rw", label="extra_binds[1]"),
            ),
        ),
        Options(cwd=WS / "src"),
    ),
}


def _argv(name: str) -> list[str]:
    spec, facts, options = CASES[name]
    return bwrap_argv(
        spec,
        ["sh", "-c", "echo hi"],
        bwrap=BWRAP,
        facts=facts,
        prlimit=options.prlimit,
        seccomp_fd=options.seccomp_fd,
        cwd=options.cwd,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    text = "\n".join(_argv(name)) + "\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("WARREN_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; regenerate if the change is intended"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_sandbox_gets_the_floor(name: str) -> None:
    argv = _argv(name)
    assert argv[0] == str(BWRAP)
    head = argv[1 : 1 + len(MANDATORY_FLAGS)]
    assert tuple(head) == MANDATORY_FLAGS
    for flag in (
        "--new-session",
        "--die-with-parent",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--clearenv",
    ):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--ro-bind") : argv.index("--ro-bind") + 3] == ["--ro-bind", "/", "/"]
    assert argv[argv.index("--proc") + 1] == "/proc"
    assert argv[argv.index("--dev") + 1] == "/dev"
    assert argv[-3:] == ["sh", "-c", "echo hi"]


def test_host_network_drops_only_the_network_namespace() -> None:
    """An MCP server granted the network: the same floor, `--unshare-net` left out."""
    spec, facts, _ = CASES["rw_workspace"]
    shared = spec.model_copy(update={"network": "host"})
    argv = bwrap_argv(shared, ["srv"], bwrap=BWRAP, facts=facts, prlimit=PRLIMIT, seccomp_fd=3)
    private = bwrap_argv(spec, ["srv"], bwrap=BWRAP, facts=facts, prlimit=PRLIMIT, seccomp_fd=3)
    assert "--unshare-net" in private
    assert argv == [flag for flag in private if flag != "--unshare-net"]


def test_a_zygotes_sandbox_differs_only_where_it_must() -> None:
    """workers/zygote.py's sandbox (sandbox/nsfork.py says why each): no --disable-userns,
    a uid of its own, and bwrap's proc beside the host's read-only one, not over it."""
    from sandbox import nsfork

    spec, facts, _ = CASES["rw_workspace"]
    spec = spec.read_only()
    plain = bwrap_argv(spec, ["z"], bwrap=BWRAP, facts=facts, prlimit=PRLIMIT, seccomp_fd=3)
    nested = bwrap_argv(
        spec, ["z"], bwrap=BWRAP, facts=facts, prlimit=PRLIMIT, seccomp_fd=3, nested_uid=1000
    )
    expected = [flag for flag in plain if flag != "--disable-userns"]
    at = expected.index("--proc")
    del expected[at : at + 2]
    at = expected.index("--dev") + 2
    expected[at:at] = ["--proc", nsfork.RW_PROC]
    at = expected.index("ALL") + 1
    expected[at:at] = ["--uid", "1000", "--gid", "1000"]
    assert nested == expected


def _mount_positions(argv: list[str]) -> list[tuple[int, str, str]]:
    """(index, flag, destination) of every mount operation, in order."""
    out = []
    two = {"--bind", "--ro-bind"}
    one = {"--tmpfs", "--remount-ro", "--proc", "--dev"}
    end = argv.index("--")
    for i, arg in enumerate(argv[:end]):
        if arg in two:
            out.append((i, arg, argv[i + 2]))
        elif arg in one:
            out.append((i, arg, argv[i + 1]))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_mount_order(name: str) -> None:
    """/ first, then /proc, /dev, /tmp, then binds parents first, then pins, protected, and
    masks last (a later mount covers an earlier one, so no bind may uncover a mask)."""
    argv = _argv(name)
    _, facts, _ = CASES[name]
    mounts = _mount_positions(argv)
    dests = [dest for _, _, dest in mounts]
    assert dests[0] == "/"
    tmp = dests.index("/tmp")
    assert dests.index("/proc") < tmp and dests.index("/dev") < tmp
    bind_dests = [str(b.path) for b in facts.binds]
    for dest in bind_dests:
        assert dests.index(dest) > tmp, "/tmp must come before workspace binds"
    bind_order = [d for d in dests if d in bind_dests]
    assert bind_order == sorted(bind_order, key=lambda d: (len(Path(d).parts), d))
    masks = [str(p) for p in (*facts.deny_dirs, *facts.deny_files)]
    if masks:
        last_bind = max(i for i, (_, _, d) in enumerate(mounts) if d in bind_dests or d == "/")
        first_mask = min(i for i, (_, _, d) in enumerate(mounts) if d in masks)
        assert first_mask > last_bind
        protected = [i for i, (_, _, d) in enumerate(mounts) if d in map(str, facts.protected)]
        assert all(i < first_mask for i in protected)


def test_deny_masks_are_tmpfs_for_dirs_and_dev_null_for_files() -> None:
    argv = _argv("rw_workspace")
    text = " ".join(argv)
    assert "--tmpfs /home/dev/.ssh --remount-ro /home/dev/.ssh" in text
    assert "--ro-bind /dev/null /etc/shadow" in text
    assert f"--ro-bind {WS}/.git/hooks {WS}/.git/hooks" in text
    assert f"--bind {WS}/.git {WS}/.git" in text


def test_environment_is_only_what_facts_say() -> None:
    argv = _argv("rw_workspace")
    setenv = [argv[i + 1] for i, a in enumerate(argv) if a == "--setenv"]
    assert setenv == ["HOME", "LANG", "PATH"]
    assert argv.index("--clearenv") < argv.index("--setenv")


def test_limits_become_prlimit_inside_the_sandbox() -> None:
    argv = _argv("rw_workspace")
    after = argv[argv.index("--") + 1 :]
    assert after[0] == str(PRLIMIT)
    assert "--nproc=512" in after
    assert "--cpu=1800:1801" in after
    assert after[after.index("--") + 1 :] == ["sh", "-c", "echo hi"]


def test_prlimit_argv_omits_unlimited() -> None:
    limits = Limits(
        memory_bytes=None, processes=7, cpu_time_s=None, file_size_bytes=None, open_files=None
    )
    assert prlimit_argv(limits, PRLIMIT) == [str(PRLIMIT), "--core=0", "--nproc=7", "--"]


def test_pure_and_deterministic() -> None:
    """No host access: the paths above do not exist, and two calls agree."""
    assert not WS.exists()
    assert _argv("rw_workspace") == _argv("rw_workspace")


def test_empty_argv_is_refused() -> None:
    spec, facts, _ = CASES["no_workspace"]
    with pytest.raises(ValueError, match="command"):
        bwrap_argv(spec, [], bwrap=BWRAP, facts=facts)
