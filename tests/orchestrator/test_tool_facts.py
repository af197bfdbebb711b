"""Tools declare their facts; policies read them, never a table of tool names (issue 10, item 3).

The test-only tools below are new file tools the policy layer has never heard of: declaring
the `read` (or `edit`) family and a path field is all it takes for `Read(...)` (`Edit(...)`)
rules and the built-in path checks to cover them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.agents.dispatch_agent import DispatchAgentTool
from orchestrator.calls.permissions import Allow, Deny, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.policy import SessionPolicy
from orchestrator.messages import ToolUseBlock
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.registry import ToolRegistry, builtin_facts, builtin_tools
from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyEngine
from policies.facts import ToolFacts
from policies.files import PolicyError, PolicyLayer, merge_policy, parse_policy_text


class ScrollInput(ToolInput):
    scroll_path: str


class ScrollTool(Tool[ScrollInput]):
    """A new reading tool: reads files by path, from a field no table has ever named."""

    name: ClassVar[str] = "Scroll"
    input_model: ClassVar[type[ToolInput]] = ScrollInput
    description: ClassVar[str] = "test"
    facts: ClassVar[ToolFacts] = ToolFacts(family="read", path_fields=("scroll_path",))

    def is_read_only(self, input: ScrollInput) -> bool:
        return True

    async def call(
        self, input: ScrollInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        yield ToolOutput.text(f"(would read {input.scroll_path})")


class InscribeInput(ToolInput):
    target: str


class InscribeTool(Tool[InscribeInput]):
    """A new editing tool."""

    name: ClassVar[str] = "Inscribe"
    input_model: ClassVar[type[ToolInput]] = InscribeInput
    description: ClassVar[str] = "test"
    facts: ClassVar[ToolFacts] = ToolFacts(family="edit", path_fields=("target",))

    async def call(
        self, input: InscribeInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        yield ToolOutput.text(f"(would write {input.target})")


def test_every_built_in_tool_declares_its_own_facts() -> None:
    tools: list[type[Tool[Any]]] = [type(t) for t in builtin_tools()]
    for cls in [*tools, DispatchAgentTool]:
        assert "facts" in vars(cls), f"{cls.__name__} must declare its facts"
        fields = {f.alias or n for n, f in cls.input_model.model_fields.items()}
        assert set(cls.facts.path_fields) <= fields, cls.__name__
        if cls.facts.command_field is not None:
            assert cls.facts.command_field in fields
    assert DispatchAgentTool.facts.runs_in_coordinator
    assert not any(
        f.runs_in_coordinator for n, f in builtin_facts().items() if n != "dispatch_agent"
    )


def policy(workspace: Path, text: str, tool_facts: dict[str, ToolFacts]) -> SessionPolicy:
    home = workspace.parent / "home"
    home.mkdir(exist_ok=True)
    layer = PolicyLayer(
        "local", "local.toml", parse_policy_text(text, file="local.toml"), workspace
    )
    effective = merge_policy(workspace, [layer], home=home)
    engine = PolicyEngine(
        effective,
        workspace=workspace,
        floor_proven=True,
        analyser=BashAnalyser(),
        env={"HOME": str(home)},
        tool_facts=tool_facts,
    )
    return SessionPolicy(effective, engine)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "secrets").mkdir(parents=True)
    (ws / "secrets" / "key").write_text("hunter2")
    (ws / "notes.txt").write_text("hello")
    return ws.resolve()


async def decide(session: SessionPolicy, workspace: Path, tool: Tool[Any], **raw: Any) -> Any:
    pipeline = ToolPipeline(
        tools=ToolRegistry([tool]),
        ctx=ToolContext(workspace=workspace, cwd=workspace),
        permission=session.permission_fn(),
        asker=_never,
        assessor=session.assessor(),
        emit=lambda event: None,
    )
    plan = pipeline.prepare(ToolUseBlock(id="t", name=tool.name, input=raw))
    return plan, await session.permission_fn()(plan, pipeline.ctx)


async def _never(*_: Any) -> Allow | Deny:
    raise AssertionError("nothing here asks")


@pytest.mark.parametrize("facts", [{}, builtin_facts()], ids=["no table", "built-in facts"])
@pytest.mark.parametrize(
    "rule", ["Read(secrets/**)", "Read(secrets)", "Read(//{ws}/secrets/key)", "Read(*key*)"]
)
async def test_new_read_tool_is_covered_by_read_rules(
    workspace: Path, facts: dict[str, ToolFacts], rule: str
) -> None:
    """The engine has no entry for Scroll (neither a table nor `tool_facts`): the call's own
    facts are what put it under `Read(...)`."""
    text = f'[permissions]\ndeny = ["{rule.format(ws=str(workspace).lstrip("/"))}"]\n'
    session = policy(workspace, text, facts)
    plan, result = await decide(
        session, workspace, ScrollTool(), scroll_path=str(workspace / "secrets/key")
    )
    assert isinstance(result, Deny) and "denied by the rule" in result.message
    assert plan.sandbox == "ro" and plan.facts.family == "read"
    # The same tool on another file is a plain read-only call.
    _, other = await decide(
        session, workspace, ScrollTool(), scroll_path=str(workspace / "notes.txt")
    )
    assert isinstance(other, Allow)


async def test_new_edit_tool_is_covered_by_edit_rules_and_protected_paths(
    workspace: Path,
) -> None:
    session = policy(workspace, '[permissions]\nallow = ["Edit(notes.txt)"]\n', {})
    _, allowed = await decide(
        session, workspace, InscribeTool(), target=str(workspace / "notes.txt")
    )
    assert isinstance(allowed, Allow)
    hooks = workspace / ".git" / "hooks" / "pre-commit"
    _, protected = await decide(session, workspace, InscribeTool(), target=str(hooks))
    assert isinstance(protected, Deny) and "protected path" in protected.message
    _, asked = await decide(session, workspace, InscribeTool(), target=str(workspace / "x.txt"))
    assert not isinstance(asked, Allow)


async def test_new_tool_is_covered_by_masked_secrets(workspace: Path) -> None:
    session = policy(workspace, "", {})
    home = workspace.parent / "home"
    (home / ".ssh").mkdir(parents=True)
    _, result = await decide(
        session, workspace, ScrollTool(), scroll_path=str(home / ".ssh/id_rsa")
    )
    assert isinstance(result, Deny) and "secrets" in result.message


def test_a_path_rule_for_a_tool_without_a_path_is_a_policy_error(workspace: Path) -> None:
    with pytest.raises(PolicyError, match="Think takes no path"):
        policy(workspace, '[permissions]\ndeny = ["Think(x)"]\n', builtin_facts())


async def test_the_verdict_is_made_once_even_in_process(workspace: Path) -> None:
    """Plan, permission and the in-process Bash tool's one-shot/persistent choice all use
    the one classification the assessor made (counted through the analyser seam)."""

    class Counting(BashAnalyser):
        calls: ClassVar[list[str]] = []

        def classify(self, command: str, **kwargs: Any) -> Any:
            Counting.calls.append(command)
            return super().classify(command, **kwargs)

    layer = PolicyLayer("local", "local.toml", parse_policy_text("", file="local.toml"), workspace)
    effective = merge_policy(workspace, [layer], home=workspace)
    engine = PolicyEngine(
        effective, workspace=workspace, floor_proven=True, analyser=Counting(), env={}
    )
    session = SessionPolicy(effective, engine)
    ctx = ToolContext(workspace=workspace, cwd=workspace)
    pipeline = ToolPipeline(
        tools=builtin_tools(bash_classifier=session.bash_classifier()),
        ctx=ctx,
        permission=session.permission_fn(),
        asker=headless_asker,
        assessor=session.assessor(),
        emit=lambda event: None,
    )
    commands = ["ls", "rm -rf build", "grep -c hello notes.txt"]
    results = []
    try:
        for i, command in enumerate(commands):
            block = ToolUseBlock(id=f"t{i}", name="Bash", input={"command": command})
            results.append(await pipeline.execute(pipeline.prepare(block)))
    finally:
        await ctx.aclose()
    assert Counting.calls == commands
    assert [r.is_error for r in results] == [False, True, False]
    assert "notes.txt" in results[0].text() and results[2].text().strip() == "1"


def test_the_stateless_tools_are_the_builtins_that_only_read() -> None:
    """The `general` subagent's tools and worker reuse follow the tools' own facts."""
    from orchestrator.tools.registry import STATELESS_TOOLS, builtin_tools

    facts = builtin_tools().facts()
    assert set(STATELESS_TOOLS) == {n for n, f in facts.items() if f.family in ("read", "meta")}
