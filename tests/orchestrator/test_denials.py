"""The denials of a run and the advice printed for them (orchestrator/calls/denials.py): an allow
rule is suggested only where one would let the call run, and nothing the model wrote reaches the
terminal unescaped."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from orchestrator.calls.denials import DenialLog, PermissionDenial, allow_rule, render_denials
from orchestrator.events import PermissionDecided, ToolStarted


def _decided(
    decision: Literal["allow", "deny", "ask"],
    rule: str | None,
    by: Literal["policy", "asker", "hook"] = "policy",
    *,
    tool: str = "Bash",
    input: dict[str, Any] | None = None,
    use_id: str = "toolu_1",
) -> PermissionDecided:
    return PermissionDecided(
        tool_use_id=use_id,
        tool=tool,
        input=input if input is not None else {"command": "make test"},
        decision=decision,
        rule=rule,
        answered_by=by,
        message="not run",
    )


def _denial(*events: PermissionDecided, agent_id: str | None = None) -> PermissionDenial:
    log = DenialLog()
    for event in events:
        log(event, agent_id)
    [denial] = log.take()
    return denial


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # Asked with no rule, nobody to answer: an allow rule fixes it.
        (
            [_decided("ask", "no rule [built-in]"),
             _decided("deny", "headless: ask becomes deny", "asker")],
            "Bash(make test:*)",
        ),
        # An ask rule beats allow rules: suggesting one would be a lie.
        (
            [_decided("ask", "Bash(make:*) [/ws/.warren/policy.toml]"),
             _decided("deny", "headless: ask becomes deny", "asker")],
            None,
        ),
        ([_decided("deny", "dont-ask mode [mode]")], "Bash(make test:*)"),
        ([_decided("deny", "Bash(make:*) [/ws/.warren/policy.toml]")], None),
        ([_decided("deny", "plan mode [mode]")], None),
        ([_decided("deny", "PreToolUse hook ./guard.sh", "hook")], None),
        ([_decided("ask", "no rule [built-in]"), _decided("deny", "user: no", "asker")], None),
        (
            [_decided("deny", "headless: ask becomes deny", "asker", tool="Write",
                      input={"file_path": "/ws/a", "content": ""})],
            "Write",
        ),
    ],
)  # fmt: skip
def test_an_allow_rule_only_where_one_would_let_the_call_run(
    events: list[PermissionDecided], expected: str | None
) -> None:
    assert allow_rule(_denial(*events)) == expected


def test_a_run_keeps_its_own_denials_in_order() -> None:
    log = DenialLog()
    log(_decided("deny", "plan mode [mode]", use_id="a"))
    log(ToolStarted("b", "Read", "Read(/x)"))
    log(_decided("allow", "read-only [built-in]", use_id="b"))
    log(_decided("deny", "plan mode [mode]", use_id="c"), "agent-0123456789ab")
    first, second = log.take()
    assert (first.tool_use_id, first.agent_id) == ("a", None)
    assert second.record() == {
        "tool_name": "Bash",
        "tool_use_id": "c",
        "tool_input": {"command": "make test"},
        "agent_id": "agent-0123456789ab",
    }
    assert log.take() == ()


def test_what_the_model_wrote_is_escaped() -> None:
    command = "make \x1b[2J\x1b]0;owned\x07test\u202e"
    denial = _denial(
        _decided("ask", "no rule [built-in]", input={"command": command}),
        _decided("deny", "headless: ask becomes deny", "asker", input={"command": command}),
    )
    lines = render_denials((denial,))
    assert lines[0] == "warren: 1 tool call was denied; what it would have done did not happen:"
    text = "\n".join(lines)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J" in lines[1]
