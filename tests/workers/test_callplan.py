"""The runner obeys the plan (issue 10, item 2), against real tool hosts under real bwrap.

Each call is classified once, in the pipeline's prepare step, by the session policy's
analyser; the permission function, the audit event and the sandboxed runner read that one
verdict. The analyser is injected through the engine's `analyser` seam (a subclass that
counts, or lies), never patched. Attacks check the host afterwards: the file is absent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.calls.permissions import Allow, Ask, Deny, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.policy import SessionPolicy
from orchestrator.events import Event, PermissionDecided
from orchestrator.messages import ToolResultBlock, ToolUseBlock
from orchestrator.tools.base import Tool, ToolContext, ToolInput
from orchestrator.tools.registry import builtin_facts, builtin_tools
from policies.bash_analysis import BashAnalyser, BashClassification
from policies.engine import PolicyEngine
from policies.files import PolicyLayer, merge_policy, parse_policy_text
from tests.kit.floor import needs_sandbox
from workers.toolhost_runner import SandboxedToolRunner, open_tool_runner

pytestmark = needs_sandbox


class CountingAnalyser(BashAnalyser):
    """The real analyser, counting the command lines it classifies."""

    def __init__(self) -> None:
        super().__init__()
        self.classified: list[str] = []

    def classify(self, command: str, **kwargs: Any) -> BashClassification:
        self.classified.append(command)
        return super().classify(command, **kwargs)


class LyingAnalyser(CountingAnalyser):
    """Calls every command read-only and auto-approvable: the kernel must still hold."""

    def classify(self, command: str, **kwargs: Any) -> BashClassification:
        honest = super().classify(command, **kwargs)
        return dataclasses.replace(
            honest,
            read_only=True,
            decision_hint="allow",
            hint_reason="read-only (a lie)",
            concurrency_safe=True,
            reasons=(),
        )


@dataclasses.dataclass
class Session:
    workspace: Path
    analyser: CountingAnalyser
    policy: SessionPolicy
    runner: SandboxedToolRunner
    events: list[Event]

    def pipeline(self, asker: Any = headless_asker) -> ToolPipeline:
        ctx = ToolContext(workspace=self.workspace, cwd=self.workspace)
        return ToolPipeline(
            tools=builtin_tools(),  # the coordinator's Bash has no classifier of its own
            ctx=ctx,
            permission=self.policy.permission_fn(),
            asker=asker,
            assessor=self.policy.assessor(),
            runner=self.runner,
            emit=self.events.append,
        )

    async def bash(self, command: str, asker: Any = headless_asker) -> ToolResultBlock:
        pipeline = self.pipeline(asker)
        block = ToolUseBlock(id=f"t{len(self.events)}", name="Bash", input={"command": command})
        return await pipeline.execute(pipeline.prepare(block))

    def decisions(self) -> list[PermissionDecided]:
        return [e for e in self.events if isinstance(e, PermissionDecided)]


def session_policy(workspace: Path, analyser: BashAnalyser, policy_text: str = "") -> SessionPolicy:
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    layer = PolicyLayer(
        "project", "project.toml", parse_policy_text(policy_text, file="project.toml"), workspace
    )
    effective = merge_policy(workspace, [layer], home=home)
    engine = PolicyEngine(
        effective,
        workspace=workspace,
        floor_proven=True,
        analyser=analyser,
        env={"HOME": str(home)},
        tool_facts=builtin_facts(),
    )
    return SessionPolicy(effective, engine)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\n")
    return ws.resolve()


@pytest.fixture
async def hosts() -> AsyncIterator[SandboxedToolRunner]:
    async with open_tool_runner(stop_grace_s=2) as runner:
        yield runner


def make(
    workspace: Path, runner: SandboxedToolRunner, analyser: CountingAnalyser, text: str = ""
) -> Session:
    return Session(workspace, analyser, session_policy(workspace, analyser, text), runner, [])


async def test_a_command_the_policy_marks_read_only_runs_in_the_read_only_host(
    workspace: Path, hosts: SandboxedToolRunner
) -> None:
    session = make(workspace, hosts, CountingAnalyser())
    result = await session.bash(f"cat {workspace / 'a.txt'}")
    assert not result.is_error and "alpha" in result.text()
    assert set(hosts.host_pids()) == {"read_only"}
    assert session.analyser.classified == [f"cat {workspace / 'a.txt'}"]
    [decided] = session.decisions()
    assert (decided.decision, decided.sandbox, decided.read_only) == ("allow", "ro", True)


async def test_a_misclassified_write_runs_read_only_and_fails_with_erofs(
    workspace: Path, hosts: SandboxedToolRunner, tmp_path: Path
) -> None:
    """The analyser says read-only, wrongly: the plan puts the call in the read-only host,
    where the kernel refuses every write (EROFS), whatever the policy believed."""
    session = make(workspace, hosts, LyingAnalyser())
    target = workspace / "pwned.txt"
    commands = [
        f"touch {target}",
        f"echo x > {target}",
        f"rm -f {workspace / 'a.txt'}",
        f"mkdir {workspace / 'made'}",
    ]
    for command in commands:
        result = await session.bash(command)
        assert "Read-only file system" in result.text(), (command, result.text())
    assert not target.exists() and not (workspace / "made").exists()
    assert (workspace / "a.txt").read_text() == "alpha\n"
    assert set(hosts.host_pids()) == {"read_only"}
    assert session.analyser.classified == commands  # once per call, never again
    assert {d.sandbox for d in session.decisions()} == {"ro"}


@pytest.mark.parametrize(
    "command",
    ["touch {ws}/made.txt", "echo x > {ws}/made.txt", "cat {ws}/a.txt > {ws}/made.txt"],
)
async def test_an_unproven_command_is_asked_never_run_read_only(
    workspace: Path, hosts: SandboxedToolRunner, command: str
) -> None:
    """Headless: the ask becomes a deny; nothing ran, in either host."""
    session = make(workspace, hosts, CountingAnalyser())
    line = command.format(ws=workspace)
    result = await session.bash(line)
    assert result.is_error and "was not granted" in result.text()
    assert not (workspace / "made.txt").exists()
    assert "read_only" not in hosts.host_pids()  # validation ran where it would run: rw
    assert [(d.decision, d.answered_by, d.sandbox) for d in session.decisions()] == [
        ("ask", "policy", "rw"),
        ("deny", "asker", "rw"),
    ]
    assert session.analyser.classified == [line]


async def test_an_unproven_command_runs_read_write_after_a_yes(
    workspace: Path, hosts: SandboxedToolRunner
) -> None:
    asked: list[str] = []

    async def yes(tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
        asked.append(ask.reason)
        return Allow(rule="the user said yes")

    session = make(workspace, hosts, CountingAnalyser())
    result = await session.bash(f"touch {workspace / 'made.txt'} && echo ok", asker=yes)
    assert not result.is_error, result.text()
    assert (workspace / "made.txt").exists()
    assert len(asked) == 1
    assert set(hosts.host_pids()) == {"read_write"}
    assert len(session.analyser.classified) == 1


async def test_an_unproven_command_runs_read_write_after_an_allow_rule(
    workspace: Path, hosts: SandboxedToolRunner
) -> None:
    session = make(
        workspace, hosts, CountingAnalyser(), '[permissions]\nallow = ["Bash(touch:*)"]\n'
    )
    result = await session.bash(f"touch {workspace / 'made.txt'}")
    assert not result.is_error, result.text()
    assert (workspace / "made.txt").exists()
    [decided] = session.decisions()
    assert (decided.decision, decided.sandbox, decided.read_only) == ("allow", "rw", False)
    assert decided.rule is not None and "Bash(touch:*)" in decided.rule
    assert set(hosts.host_pids()) == {"read_write"}
    assert len(session.analyser.classified) == 1


async def test_an_allow_rule_for_a_read_only_command_still_runs_it_read_only(
    workspace: Path, hosts: SandboxedToolRunner
) -> None:
    """The decision never widens the sandbox: a proven read-only call runs read-only."""
    session = make(workspace, hosts, CountingAnalyser(), '[permissions]\nallow = ["Bash(cat:*)"]\n')
    result = await session.bash(f"cat {workspace / 'a.txt'}")
    assert "alpha" in result.text()
    assert set(hosts.host_pids()) == {"read_only"}
