"""Hook output parsing, merging and matching, and the pipeline's hook steps with real hook
processes (unsandboxed here; tests/orchestrator/test_hooks_e2e.py runs them under the floor
through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, cast

import pytest

from orchestrator.calls.permissions import headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.plan import plan_call
from orchestrator.calls.policy import SessionPolicy
from orchestrator.hooks.matchers import build_matcher, claude_matches
from orchestrator.hooks.output import HookOutput, parse_output
from orchestrator.hooks.runner import ConfiguredHook, HookRun, HookRunner, merge
from orchestrator.messages import ToolUseBlock
from orchestrator.session.hooks import configured_hooks
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import builtin_facts, builtin_tools
from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyEngine
from policies.files import Hook, Mode, PolicyLayer, merge_policy, parse_policy_text
from policies.mode import PermissionMode


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "expected"),
    [
        (2, "{}", "no pushing\n", HookOutput(blocked=True, reason="no pushing")),
        (0, "plain words\n", "", HookOutput(context="plain words")),
        (0, "", "", HookOutput()),
        (1, "", "boom", HookOutput(error="exited 1: boom")),
        (
            0,
            '{"hookSpecificOutput": {"permissionDecision": "ask", '
            '"permissionDecisionReason": "check"}}',
            "",
            HookOutput(permission="ask", reason="check"),
        ),
        (0, '{"decision": "block", "reason": "tests fail"}', "", HookOutput(
            blocked=True, reason="tests fail", permission="deny")),
        (0, '{"decision": "approve"}', "", HookOutput(permission="allow")),
        (0, '{"continue": false, "stopReason": "enough"}', "", HookOutput(
            stop=True, stop_reason="enough")),
        (0, '{"suppressOutput": true, "hookSpecificOutput": {"additionalContext": "c"}}', "",
         HookOutput(suppress_output=True, context="c")),
    ],
)  # fmt: skip
def test_output_is_read_as_claude_code_reads_it(
    code: int, stdout: str, stderr: str, expected: HookOutput
) -> None:
    assert parse_output(code, stdout, stderr) == expected


@pytest.mark.parametrize(
    "stdout",
    ['{"decision": ', "{} trailing", '{"decision": "maybe"}', '{"hookSpecificOutput": '
     '{"permissionDecision": "sure"}}', '{"hookSpecificOutput": {"updatedInput": 3}}',
     "{" * 100_000],
)  # fmt: skip
def test_garbage_json_is_a_clear_non_blocking_error(stdout: str) -> None:
    out = parse_output(0, stdout, "")
    assert out.error and not out.blocked and out.permission is None


def _run(command: str, output: HookOutput) -> HookRun:
    hook = ConfiguredHook(Hook(event="PreToolUse", command=command), "p.toml", build_matcher(None))
    return HookRun(hook, 0, "", "", 0.0, output)


def test_merge_deny_beats_ask_beats_allow_in_any_order() -> None:
    runs = [
        _run("a", HookOutput(permission="allow")),
        _run("b", HookOutput(permission="deny", reason="no")),
        _run("c", HookOutput(permission="ask")),
    ]
    for order in (runs, runs[::-1], runs[1:] + runs[:1]):
        outcome = merge(order)
        assert (outcome.permission, outcome.permission_reason) == ("deny", "no")
    assert merge([runs[0], runs[2]]).permission == "ask"


def test_two_different_rewrites_are_a_denial_naming_both_hooks() -> None:
    outcome = merge(
        [
            _run("one", HookOutput(updated_input={"command": "a"})),
            _run("two", HookOutput(updated_input={"command": "b"})),
        ]
    )
    assert outcome.permission == "deny" and outcome.updated_input is None
    assert outcome.permission_reason is not None
    assert "[one]" in outcome.permission_reason and "[two]" in outcome.permission_reason
    same = merge([_run("one", HookOutput(updated_input={"x": 1}))] * 2)
    assert same.updated_input == {"x": 1} and same.permission is None


def test_an_errored_hook_counts_for_nothing() -> None:
    outcome = merge([_run("x", HookOutput(error="timed out"))])
    assert not outcome.blocked and outcome.permission is None


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return tmp_path.resolve()


def _policy(ws: Path, text: str) -> SessionPolicy:
    layer = PolicyLayer("user", "user.toml", parse_policy_text(text, file="user.toml"), ws)
    effective = merge_policy(ws, [layer], home=ws)
    engine = PolicyEngine(
        effective,
        workspace=ws,
        floor_proven=True,
        analyser=BashAnalyser(),
        env={"HOME": str(ws)},
        tool_facts=builtin_facts(),
    )
    return SessionPolicy(effective, engine)


def _pipeline(ws: Path, policy: SessionPolicy) -> ToolPipeline:
    live = policy.permission_mode
    hooks = HookRunner(configured_hooks(policy), workspace=ws, permission_mode=live)
    return ToolPipeline(
        tools=builtin_tools(bash_classifier=policy.bash_classifier()),
        ctx=ToolContext(workspace=ws, cwd=ws),
        permission=policy.permission_fn(),
        asker=headless_asker,
        assessor=policy.assessor(),
        emit=lambda event: None,
        hooks=hooks,
    )


def _rewrite(command: str) -> str:
    reply = {"hookSpecificOutput": {"updatedInput": {"command": command}}}
    return f"cat >/dev/null; echo '{json.dumps(reply)}'"


async def test_a_rewritten_input_is_decided_again_and_never_passes_a_deny(ws: Path) -> None:
    policy = _policy(
        ws,
        'mode = "bypass"\n[permissions]\ndeny = ["Bash(rm:*)"]\n'
        f'[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash(echo:*)"\n'
        f"command = {json.dumps(_rewrite('rm -rf keep'))}\n",
    )
    (ws / "keep").mkdir()
    pipe = _pipeline(ws, policy)
    block = ToolUseBlock(id="t1", name="Bash", input={"command": "echo hi"})
    try:
        result = await pipe.execute(pipe.prepare(block))
    finally:
        await pipe.ctx.aclose()
    assert result.is_error and "rm" in result.text()
    assert (ws / "keep").is_dir()


async def test_a_rewrite_runs_the_new_input(ws: Path) -> None:
    policy = _policy(
        ws,
        'mode = "bypass"\n[[hooks]]\nevent = "PreToolUse"\nmatcher = "Bash"\n'
        f"command = {json.dumps(_rewrite('echo rewritten > out.txt'))}\n",
    )
    pipe = _pipeline(ws, policy)
    block = ToolUseBlock(id="t1", name="Bash", input={"command": "echo original > out.txt"})
    try:
        result = await pipe.execute(pipe.prepare(block))
    finally:
        await pipe.ctx.aclose()
    assert not result.is_error, result.text()
    assert (ws / "out.txt").read_text() == "rewritten\n"


async def test_hook_ask_narrows_an_allow_and_headless_denies_it(ws: Path) -> None:
    ask = {"hookSpecificOutput": {"permissionDecision": "ask"}}
    policy = _policy(
        ws,
        'mode = "bypass"\n[[hooks]]\nevent = "PreToolUse"\nmatcher = "Write|Edit"\n'
        f"command = {json.dumps('echo ' + repr(json.dumps(ask)))}\n",
    )
    pipe = _pipeline(ws, policy)
    block = ToolUseBlock(id="t1", name="Write", input={"file_path": f"{ws}/x", "content": "x"})
    result = await pipe.execute(pipe.prepare(block))
    assert result.is_error and not (ws / "x").exists()


def test_matchers_rules_and_regexes() -> None:
    assert build_matcher("Edit|Write").regex and build_matcher("mcp__.*").regex
    assert build_matcher("Bash(git push:*)").rule is not None
    assert build_matcher("Edit", kind="regex").regex
    assert build_matcher("*").everything and build_matcher(None).everything
    assert build_matcher("compact|resume").matches_name("resume")
    assert not build_matcher("startup").matches_name("resume")


@pytest.mark.parametrize(
    ("matcher", "name", "expected"),
    [("Edit|Write", "Write", True), ("Edit|Write", "NotebookEdit", False),
     ("mcp__.*", "mcp__gh__search", True), ("Notebook.*", "NotebookEdit", True),
     ("Bash", "Bash", True), ("(", "Bash", False)],
)  # fmt: skip
def test_claude_code_matchers_read_as_claude_code_reads_them(
    matcher: str, name: str, expected: bool
) -> None:
    assert claude_matches(matcher, name) is expected


@pytest.mark.parametrize(
    ("matcher", "kind", "expected"),
    [("Task", None, True), ("Agent", None, True), ("Task", "regex", True),
     ("Agent", "regex", True), ("Task|Bash", None, True), ("^Agent$", "regex", True),
     ("Task(general)", None, True), ("Task(reviewer)", None, False),
     ("dispatch_agent", None, True), ("Bash", "regex", False), ("Tasks", "regex", False)],
)  # fmt: skip
def test_claude_codes_task_and_agent_match_dispatch_agent(
    ws: Path, matcher: str, kind: Literal["regex"] | None, expected: bool
) -> None:
    """Claude Code's subagent tool is `Task` (newer: `Agent`): its settings' matchers
    select Warren's `dispatch_agent`, read as a rule or as Claude Code reads them."""
    policy = _policy(ws, "")
    from orchestrator.agents.dispatch_agent import DispatchAgentInput, DispatchAgentTool

    class _Dispatch(DispatchAgentTool):
        def __init__(self) -> None:  # only its name, facts and input model are used here
            pass

    block = ToolUseBlock(
        id="t1", name="dispatch_agent", input={"description": "d", "prompt": "p"}
    )
    plan = plan_call(block, _Dispatch(), DispatchAgentInput(description="d", prompt="p"),
                     policy.assessor())  # fmt: skip
    found = build_matcher(matcher, kind=kind, engine=policy.engine, anchor=ws)
    assert found.matches_call(plan) is expected


@pytest.mark.parametrize(
    ("mode", "spelled"),
    [("accept-edits", "acceptEdits"), ("bypass", "bypassPermissions"), ("dont-ask", "dontAsk")],
)
def test_hook_inputs_spell_the_mode_as_claude_code_does(
    tmp_path: Path, mode: str, spelled: str
) -> None:
    """Hook scripts written for Claude Code compare `permission_mode` to its names."""
    live = PermissionMode(cast(Mode, mode), floor_proven=True)
    hooks = HookRunner([], workspace=tmp_path, permission_mode=live)
    assert hooks._common()["permission_mode"] == spelled
