"""Deny rules see through spellings, wrappers and scripts; `Read(...)` denies bind Bash too.

`deny = ["Bash(git clean:*)"]` must deny every way of running `git clean`: git's global
options, a program path, quotes and backslashes, wrappers, `sh -c` and `eval` scripts, and
`xargs`/`find -exec`. The first test runs each spelling in a real writable sandbox on a scratch
git repository and checks on the host that the untracked file is gone: every spelling really
runs `git clean`. Where the command is not known before it runs (`eval "$X"`, `$CMD clean`,
`git $SUB`), a deny rule it could match denies. `deny = ["Read(.env)"]` stops the commands
that name the file (`cat .env`, `git show HEAD:.env`); what a command finds by itself
(`grep -r`) is kept from it by the sandbox's read masks, so the engine only has to stay sound
there.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from orchestrator.tools.registry import builtin_facts
from policies.bash_analysis import BashAnalyser
from policies.engine import PolicyDecision, PolicyEngine
from policies.files import PolicyLayer, merge_policy, parse_policy_text
from sandbox.host import SandboxHost
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec, WorkspaceRoot

ANALYSER = BashAnalyser()
MODES = ["default", "accept-edits", "plan", "dont-ask", "bypass"]

GIT_CLEAN_SPELLINGS = [
    "git clean -f",
    "git -C . clean -f",
    "git --no-pager clean -f",
    "git -c core.quotepath=off clean -f",
    "git -C . -c a.b=c --no-pager clean -f",
    "/usr/bin/git clean -f",
    '"git" clean -f',
    "'git' 'clean' -f",
    "\\git clean -f",
    "g\\it clean -f",
    "gi''t cl\"ea\"n -f",
    "sh -c 'git clean -f'",
    "bash -c 'git clean -f'",
    "bash -lc 'git clean -f'",
    "eval 'git clean -f'",
    "eval git clean -f",
    "env git clean -f",
    "env -u X LC_ALL=C git clean -f",
    "timeout 5 git clean -f",
    "timeout -s KILL 5 git clean -f",
    "nice git clean -f",
    "nice -n 5 git clean -f",
    "nohup git clean -f",
    "command git clean -f",
    "builtin command git clean -f",
    "exec git clean -f",
    "echo -f | xargs git clean",
    "echo clean -f | xargs git",
    "find . -maxdepth 0 -exec git clean -f \\;",
    "ls && git clean -f",
    "true; (git clean -f)",
    "echo $(git clean -f)",
    "cat <(git clean -f)",
    "f() { git clean -f; }; f",
    "sh -c \"sh -c 'git clean -f'\"",
    "timeout 5 sh -c 'env git -C . clean -f'",
]

UNKNOWN_COMMANDS = [
    'eval "$X"',
    'sh -c "$X"',
    "bash -c $X",
    "$CMD clean -f",
    "git $SUB -f",
    "git -C . $SUB",
    "xargs $CMD",
]

NOT_DENIED = ["git status", "git log --grep clean", "echo git clean", "cat clean.txt", "ls"]


def _engine(ws: Path, mode: str, text: str) -> PolicyEngine:
    text = f"mode = {json.dumps(mode)}\n{text}"
    layer = PolicyLayer("user", "user.toml", parse_policy_text(text, file="user.toml"), ws, True)
    home = ws.parent / "home"
    return PolicyEngine(
        merge_policy(ws, [layer], home=home),
        workspace=ws,
        floor_proven=True,
        analyser=ANALYSER,
        no_sandbox_consent=True,
        env={"HOME": str(home)},
        tool_facts=builtin_facts(),
    )


def _bash(engine: PolicyEngine, command: str) -> PolicyDecision:
    return engine.decide("Bash", {"command": command}, tool_read_only=False)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = (tmp_path / "ws").resolve()
    path.mkdir()
    return path


@pytest.mark.parametrize("mode", MODES)
def test_a_command_deny_sees_through_every_spelling(ws: Path, mode: str) -> None:
    rules = '[permissions]\ndeny = ["Bash(git clean:*)"]\nallow = ["Bash"]\n'
    engine = _engine(ws, mode, rules)
    for command in GIT_CLEAN_SPELLINGS + UNKNOWN_COMMANDS:
        decision = _bash(engine, command)
        assert (decision.decision, decision.rule) == ("deny", "Bash(git clean:*)"), command
    for command in NOT_DENIED:
        assert _bash(engine, command).decision != "deny" or mode == "plan", command


def test_an_ask_rule_sees_through_them_too(ws: Path) -> None:
    engine = _engine(ws, "default", '[permissions]\nask = ["Bash(git push:*)"]\n')
    for command in ("git -C . push", "/usr/bin/git push", "sh -c 'git push'", "env git push"):
        assert (_bash(engine, command).decision, _bash(engine, command).rule) == (
            "ask",
            "Bash(git push:*)",
        ), command


def _proof_script(commands: list[str]) -> str:
    """Per spelling: a repository `c<i>` with an untracked file, the command, then
    `cleaned<i>` printed if the file is gone (judged inside the sandbox: the floor's guard
    moves the new nested repositories away when it ends, tests/sandbox/test_guard.py)."""
    lines = []
    for index, command in enumerate(commands):
        lines.append(f"git init -q c{index} && echo x > c{index}/untracked.txt")
        inner = shlex.quote(command)
        lines.append(f"(cd c{index} && bash -c {inner} </dev/null >/dev/null 2>&1)")
        lines.append(f"[ -e c{index}/untracked.txt ] || echo cleaned{index}")
    return "\n".join(lines) + "\n"


async def test_every_spelling_really_runs_git_clean(host: SandboxHost, scratch: Path) -> None:
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=scratch),), home=scratch)
    result = await run_sandboxed(
        spec, ["bash", "-c", _proof_script(GIT_CLEAN_SPELLINGS)], cwd=scratch, host=host
    )
    assert result.killed_by_limit is None, result
    cleaned = set(result.stdout.decode().split())
    kept = [c for i, c in enumerate(GIT_CLEAN_SPELLINGS) if f"cleaned{i}" not in cleaned]
    assert kept == [], "these spellings did not run git clean"


READS_OF_ENV = [
    "cat .env",
    "grep x .env",
    "git show HEAD:.env",
    "git show HEAD:./.env",
    "head ./.env",
    "cat sub/../.env",
    "cat sub/.env",
    "cat < .env",
    "tail -n 5 -- .env",
    "diff --from-file=.env other",
    "sh -c 'cat .env'",
    "ls; cat .env | head",
    "echo $(cat .env)",
]


@pytest.mark.parametrize("mode", MODES)
def test_a_read_deny_stops_commands_that_name_the_file(ws: Path, mode: str) -> None:
    (ws / ".env").write_text("SECRET=1\n")
    (ws / "link").symlink_to(ws / ".env")
    engine = _engine(ws, mode, '[permissions]\ndeny = ["Read(.env)"]\n')
    for command in [*READS_OF_ENV, f"cat {ws}/.env", "cat link"]:
        decision = _bash(engine, command)
        assert (decision.decision, decision.rule) == ("deny", "Read(.env)"), command
        assert ".env" in decision.reason
    for command in ("cat README.md", "grep -r x .", "rg SECRET", "cat .envrc.example"):
        decision = _bash(engine, command)  # the sandbox masks what these find by themselves
        assert decision.rule != "Read(.env)", command
    # The file tools keep their own path check.
    read = engine.decide("Read", {"file_path": str(ws / ".env")}, tool_read_only=True)
    assert read.decision == "deny"


def test_a_read_ask_asks_for_commands_that_name_the_file(ws: Path) -> None:
    engine = _engine(ws, "default", '[permissions]\nask = ["Read(secrets/**)"]\n')
    decision = _bash(engine, "cat secrets/key.pem")
    assert (decision.decision, decision.rule) == ("ask", "Read(secrets/**)")
    assert _bash(engine, "cat public/key.pem").decision == "allow"
