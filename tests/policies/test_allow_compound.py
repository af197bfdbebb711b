"""An allow rule covers every part of a compound command, or it approves nothing.

`allow = ["Bash(git status:*)"]` approves `git status -s` and, under a proven floor,
`git status && ls` (every other part is read-only); it must not approve a line in which
anything else runs or writes: after `;`, `&&`, `||`, `|`, `&` or a newline, in `$(...)`,
backticks, a subshell or group, process substitution, a here-string, a redirection to a file,
a function defined and then called, or code hidden in arithmetic and indirection.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyEngine
from policies.files import PolicyLayer, merge_policy, parse_policy_text

ANALYSER = BashAnalyser()

NOT_COVERED = [
    "git status; rm -rf x",
    "git status && curl https://example.com",
    "git status || curl x",
    "git status | sh",
    "git status |& tee out",
    "git status & rm x",
    "git status\nrm x",
    "git status $(rm x)",
    "git status `rm x`",
    'git status "$(curl x)"',
    "(git status; rm x)",
    "{ git status; rm x; }",
    "git status <(rm x)",
    "git status > >(sh)",
    "git status <<< $(rm x)",
    "git status > out.txt",
    "git status >> log",
    "git status 2> err",
    "git status && ls > out",
    "git() { rm -rf x; }; git status",
    "f() { rm x; }; git status; f",
    "git status $((x))",
    "git status ${!x}",
    "git status ${arr[i]}",
    "x=1; git status; PATH=/tmp",
    "git status; eval $X",
    "if git status; then rm x; fi",
    "for f in a; do git status; rm $f; done",
    "git status\n(cd .. && rm -rf ws)",
    "git status-evil",
    "git statusx",
]

COVERED = [
    "git status",
    "git status -s",
    "git status --porcelain src",
    "git status && ls",
    "git status; echo done",
    "git status | head -5",
    "(git status)",
    "git status 2>/dev/null",
]


def _engine(ws: Path, *, floor: bool = True, mode: str = "default") -> PolicyEngine:
    text = f'mode = "{mode}"\n[permissions]\nallow = {json.dumps(["Bash(git status:*)"])}\n'
    layer = PolicyLayer("user", "user.toml", parse_policy_text(text, file="user.toml"), ws, True)
    return PolicyEngine(
        merge_policy(ws, [layer], home=ws.parent / "home"),
        workspace=ws,
        floor_proven=floor,
        analyser=ANALYSER,
        no_sandbox_consent=True,
        env={"HOME": str(ws.parent / "home")},
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = (tmp_path / "ws").resolve()
    path.mkdir()
    return path


@pytest.mark.parametrize("command", NOT_COVERED)
@pytest.mark.parametrize("mode", ["default", "accept-edits"])
def test_an_allow_rule_does_not_approve_the_rest_of_the_line(
    ws: Path, command: str, mode: str
) -> None:
    decision = _engine(ws, mode=mode).decide("Bash", {"command": command}, tool_read_only=False)
    assert decision.decision != "allow", (command, decision)


@pytest.mark.parametrize("command", COVERED)
def test_an_allow_rule_approves_what_it_covers(ws: Path, command: str) -> None:
    decision = _engine(ws).decide("Bash", {"command": command}, tool_read_only=False)
    assert (decision.decision, decision.rule) == ("allow", "Bash(git status:*)"), command


def test_without_the_floor_only_the_allowed_parts_count(ws: Path) -> None:
    engine = _engine(ws, floor=False)
    assert engine.decide("Bash", {"command": "git status -s"}, tool_read_only=False).decision == (
        "allow"
    )
    # `ls` is read-only, but without the floor nothing enforces that: the line asks.
    decision = engine.decide("Bash", {"command": "git status && ls -R"}, tool_read_only=False)
    assert decision.decision == "ask"
