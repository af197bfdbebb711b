"""Critical deletes are never auto-approved, in any mode, whatever the allow rules say.

Each command below wiped a workspace (`.git/objects` included) in bypass mode before issue 9.
The first test runs every one of them in a real writable sandbox on a scratch copy of a
workspace and checks on the host that it really destroys something: the table holds real
attacks, not guesses. The others check the engine's answer in each of the five modes, with
`allow = ["Bash"]` and with `allow = ["Bash(rm:*)"]`: ask where a human can answer, deny in
`dont-ask` and `plan` (a headless run turns the ask into a deny, orchestrator.calls.permissions),
with a reason that names what would be destroyed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyEngine
from policies.files import PolicyLayer, merge_policy, parse_policy_text
from sandbox.host import SandboxHost
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec, WorkspaceRoot

ANALYSER = BashAnalyser()
MODES = ["default", "accept-edits", "plan", "dont-ask", "bypass"]

# (command, the word its reason must name)
CRITICAL = [
    ('rm -rf "$PWD"', "current directory"),
    ("rm -rf $(pwd)", "current directory"),
    ("rm -rf *", "current directory"),
    ("rm -rf ./*", "current directory"),
    ("cd .. && rm -rf ws", "cd"),
    ("rm -rf ../ws", "../ws"),
    ("find . -delete", "current directory"),
    ("find . -exec rm -rf {} +", "current directory"),
    ("pwd | xargs rm -rf", "not known"),
    ("rm -rf .git", ".git"),
    ("rm -rf .git/objects", ".git"),
    ("shred -u *", "current directory"),
    ("truncate -s 0 *", "current directory"),
    ('mv "$PWD" ../gone', "current directory"),
    ("git clean -fdx", "untracked"),
    ("sh -c 'rm -rf \"$PWD\"'", "current directory"),
    ("eval 'cd .. && rm -rf ws'", "cd"),
    ('timeout 5 rm -rf "$PWD"', "current directory"),
    # Deletes hidden in text the shell evaluates later (issue 33, class 6): asked in bypass
    # mode too, as every critical delete.
    ("x='a[$(rm -rf \"$PWD\"/*)]'; echo $((x))", "evaluated later"),
    ("x='a[$(rm -rf \"$PWD\"/*)]'; [[ $x -eq 0 ]]", "evaluated later"),
    ("x='a[$(rm -rf \"$PWD\"/*)]'; let y=x", "evaluated later"),
    ("declare -i y; x='a[$(rm -rf \"$PWD\"/*)]'; y=x", "evaluated later"),
    ("v='rm -rf \"$PWD\"/*'; eval \"$v\"", "evaluated later"),
    ("v='rm -rf \"$PWD\"/*'; bash -c \"$v\"", "evaluated later"),
    ("echo cm0gLXJmICIkUFdEIi8q | base64 -d | sh", "made as the command runs"),
    ("bash <(echo 'rm -rf \"$PWD\"/*')", "made as the command runs"),
    ("eval \"$(echo 'rm -rf \"$PWD\"/*')\"", "made as the command runs"),
]
"""Run from the workspace root; each destroys `keep.txt` or `.git/objects/pack/p`."""

NOT_RUN_HERE = [
    ("rm -rf .", "current directory"),  # GNU rm refuses `.`; busybox's and others' may not
    ("rm -rf ..", "above"),
    ("rm -rf /", "everything"),
    ("rm -rf ~", "home"),
    ("rm -rf /usr", "system directory"),
    ("rm -rf {ws}", "workspace root"),
    ("rm -rf {ws}/..", "ancestor"),
    ("mv {ws} /dev/null", "workspace root"),
]
"""Critical too, but not worth proving on this machine."""


def _layers(ws: Path, mode: str, allow: str) -> PolicyEngine:
    text = f"mode = {json.dumps(mode)}\n[permissions]\nallow = {json.dumps([allow])}\n"
    layer = PolicyLayer("user", "user.toml", parse_policy_text(text, file="user.toml"), ws, True)
    policy = merge_policy(ws, [layer], home=ws.parent / "home")
    return PolicyEngine(
        policy,
        workspace=ws,
        floor_proven=True,
        analyser=ANALYSER,
        no_sandbox_consent=True,
        env={"HOME": str(ws.parent / "home")},
    )


def _all_cases(ws: Path) -> list[tuple[str, str]]:
    return CRITICAL + [(command.format(ws=ws), word) for command, word in NOT_RUN_HERE]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("allow", ["Bash", "Bash(rm:*)"])
def test_no_mode_and_no_allow_rule_runs_a_critical_delete(
    tmp_path: Path, mode: str, allow: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    engine = _layers(ws.resolve(), mode, allow)
    for command, word in _all_cases(ws.resolve()):
        decision = engine.decide("Bash", {"command": command}, tool_read_only=False)
        assert decision.decision != "allow", (mode, allow, command)
        assert not decision.run_read_only and not decision.concurrency_safe
        if mode in ("plan", "dont-ask"):
            assert decision.decision == "deny", (mode, command)
        else:
            assert (decision.decision, decision.rule) == ("ask", "critical delete"), command
        assert word in decision.reason, (mode, command, decision.reason)


@pytest.mark.parametrize("mode", MODES)
def test_deletes_strictly_inside_follow_the_rules(tmp_path: Path, mode: str) -> None:
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    engine = _layers(ws, mode, "Bash(rm:*)")
    for command in ("rm -rf build", "rm -rf build/*.o", f"rm -rf {ws}/build", "rm -f a.txt"):
        decision = engine.decide("Bash", {"command": command}, tool_read_only=False)
        expected = "deny" if mode == "plan" else "allow"
        assert (decision.decision, decision.rule) == (
            expected,
            "plan mode" if mode == "plan" else "Bash(rm:*)",
        ), command


def _proof_script(commands: list[str]) -> str:
    """Per case: a workspace `c<i>/ws` with history, work and an untracked file (a real
    repository for `git clean`), the command, then `destroyed<i>` printed if it destroyed any."""
    lines = []
    for index, command in enumerate(commands):
        ws = f"c{index}/ws"
        if command.startswith("git clean"):
            lines.append(f"git init -q {ws} && echo work > {ws}/untracked.txt")
            check = f"[ -e {ws}/untracked.txt ]"
        else:
            lines.append(
                f"mkdir -p {ws}/.git/objects/pack && echo history > {ws}/.git/objects/pack/p"
                f" && echo work > {ws}/keep.txt"
            )
            check = f"[ -s {ws}/keep.txt ] && [ -e {ws}/.git/objects/pack/p ]"
        inner = shlex.quote(command)
        lines.append(f"(cd {ws} && bash -c {inner} </dev/null >/dev/null 2>&1)")
        lines.append(f"{check} || echo destroyed{index}")
    return "\n".join(lines) + "\n"


async def test_every_case_really_destroys_the_workspace(host: SandboxHost, scratch: Path) -> None:
    """Each case, run in a writable sandbox on a scratch workspace, destroys it. The fixture
    is made and judged inside the sandbox: its nested `.git` directories are new there, so the
    floor's guard moves them away when the sandbox ends (tests/sandbox/test_guard.py), and an
    existing nested `.git` would be mounted read-only."""
    commands = [command for command, _ in CRITICAL]
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=scratch),), home=scratch)
    result = await run_sandboxed(
        spec, ["bash", "-c", _proof_script(commands)], cwd=scratch, host=host
    )
    assert result.killed_by_limit is None, result
    destroyed = set(result.stdout.decode().split())
    intact = [c for i, c in enumerate(commands) if f"destroyed{i}" not in destroyed]
    assert intact == [], "these commands destroyed nothing: not attacks"


def test_a_counter_loop_in_bypass_mode_still_runs_unasked(tmp_path: Path) -> None:
    """Arithmetic on variables alone is no delete: only with a deleting command in its text
    is evaluated text treated as one (issue 33)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    engine = _layers(ws.resolve(), "bypass", "Bash")
    for command in (
        "i=0; while [ $i -lt 3 ]; do i=$((i+1)); echo $i; done",
        "n=5; let m=n*2; echo $m",
        "declare -i total=0; for f in *.py; do total+=1; done; echo $total",
    ):
        decision = engine.decide("Bash", {"command": command}, tool_read_only=False)
        assert decision.decision == "allow", (command, decision.reason)
