"""Write scopes (orchestrator/calls/scopes.py) and the scheduling rule that reads them
(`orchestrator.calls.plan.may_overlap`): table-driven, on a real directory tree, no sandbox."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents.dispatch_agent import DispatchAgentTool
from orchestrator.agents.types import GENERAL, AgentType
from orchestrator.calls.permissions import Allow, default_permission, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.plan import CallPlan, may_overlap, plan_call, tool_assessor
from orchestrator.calls.scopes import (
    ScopeError,
    check_scope,
    hash_scope,
    lexical_scope,
    open_scope,
    scope_changes,
)
from orchestrator.messages import ToolUseBlock
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.bash import BashTool
from orchestrator.tools.read import ReadTool
from orchestrator.tools.registry import ToolRegistry
from sandbox.spec import DEFAULT_PROTECTED

PROTECTED = [p.path for p in DEFAULT_PROTECTED]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "billing").mkdir(parents=True)
    (root / "src" / "file.py").write_text("x = 1\n")
    (root / "src" / "out").symlink_to(tmp_path)
    return root


def check(ws: Path, *raw: str) -> tuple[Path, ...]:
    return check_scope(raw, workspace=ws, roots=[ws], protected=PROTECTED)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ((), "is empty"),
        (("src/../..",), "'..'"),
        (("/etc",), "not inside a writable root"),
        ((".",), "whole writable root"),
        ((".git/hooks",), ".git"),
        ((".github",), ".github/workflows"),
        (("src/.vscode",), ".vscode"),
        ((".warren/agents",), ".warren"),
        (("src/file.py",), "not a directory"),
        (("src/out",), "symlink"),
        (("src/out/new",), "symlink"),
        (("src", "src/billing"), "overlap"),
    ],
)
def test_a_scope_that_cannot_be_one_is_refused_with_its_reason(
    ws: Path, raw: tuple[str, ...], why: str
) -> None:
    with pytest.raises(ScopeError, match=why.replace(".", r"\.").replace("'", "'")):
        check(ws, *raw)


def test_a_scope_is_made_from_the_root_without_following_a_link(ws: Path) -> None:
    scope = check(ws, "src/billing", "tests/billing/", str(ws / "src" / "catalog"))
    assert scope == (ws / "src/billing", ws / "tests/billing", ws / "src/catalog")
    assert not (ws / "tests").exists()  # checking makes nothing
    assert open_scope(scope, [ws]) == [ws / "tests", ws / "tests/billing", ws / "src/catalog"]
    assert all(p.is_dir() for p in scope)
    # A link put on the way after the check is refused, not followed.
    (ws / "late").symlink_to(ws.parent)
    with pytest.raises(ScopeError, match="symlink"):
        open_scope([ws / "late" / "made"], [ws])
    assert not (ws.parent / "made").exists()


def test_lexical_scope_is_none_for_dotdot_and_normalised_otherwise(ws: Path) -> None:
    assert lexical_scope(["a/./b/", "/x/y"], ws) == (ws / "a/b", Path("/x/y"))
    assert lexical_scope(["a/../b"], ws) is None
    assert lexical_scope([], ws) is None


def test_hashing_follows_no_link_and_reports_what_changed(ws: Path) -> None:
    scope = (ws / "src",)
    os.mkfifo(ws / "src" / "fifo")  # never opened: a reader would block
    before = hash_scope(scope)
    assert before.complete and ws / "src" / "fifo" not in before.files
    assert before.files[ws / "src" / "out"] == f"link:{ws.parent}"
    (ws / "src" / "file.py").write_text("x = 2\n")
    (ws / "src" / "billing" / "new.py").write_text("y\n")
    (ws / "src" / "out").unlink()
    changes = scope_changes(before, hash_scope(scope))
    sha = hashlib.sha256
    assert [(c.path.name, c.before, c.after) for c in changes] == [
        ("new.py", None, sha(b"y\n").hexdigest()),
        ("file.py", sha(b"x = 1\n").hexdigest(), sha(b"x = 2\n").hexdigest()),
        ("out", f"link:{ws.parent}", None),
    ]


# --- scheduling ------------------------------------------------------------------------------

WRITER = AgentType(name="writer", description="d", system_prompt="s", writable=True)
WS = Path("/repo")


def dispatch() -> DispatchAgentTool:
    class _NoRunner:
        async def run(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("not run")

    return DispatchAgentTool(
        runner=_NoRunner(),
        agent_types={"writer": WRITER, "general": GENERAL},
        tools=ToolRegistry([]),
        permission=default_permission(),
        asker=headless_asker,
    )


def plan(tool: Tool[Any], **input: Any) -> CallPlan:
    block = ToolUseBlock(id="t", name=tool.name, input=input)
    return plan_call(block, tool, tool.parse_input(input), tool_assessor, workspace=WS)


def writer(*scope: str) -> CallPlan:
    return plan(dispatch(), description="d", prompt="p", subagent_type="writer",
                write_paths=list(scope))  # fmt: skip


@pytest.mark.parametrize(
    ("earlier", "later", "overlap"),
    [
        (lambda: writer("src/a"), lambda: writer("src/b"), False),
        (lambda: writer("src/a"), lambda: writer("src/a/x"), True),
        (lambda: writer("src/a"), lambda: writer("src/ab"), False),  # by whole parts
        (lambda: writer("src/a", "t/a"), lambda: writer("t"), True),
        (lambda: plan(ReadTool(), file_path="/repo/src/b/m.py"), lambda: writer("src/a"), False),
        (lambda: plan(ReadTool(), file_path="/repo/src/a/m.py"), lambda: writer("src/a"), True),
        (lambda: writer("src/a"), lambda: plan(BashTool(), command="ls"), True),
        (lambda: writer("src/a"), lambda: plan(dispatch(), description="d", prompt="p"), True),
        (lambda: writer("src/a/../b"), lambda: writer("src/c"), True),  # no scope: serial
        (lambda: plan(ReadTool(), file_path="/a"), lambda: plan(ReadTool(), file_path="/b"), False),
    ],
)
def test_may_overlap(earlier: Any, later: Any, overlap: bool) -> None:
    assert may_overlap(earlier(), later()) is overlap
    assert may_overlap(later(), earlier()) is overlap


def test_a_scoped_writer_plans_a_scoped_sandbox() -> None:
    assert writer("src/a").sandbox == "scoped"
    assert writer("src/a").write_scope == (Path("/repo/src/a"),)
    unscoped = plan(dispatch(), description="d", prompt="p", subagent_type="writer")
    assert unscoped.sandbox == "rw" and unscoped.write_scope is None


async def test_a_permission_answer_that_changes_the_scope_is_refused(ws: Path) -> None:
    """The executor scheduled the call by its scope; a rewrite to another scope (which might
    overlap a writer running beside it) does not run."""

    async def widen(plan: CallPlan, ctx: ToolContext) -> Allow:
        return Allow(updated_input={**plan.block.input, "write_paths": ["src"]})

    pipeline = ToolPipeline(
        tools=ToolRegistry([dispatch()]),
        ctx=ToolContext(workspace=ws, cwd=ws),
        permission=widen,
        asker=headless_asker,
        emit=lambda event: None,
    )
    input = {"description": "d", "prompt": "p", "subagent_type": "writer",
             "write_paths": ["src/billing"]}  # fmt: skip
    block = ToolUseBlock(id="t", name="dispatch_agent", input=input)
    result = await pipeline.execute(pipeline.prepare(block))
    assert result.is_error and "write scope of this call was changed" in str(result.content)
