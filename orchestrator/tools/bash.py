"""The Bash tool: commands in the session's persistent shell, or one-shot when read-only.

This file is the tool (schema, model-facing text, the one timeout rule, rendering); the shell
itself (processes, output capture, killing) is `orchestrator.tools.shell`. Whether a command is
read-only is not decided here: the policy layer passes a classifier. Without one every call
is treated as writing, so none runs concurrently.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from pydantic import Field

from orchestrator.errors import ToolError
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.shell import PersistentShell, ShellRun, shell_environment
from policies.facts import ToolFacts
from sandbox.process.child import KILL_GRACE_S

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "MAX_OUTPUT_CHARS",
    "MAX_TIMEOUT_MS",
    "TIMEOUT_MARGIN_S",
    "BashInput",
    "BashTool",
    "command_timeout_s",
]

DEFAULT_TIMEOUT_MS = 120_000
"""Time limit of a command when the model gives none (milliseconds)."""
MAX_TIMEOUT_MS = 600_000
"""The largest time limit the model may ask for (milliseconds)."""

TIMEOUT_MARGIN_S = 2 * KILL_GRACE_S + 1.0
"""Added to the command's limit for the pipeline's outer limit: room to kill the command's group
(SIGTERM, grace, SIGKILL, reap) and report, so the outer limit never cuts the kill short."""

MAX_OUTPUT_CHARS = 30_000
"""Characters of stdout, and separately of stderr, the model gets (head and tail kept)."""

SHELL_RESOURCE = "shell"
"""Key of the persistent shell among the session's resources."""

DESCRIPTION = f"""\
Runs a bash command in a persistent shell session and returns its stdout, stderr and exit code.

Use it for what needs a shell: builds, tests, linters, package managers, git, running programs.
Do not use it to read or search files: use Read (not cat/head/tail), Grep (not grep/rg), Glob
(not find), LS (not ls) and Edit or Write (not sed/awk/echo >). Those tools are faster, safer
and their output is shaped for you.

- The shell persists between calls: the working directory, exported variables and shell
  functions carry over (`cd`, `export`, `source .venv/bin/activate`). Other shell state (plain
  variables, `set` options, traps) does not. Prefer absolute paths over `cd`; the shell stays
  inside the workspace, and a `cd` outside it is undone.
- Quote paths that contain spaces or special characters with double quotes:
  `cd "/repo/my dir"`, `pytest "tests/test a.py"`.
- Timeout: `timeout` is in milliseconds; the default is {DEFAULT_TIMEOUT_MS}
  ({DEFAULT_TIMEOUT_MS // 1000} s) and the maximum {MAX_TIMEOUT_MS} ({MAX_TIMEOUT_MS // 1000} s).
  On timeout the command and every process it started are killed; you get the output so far.
- Output: stdout and stderr are each cut to {MAX_OUTPUT_CHARS} characters, keeping the start
  and the end. For long output, filter it (`| tail -50`, `pytest -q`) or write it to a file and
  read the parts you need.
- Nothing is interactive: stdin is empty, there is no terminal, pagers and editors are
  disabled. Do not run commands that wait for input (`git rebase -i`, `vim`, `python` without a
  script, `read`); pass flags that make them non-interactive (`-y`, `--no-edit`).
- A command ends when its main process ends. A job started in the background (`cmd &`) keeps
  running, but its output after that is lost: redirect it to a file (`cmd > log 2>&1 &`).
- Chain dependent commands with `&&`; use `;` only when a failure should not stop the rest.
- A command with a bash syntax error is not run; you get the parser's message.
- `description`: say in 5-10 words what the command does (shown to the user).
"""


class BashInput(ToolInput):
    command: str = Field(min_length=1, description="The bash command to run.")
    timeout: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_MS,
        description=f"Optional timeout in milliseconds (default {DEFAULT_TIMEOUT_MS}, "
        f"max {MAX_TIMEOUT_MS}).",
    )
    description: str | None = Field(
        default=None, description="What this command does, in 5-10 words."
    )


