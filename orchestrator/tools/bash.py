"""The Bash tool: commands in the session's persistent shell, or one-shot when read-only.

This file is the tool (schema, model-facing text, the one timeout rule, rendering); the shell
itself (processes, output capture, killing) is `orchestrator.tools.shell`. Whether a command is
read-only is not decided here: the policy layer passes a classifier. Without one every call
is treated as writing, so none runs concurrently.

A subagent's worker builds it without `run_in_background` (no tasks to keep one in), and a
read-only worker without the persistent shell (every command one-shot); its description and
schema say only what that Bash does (`bash_description`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import trio
from pydantic import Field, model_validator

from orchestrator.aio import closing_iter
from orchestrator.errors import ToolError
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.tools.shell import (
    OutputCapture,
    PersistentShell,
    ShellRun,
    StreamingRun,
    shell_environment,
)
from policies.facts import ToolFacts
from sandbox.process.child import KILL_GRACE_S

__all__ = [
    "BACKGROUND_TIMEOUT_MS",
    "DEFAULT_TIMEOUT_MS",
    "MAX_BACKGROUND_TIMEOUT_MS",
    "MAX_OUTPUT_CHARS",
    "MAX_TIMEOUT_MS",
    "TIMEOUT_MARGIN_S",
    "BashInput",
    "BashTool",
    "bash_description",
    "command_timeout_s",
]

DEFAULT_TIMEOUT_MS = 120_000
"""Time limit of a command when the model gives none (milliseconds)."""
MAX_TIMEOUT_MS = 600_000
"""The largest time limit the model may ask for (milliseconds)."""
BACKGROUND_TIMEOUT_MS = 1_800_000
"""Time limit of a background command when the model gives none (milliseconds)."""
MAX_BACKGROUND_TIMEOUT_MS = 7_200_000
"""The largest time limit of a background command (milliseconds)."""
NOTIFICATION_TAIL_CHARS = 4_000
"""Characters of a background command's last output its notification carries."""
UNSANDBOXED_REFUSED = (
    "dangerouslyDisableSandbox is accepted and ignored: Warren runs every command inside its "
    "sandbox (the workspace, no network, secrets hidden); nothing ran outside it. If the "
    "command needs more than the sandbox gives, say what to the user."
)

TIMEOUT_MARGIN_S = 2 * KILL_GRACE_S + 1.0
"""Added to the command's limit for the pipeline's outer limit: room to kill the command's group
(SIGTERM, grace, SIGKILL, reap) and report, so the outer limit never cuts the kill short."""

MAX_OUTPUT_CHARS = 30_000
"""Characters of stdout, and separately of stderr, the model gets (head and tail kept)."""

SHELL_RESOURCE = "shell"
"""Key of the persistent shell among the session's resources."""

_PERSISTENT = """\
- The shell persists between calls: the working directory, exported variables and shell
  functions carry over (`cd`, `export`, `source .venv/bin/activate`). Other shell state (plain
  variables, `set` options, traps) does not. Prefer absolute paths over `cd`; the shell stays
  inside the workspace, and a `cd` outside it is undone.
"""
_ONE_SHOT = """\
- Each command runs in a fresh shell that starts in the working directory: nothing carries
  over to the next call (`cd`, `export`, functions). Use absolute paths, or `cd DIR && cmd` in
  one command.
"""
_JOBS = """\
- A command ends when its main process ends. A job started in the background (`cmd &`) keeps
  running, but its output after that is lost: redirect it to a file (`cmd > log 2>&1 &`).
"""
_NO_JOBS = """\
- A command ends when its main process ends; whatever it started (`cmd &`, `nohup`, `setsid`)
  is killed then.
"""
_BACKGROUND = f"""\
- `run_in_background: true` starts the command and returns at once with its task id and the
  path of its output file (stdout and stderr together); you get a <task-notification> when it
  exits. Use it for what runs long or forever while you go on: a dev server, a test watcher,
  a long build. Do not use `&` for that. Read the output file with Read, wait for a line in
  it with Monitor (`tail -f FILE | grep --line-buffered READY`), stop it with TaskStop. Its
  `timeout` defaults to {BACKGROUND_TIMEOUT_MS} ms and may be up to
  {MAX_BACKGROUND_TIMEOUT_MS} ms. It starts from the shell's current directory and exports
  but changes neither. Do not edit files a background command is writing: its writes are
  recorded as its own change set, and yours would be mixed into it.
"""


