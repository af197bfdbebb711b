"""SandboxSpec validation and the environment builder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox.env import build_env
from sandbox.spec import (
    Bind,
    EnvPolicy,
    Limits,
    SandboxSpec,
    WorkspaceRoot,
)

HOME = Path("/home/dev")


def test_defaults_are_the_floor() -> None:
    spec = SandboxSpec()
    assert spec.network == "off"
    assert not spec.allow_unix_sockets
    assert "~/.ssh" in spec.deny_read
    assert any(p.path == ".git/hooks" for p in spec.protected)


def test_spec_is_frozen() -> None:
    spec = SandboxSpec()
    with pytest.raises(ValidationError):
        spec.network = "off"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {
                "workspaces": (
                    WorkspaceRoot(path=Path("/w"), mode="rw"),
                    WorkspaceRoot(path=Path("/w"), mode="ro"),
                )
            },
            "workspaces[0] binds /w 'rw' but workspaces[1] binds it 'ro'",
        ),
        (
            {
                "workspaces": (WorkspaceRoot(path=Path("/w")),),
                "extra_binds": (Bind(path=Path("/w"), mode="ro"),),
            },
            "workspaces[0] binds /w 'rw' but extra_binds[0] binds it 'ro'",
        ),
        ({"extra_binds": (Bind(path=Path("/"), mode="rw"),)}, "already the read-only root"),
        ({"network": "on"}, "network"),
        ({"network": "host", "allow_unix_sockets": True}, "network 'host' and allow_unix_sockets"),
        ({"home": Path("relative")}, "home must be absolute"),
    ],
)
def test_contradictions_name_both_fields(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        SandboxSpec.model_validate(kwargs)


def test_relative_paths_are_refused() -> None:
    with pytest.raises(ValidationError, match="absolute"):
        WorkspaceRoot(path=Path("relative"))
    with pytest.raises(ValidationError, match="absolute"):
        Bind(path=Path("relative"))


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValidationError, match=r"limits\.processes"):
        Limits(processes=0)
    assert Limits(processes=None).processes is None


def test_read_only_copy() -> None:
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=Path("/w")),),
        extra_binds=(Bind(path=Path("/cache"), mode="rw"),),
    )
    ro = spec.read_only()
    assert [w.mode for w in ro.workspaces] == ["ro"]
    assert [b.mode for b in ro.extra_binds] == ["ro"]
    assert spec.workspaces[0].mode == "rw"


def test_additions_merge_without_duplicates() -> None:
    spec = SandboxSpec(extra_deny_read=("~/.ssh", "/srv/keys"), extra_protected=[".git/hooks"])
    assert spec.all_deny_read.count("~/.ssh") == 1
    assert spec.all_deny_read[-1] == "/srv/keys"
    assert [p.path for p in spec.all_protected].count(".git/hooks") == 1


HOST_ENV = {
    "PATH": "/usr/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "TERM": "xterm",
    "HOME": "/root",
    "ANTHROPIC_API_KEY": "sk-ant",
    "GITHUB_TOKEN": "ghp",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "SSH_AUTH_SOCK": "/run/ssh",
    "DB_PASSWORD": "pw",
    "EDITOR": "vim",
    "github_token": "lower",
    "RAY_AUTH_TOKEN": "ray-token",
    "RAY_AUTH_MODE": "token",
    "RAY_ADDRESS": "10.0.0.5:6379",
}


def test_environment_is_built_from_the_allowlist() -> None:
    env = dict(build_env(EnvPolicy(), HOST_ENV, home=HOME))
    assert env == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TERM": "xterm",
        "HOME": str(HOME),
    }


def test_scrub_applies_to_broad_allow_patterns_case_insensitively() -> None:
    env = dict(build_env(EnvPolicy(allow=("*",)), HOST_ENV, home=HOME))
    assert "EDITOR" in env
    for secret in (
        "ANTHROPIC_API_KEY",
        "GITHUB_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "SSH_AUTH_SOCK",
        "DB_PASSWORD",
        "github_token",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_MODE",
        "RAY_ADDRESS",
    ):
        assert secret not in env


def test_exact_allow_overrides_scrub_and_values_win() -> None:
    policy = EnvPolicy(allow=("PATH", "GITHUB_TOKEN"), values={"PATH": "/bin", "X": "1"})
    env = dict(build_env(policy, HOST_ENV, home=HOME))
    assert env == {"PATH": "/bin", "GITHUB_TOKEN": "ghp", "HOME": str(HOME), "X": "1"}


def test_environment_is_sorted_for_golden_argv() -> None:
    env = build_env(EnvPolicy(allow=("*",)), HOST_ENV, home=HOME)
    assert [k for k, _ in env] == sorted(k for k, _ in env)