def command_timeout_s(input: BashInput) -> float:
    """The command's own time limit in seconds: the model's `timeout`, or the default."""
    return (input.timeout if input.timeout is not None else DEFAULT_TIMEOUT_MS) / 1000


class BashTool(Tool[BashInput]):
    """`Bash(command, timeout?, description?)`."""

    name = "Bash"
    facts = ToolFacts(family="exec", command_field="command")
    input_model = BashInput
    description = DESCRIPTION

    def __init__(self, classifier: Callable[[str], bool] | None = None) -> None:
        """`classifier(command)` says whether a command is read-only (the policy layer's
        analyser); read-only calls may run concurrently, each in a one-shot shell."""
        self._classifier = classifier

    def is_read_only(self, input: BashInput) -> bool:
        return self._classifier is not None and self._classifier(input.command)

    def timeout_s(self, input: BashInput) -> float:
        return command_timeout_s(input) + TIMEOUT_MARGIN_S

    async def call(
        self, input: BashInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        shell = ctx.resource(
            SHELL_RESOURCE,
            lambda: PersistentShell(
                cwd=ctx.cwd, env=shell_environment(), output_limit=MAX_OUTPUT_CHARS
            ),
        )
        error = await shell.syntax_error(input.command)
        if error is not None:
            raise ToolError(
                f"The command was not run: bash cannot parse it.\n{error}\n"
                "Fix the syntax (quotes, brackets, `fi`/`done`/`esac`) and call Bash again."
            )
        limit_s = command_timeout_s(input)
        notes: list[str] = []
        if self.is_concurrency_safe(input):
            # Concurrent calls cannot share one shell; a one-shot shell starts from its state.
            run = await shell.run_oneshot(input.command, timeout_s=limit_s)
        else:
            run = await shell.run(input.command, timeout_s=limit_s)
            if not ctx.is_inside_roots(run.cwd):
                await shell.set_cwd(ctx.workspace)
                notes.append(
                    f"The command left the shell in {run.cwd}, outside the workspace; the "
                    f"working directory was reset to {ctx.workspace}."
                )
        yield _render(run, limit_s, notes)

    def render_use(self, input: BashInput) -> str:
        lines = input.command.strip().splitlines() or [""]
        first = lines[0]
        if len(first) > 80:
            first = first[:79] + "…"
        elif len(lines) > 1:
            first += " …"
        return f"Bash({first})"


def _render(run: ShellRun, limit_s: float, notes: list[str]) -> ToolOutput:
    """stdout, then labelled stderr, then the exit code when not 0, then notes."""
    parts: list[str] = []
    if run.stdout:
        parts.append(run.stdout.rstrip("\n"))
    if run.stderr:
        parts.append("[stderr]\n" + run.stderr.rstrip("\n"))
    if run.exit_code is None:
        parts.append("Exit code: unknown (the shell died)")
    elif run.exit_code != 0:
        parts.append(f"Exit code: {run.exit_code}")
    if run.timed_out:
        notes.insert(
            0,
            f"The command timed out after {limit_s:g} s and was killed with every process it "
            f"started; the output so far is shown. Pass a larger `timeout` (max "
            f"{MAX_TIMEOUT_MS} ms) or run it in the background with output to a file.",
        )
    if run.shell_reset:
        notes.append(
            "The shell was restarted: exported variables and functions were reset; the "
            f"working directory is {run.cwd}."
        )
    parts.extend(f"Note: {note}" for note in notes)
    status = (
        f"timed out after {limit_s:g} s"
        if run.timed_out
        else "exit code unknown"
        if run.exit_code is None
        else f"exit {run.exit_code}"
    )
    summary = f"{status} · {_lines(run.stdout_lines)} stdout, {_lines(run.stderr_lines)} stderr"
    return ToolOutput(
        content="\n".join(parts) if parts else "(no output)",
        is_error=run.timed_out or run.exit_code is None,
        summary=summary,
    )


def _lines(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"