def bash_description(*, persistent: bool = True, backgrounds: bool = True) -> str:
    """The model-facing text of a Bash tool: with the persistent shell's rules or the one-shot
    shell's (`persistent`), with `run_in_background` or without (`backgrounds`)."""
    shell = "in a persistent shell session" if persistent else "in a fresh shell"
    return f"""\
Runs a bash command {shell} and returns its stdout, stderr and exit code.

Use it for what needs a shell: builds, tests, linters, package managers, git, running programs.
Do not use it to read or search files: use Read (not cat/head/tail), Grep (not grep/rg), Glob
(not find), LS (not ls) and Edit or Write (not sed/awk/echo >). Those tools are faster, safer
and their output is shaped for you.

{(_PERSISTENT if persistent else _ONE_SHOT).rstrip()}
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
{(_JOBS if persistent else _NO_JOBS).rstrip()}
- Chain dependent commands with `&&`; use `;` only when a failure should not stop the rest.
- A command with a bash syntax error is not run; you get the parser's message.
- `description`: say in 5-10 words what the command does (shown to the user).
{_BACKGROUND if backgrounds else ""}\
- `dangerouslyDisableSandbox` is accepted and ignored: every command runs in the sandbox.
"""


DESCRIPTION = bash_description()
"""The main agent's Bash: the persistent shell, `run_in_background` offered."""


class BashInput(ToolInput):
    command: str = Field(min_length=1, description="The bash command to run.")
    timeout: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BACKGROUND_TIMEOUT_MS,
        description=f"Optional timeout in milliseconds (default {DEFAULT_TIMEOUT_MS}, "
        f"max {MAX_TIMEOUT_MS} for a foreground command; in the background default "
        f"{BACKGROUND_TIMEOUT_MS}, max {MAX_BACKGROUND_TIMEOUT_MS}).",
    )
    description: str | None = Field(
        default=None, description="What this command does, in 5-10 words."
    )
    run_in_background: bool = Field(
        default=False,
        description="Run the command in the background: the call returns at once with its "
        "task id and output file, and you are notified when it exits.",
    )
    dangerouslyDisableSandbox: bool = Field(  # Claude Code's spelling
        default=False,
        description="Accepted and ignored: every command runs inside the sandbox.",
    )

    @model_validator(mode="after")
    def _foreground_limit(self) -> BashInput:
        too_long = self.timeout is not None and self.timeout > MAX_TIMEOUT_MS
        if too_long and not self.run_in_background:
            raise ValueError(
                f"timeout may be at most {MAX_TIMEOUT_MS} ms for a foreground command "
                f"({MAX_BACKGROUND_TIMEOUT_MS} with run_in_background)"
            )
        return self


def command_timeout_s(input: BashInput) -> float:
    """The command's own time limit in seconds: the model's `timeout`, or the default (a
    background command's when it runs in the background)."""
    default = BACKGROUND_TIMEOUT_MS if input.run_in_background else DEFAULT_TIMEOUT_MS
    return (input.timeout if input.timeout is not None else default) / 1000


