"""Arithmetic and indirection run code: the analyser never calls them read-only.

Bash evaluates the text of a variable used in arithmetic, recursively, and runs the `$(...)`
of an array subscript in that text. A harmless-looking, auto-approved assignment
`x='a[$(rm -f keep.txt)]'` in the persistent shell turns any later `echo $((x))` into
`rm`. Each case below is classified here and then run, after the same assignment, in a real
writable sandbox: a case called "runs code" must delete its `keep.txt` there (the attack is
real, not a guess), and a case called read-only must leave it.

The contexts, from `man bash` (ARITHMETIC EVALUATION, Parameter Expansion, Arrays,
CONDITIONAL EXPRESSIONS, SHELL BUILTIN COMMANDS): `$((...))`, `$[...]`, `((...))`, `let`,
`for ((...))`, the operands of `[[ -eq -ne -lt -le -gt -ge ]]`, indexed-array subscripts
(`${a[i]}`, `a[i]=`, `a[i]+=`, `a=([i]=v)`, `unset 'a[i]'`), substring offsets and lengths
(`${s:o:l}`, `${@:o}`, `${a[@]:o}`), indirection (`${!x}`, `test -v`, `[ -v ]`,
`[[ -v ]]`, `printf -v`, `read NAME`, `declare -n`), integer variables (`declare -i`), and
prompt expansion (`${x@P}`). `[ A -eq B ]`, `test A -eq B` and `printf %d` want plain
integers and evaluate nothing: the read-only cases prove it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from policies.bash_analysis import BashAnalyser
from sandbox.host import SandboxHost
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec, WorkspaceRoot

PLANT = "x='a[$(rm -f keep.txt)]'"
SETUP = f"{PLANT}; arr=(1 2); s=abc; set -- p q"
"""What earlier, auto-approved calls left in the persistent shell (one line per call)."""

RUNS_CODE = [
    "echo $((x))",
    "echo $(($x))",
    "echo $((x + 1))",
    "echo $[x]",
    "(( x ))",
    "(( x > 0 )) || true",
    "let x",
    "for ((i = x; i < 1; i++)); do :; done",
    '[[ a -eq "$x" ]]',
    "[[ x -eq 1 ]]",
    "[[ $x -lt 1 ]]",
    '[[ 1 -ge "$x" ]]',
    "echo ${!x}",
    'test -v "$x"',
    '[ -v "$x" ]',
    "[[ -v $x ]]",
    "echo ${arr[x]}",
    'echo "${arr[$x]}"',
    "echo ${#arr[x]}",
    "echo ${arr[x]:-none}",
    "arr[x]=1",
    "arr[x]+=1",
    "arr=([x]=1)",
    'unset "arr[x]"',
    "echo ${s:x}",
    "echo ${s:0:x}",
    "echo ${@:x}",
    "echo ${arr[@]:x}",
    "declare -i n; n=$x",
    'printf -v "$x" %s 1',
    'read "$x" <<< 1',
    "declare -n r=$x; echo $r",
    "echo ${x@P}",
]

READ_ONLY = [
    '[ "$x" -eq 1 ]',
    'test "$x" -eq 1',
    'printf "%d" "$x"',
    "echo $((1 + 2 * (3 << 1)))",
    "echo $(( $# + 1 ))",
    "(( 2 > 1 ))",
    "[[ 1 -eq 1 ]]",
    "[[ $# -eq 2 ]]",
    "echo ${arr[0]} ${arr[@]} ${arr[-1]} ${#arr[*]}",
    "echo ${!arr[@]}",
    "echo ${s:1:1} ${s: -1} ${@:2}",
    "test -v x",
    "[[ -v arr ]]",
    'echo "$x"',
    "arr[1]=3",
]


def _proof_script(commands: list[str]) -> str:
    """One shell per case, in its own directory, after the set-up line."""
    lines = []
    for index, command in enumerate(commands):
        script = shlex.quote(f"{SETUP}\n{command}")
        lines.append(f"(cd c{index} && bash -c {script} </dev/null >/dev/null 2>&1)")
    return "\n".join(lines) + "\n"


async def _survivors(host: SandboxHost, workspace: Path, commands: list[str]) -> list[bool]:
    for index in range(len(commands)):
        (workspace / f"c{index}").mkdir()
        (workspace / f"c{index}" / "keep.txt").write_text("keep\n")
    spec = SandboxSpec(workspaces=(WorkspaceRoot(path=workspace),), home=workspace)
    result = await run_sandboxed(
        spec, ["bash", "-c", _proof_script(commands)], cwd=workspace, host=host
    )
    assert result.killed_by_limit is None, result
    return [(workspace / f"c{index}" / "keep.txt").exists() for index in range(len(commands))]


@pytest.fixture(scope="module")
def analyser() -> BashAnalyser:
    return BashAnalyser()


def test_the_set_up_itself_looks_harmless(analyser: BashAnalyser) -> None:
    # The attack needs no approval: the assignment is read-only, so it runs unasked.
    assert analyser.classify(PLANT, floor=True).read_only


@pytest.mark.parametrize("command", RUNS_CODE)
def test_code_running_contexts_are_not_read_only(analyser: BashAnalyser, command: str) -> None:
    result = analyser.classify(command, floor=True)
    assert not result.read_only, result.reasons
    assert result.decision_hint == "ask"
    assert result.reasons


@pytest.mark.parametrize("command", READ_ONLY)
def test_literal_contexts_stay_read_only(analyser: BashAnalyser, command: str) -> None:
    result = analyser.classify(command, floor=True)
    assert result.read_only, result.reasons


async def test_each_code_running_case_really_runs_code(host: SandboxHost, scratch: Path) -> None:
    survived = await _survivors(host, scratch, RUNS_CODE)
    harmless = [command for command, alive in zip(RUNS_CODE, survived, strict=True) if alive]
    assert harmless == [], "these cases did not run the hidden command in bash"


async def test_each_read_only_case_really_runs_nothing(host: SandboxHost, scratch: Path) -> None:
    survived = await _survivors(host, scratch, READ_ONLY)
    ran = [command for command, alive in zip(READ_ONLY, survived, strict=True) if not alive]
    assert ran == [], "these cases ran the hidden command"
