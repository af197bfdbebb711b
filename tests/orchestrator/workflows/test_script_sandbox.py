"""`script_sandbox`: the script's sandbox from a session's parts is the read-only floor with
the session's masks and the `[limits] workflow_*` values, whatever the floor it starts from
allowed; and those limits come from a policy file like every other."""

from __future__ import annotations

from pathlib import Path

from orchestrator.limits import Limits
from orchestrator.workflows.script import script_sandbox
from policies.files import parse_policy_text
from sandbox.spec import Bind, SandboxSpec, WorkspaceRoot


def test_the_script_gets_the_read_only_floor_with_its_own_limits(tmp_path: Path) -> None:
    floor = SandboxSpec(
        workspaces=(WorkspaceRoot(path=tmp_path / "old", mode="rw"),),
        extra_binds=(Bind(path=tmp_path / "cache", mode="rw"),),
        extra_deny_read=("~/.secret",),
        allow_unix_sockets=True,
    )
    limits = Limits(workflow_cpu_s=30, workflow_memory_mb=256, workflow_time_s=90.0)
    spec = script_sandbox(
        floor, [tmp_path / "ws", tmp_path / "extra"], limits, denied=(str(tmp_path / "ws/.env"),)
    ).spec
    assert spec.workspaces == (
        WorkspaceRoot(path=tmp_path / "ws", mode="ro"),
        WorkspaceRoot(path=tmp_path / "extra", mode="ro"),
    )
    assert [bind.mode for bind in spec.extra_binds] == ["ro"]
    assert spec.extra_deny_read == ("~/.secret", str(tmp_path / "ws/.env"))
    assert (spec.network, spec.allow_unix_sockets) == ("off", False)
    assert spec.limits.cpu_time_s == 30
    assert spec.limits.memory_bytes == 256 * 1024 * 1024
    assert spec.limits.wall_time_s == 90.0


def test_the_workflow_limits_come_from_the_policy_over_their_defaults() -> None:
    assert (Limits().workflow_cpu_s, Limits().workflow_memory_mb) == (60, 512)
    assert Limits().workflow_time_s == 3600.0
    policy = parse_policy_text(
        "[limits]\nworkflow_cpu_s = 5\nworkflow_memory_mb = 128\nworkflow_time_s = 30.5\n",
        file="p.toml",
    )
    stated = policy.limits.model_dump(exclude_none=True)
    assert Limits.build(stated) == Limits(
        workflow_cpu_s=5, workflow_memory_mb=128, workflow_time_s=30.5
    )