class BashTool(Tool[BashInput]):
    """`Bash(command, timeout?, description?)`."""

    name = "Bash"
    facts = ToolFacts(family="exec", command_field="command")
    input_model = BashInput
    description = DESCRIPTION

    def __init__(
        self,
        classifier: Callable[[str], bool] | None = None,
        *,
        backgrounds: bool = True,
        persistent: bool = True,
    ) -> None:
        """`classifier(command)` says whether a command is read-only (the policy layer's
        analyser); read-only calls may run concurrently, each in a one-shot shell.
        `backgrounds`: whether `run_in_background` is offered, in the description and the
        schema (a subagent's worker has no tasks to keep one in; a call that names it anyway
        is refused by `validate`). `persistent`: False runs every command in a one-shot shell
        and says so (a read-only worker, where nothing may outlive a call)."""
        self._classifier = classifier
        self._backgrounds = backgrounds
        self._persistent = persistent
        if not (backgrounds and persistent):
            self.description = bash_description(  # type: ignore[misc]
                persistent=persistent, backgrounds=backgrounds
            )

    def input_schema(self) -> dict[str, Any]:
        schema = super().input_schema()
        if not self._backgrounds:
            properties = schema["properties"]
            del properties["run_in_background"]
            timeout = properties["timeout"]
            timeout["anyOf"][0]["maximum"] = MAX_TIMEOUT_MS
            timeout["description"] = (
                f"Optional timeout in milliseconds (default {DEFAULT_TIMEOUT_MS}, "
                f"max {MAX_TIMEOUT_MS})."
            )
        return schema

    async def validate(self, input: BashInput, ctx: ToolContext) -> str | None:
        """A background command is checked before it starts (its call returns at once): the
        syntax, as a foreground command's is when it runs."""
        if not input.run_in_background:
            return None
        if not self._backgrounds:
            return (
                "run_in_background is not available here (a subagent's commands end with its "
                "call); run the command in the foreground, with a timeout of at most "
                f"{MAX_TIMEOUT_MS} ms."
            )
        error = await _shell(ctx).syntax_error(input.command)
        if error is not None:
            return _syntax_refusal(error)
        return None

    def is_read_only(self, input: BashInput) -> bool:
        return self._classifier is not None and self._classifier(input.command)

    def timeout_s(self, input: BashInput) -> float:
        return command_timeout_s(input) + TIMEOUT_MARGIN_S

    async def call(
        self, input: BashInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        shell = _shell(ctx)
        if input.run_in_background:
            async with closing_iter(self._background(input, shell)) as events:
                async for event in events:
                    yield event
            return
        error = await shell.syntax_error(input.command)
        if error is not None:
            raise ToolError(_syntax_refusal(error))
        limit_s = command_timeout_s(input)
        notes: list[str] = []
        if input.dangerouslyDisableSandbox:
            notes.append(UNSANDBOXED_REFUSED)
        if not self._persistent or self.is_concurrency_safe(input):
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

    async def _background(
        self, input: BashInput, shell: PersistentShell
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        """The command's bytes as they come (`ToolProgress.data`), then how it ended: what a
        background task keeps (orchestrator/tasks/shells.py) while the model goes on.

        It starts from the persistent shell's directory and exports, in a one-shot bash
        (`PersistentShell.streaming`), so later calls do not wait for it; leaving early
        (the task stopped) kills it with everything it started."""
        limit_s = command_timeout_s(input)
        deadline = trio.current_time() + limit_s
        tail = OutputCapture(NOTIFICATION_TAIL_CHARS)
        timed_out = False
        run: StreamingRun
        async with shell.streaming(input.command) as run:
            while True:
                with trio.move_on_at(deadline) as late:
                    chunk = await run.read()
                if late.cancelled_caught:
                    timed_out = True
                    break
                if chunk is None:
                    break
                tail.feed(chunk)
                yield ToolProgress("", chunk)
        yield _background_end(run.exit_code, timed_out, limit_s, tail, input)

    def render_use(self, input: BashInput) -> str:
        lines = input.command.strip().splitlines() or [""]
        first = lines[0]
        if len(first) > 80:
            first = first[:79] + "…"
        elif len(lines) > 1:
            first += " …"
        return f"Bash({first})"


def _shell(ctx: ToolContext) -> PersistentShell:
    """The session's persistent shell (made at first use)."""
    return ctx.resource(
        SHELL_RESOURCE,
        lambda: PersistentShell(
            cwd=ctx.cwd, env=shell_environment(), output_limit=MAX_OUTPUT_CHARS
        ),
    )


def _syntax_refusal(error: str) -> str:
    return (
        f"The command was not run: bash cannot parse it.\n{error}\n"
        "Fix the syntax (quotes, brackets, `fi`/`done`/`esac`) and call Bash again."
    )


def _background_end(
    code: int | None, timed_out: bool, limit_s: float, tail: OutputCapture, input: BashInput
) -> ToolOutput:
    """How a background command ended, for its notification: the summary says it in a few
    words (`completed (exit code 0)`), the content adds its last output."""
    if timed_out:
        summary = f"timed out after {limit_s:g} s and was stopped"
    elif code == 0:
        summary = "completed (exit code 0)"
    elif code is None or code < 0:
        summary = "ended (exit code unknown)"
    elif code > 128:
        summary = f"was killed by signal {code - 128} (exit code {code})"
    else:
        summary = f"failed with exit code {code}"
    parts = [f"The command {summary}."]
    if tail.line_count:
        parts.append(f"Its last output:\n{tail.text().rstrip()}")
    else:
        parts.append("It printed nothing.")
    if input.dangerouslyDisableSandbox:
        parts.append(f"Note: {UNSANDBOXED_REFUSED}")
    return ToolOutput("\n".join(parts), is_error=timed_out or code != 0, summary=summary)


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
