"""Slash commands of the interactive session, one function each.

A command gets the REPL, the session and its argument text, prints what it has to say, and
returns None to stay in the session or an `Action` (`Exit`, `Reopen`) to leave it. An unknown
command gets the nearest known name as a suggestion.

The prompts the session's MCP servers offer are commands too, named as Claude Code names
them, `/mcp__<server>__<prompt> [arguments]` (`/<server>:<prompt>` is accepted as well): the
arguments, split as a shell splits words, fill the prompt's arguments in order (the last
takes the rest), and the text the server returns is sent as the user's prompt.

Reports that come from files the repository controls (policies, hooks, agent definitions)
are escaped before printing.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from rich.table import Table
from rich.text import Text

from orchestrator.cli.repl.actions import Action, CommandHost, Exit, Reopen
from orchestrator.errors import ModelError, SessionError
from orchestrator.model.catalog import resolve_model
from orchestrator.records.transcripts import SessionStore, SessionSummary
from orchestrator.session.config import MeteredModel, SessionConfig
from orchestrator.session.session import Session
from orchestrator.text import escape_controls
from policies.files import MODES
from policies.mode import ModeRefused

if TYPE_CHECKING:
    import mcp_types

    from orchestrator.workflows.runs import WorkflowRuns


__all__ = [
    "COMMANDS",
    "Command",
    "mcp_prompt_commands",
    "mcp_prompt_usage",
    "run_command",
    "suggest",
]

Handler = Callable[[CommandHost, Session, str], Awaitable[Action | None]]


@dataclass(frozen=True)
class Command:
    summary: str
    handler: Handler


def _say(repl: CommandHost, text: str, style: str = "") -> None:
    repl.console.print(Text(escape_controls(text, keep_lines=True), style))


async def _help(repl: CommandHost, session: Session, arg: str) -> Action | None:
    table = Table(box=None, show_header=False, padding=(0, 2))
    for name, command in COMMANDS.items():
        table.add_row(Text(f"/{name}", "bold cyan"), command.summary)
    for name, (_, prompt) in mcp_prompt_commands(session).items():
        usage = mcp_prompt_usage(name, prompt).removeprefix(f"/{name}").strip()
        table.add_row(Text(escape_controls(f"/{name}"), "bold cyan"), escape_controls(usage))
    repl.console.print(table)
    _say(
        repl,
        "!COMMAND runs a command in the workspace's shell and adds its output to the "
        "conversation. @path names a file for the model.\n"
        "Keys: Enter sends · Esc Enter (or a trailing \\) starts a new line · "
        "Esc interrupts a running turn · Ctrl-C twice or Ctrl-D exits.",
        "dim",
    )
    return None


async def _exit(repl: CommandHost, session: Session, arg: str) -> Action | None:

    return Exit()


async def _clear(repl: CommandHost, session: Session, arg: str) -> Action | None:

    config = _config(session.config, session, resume=None, continue_last=False)
    return Reopen(config, note=f"(the conversation {session.session_id} is kept; /resume finds it)")


async def _compact(repl: CommandHost, session: Session, arg: str) -> Action | None:
    try:
        compaction = await repl.turn(
            lambda: session.compact(arg.strip() or None), status="Compacting"
        )
    except (SessionError, ModelError) as exc:
        _say(repl, f"Not compacted: {exc}", "yellow")
        return None
    _say(
        repl,
        f"Compacted: ~{compaction.pre_tokens:,} → ~{compaction.post_tokens:,} tokens "
        f"({len(compaction.messages)} messages now).",
        "green",
    )
    return None


async def _cost(repl: CommandHost, session: Session, arg: str) -> Action | None:
    model = session.model
    if not isinstance(model, MeteredModel):
        _say(repl, "No cost is counted in this session (no broker is wired in).", "yellow")
        return None
    used = model.usage
    _say(
        repl,
        f"Total cost: ${model.cost_usd:.4f} (the main agent and every subagent)\n"
        f"Tokens: {used.input_tokens:,} input · {used.output_tokens:,} output · "
        f"{used.cache_creation_input_tokens:,} cache write · "
        f"{used.cache_read_input_tokens:,} cache read",
    )
    limit = session.limits.max_budget_usd
    if limit is not None:
        _say(repl, f"Budget: ${limit:.2f} ({model.cost_usd / limit:.0%} used)", "dim")
    return None


async def _context(repl: CommandHost, session: Session, arg: str) -> Action | None:
    used, window = session.context_usage()
    share = used / window if window else 0.0
    width = 30
    filled = min(width, round(share * width))
    bar = Text("█" * filled, "magenta")
    bar.append("░" * (width - filled), style="dim")
    bar.append(
        f"  ~{used:,} of {window:,} tokens ({share:.0%}) · compacts at "
        f"{session.compactor.threshold:.0%} · {len(session.history)} messages"
    )
    repl.console.print(bar)
    return None


async def _model(repl: CommandHost, session: Session, arg: str) -> Action | None:

    name = arg.strip()
    if not name:
        _say(repl, f"Model: {session.model.model}. Switch with /model NAME (sonnet, opus, haiku "
             "or a model id); the conversation continues.")  # fmt: skip
        return None
    resolved = resolve_model(name)
    config = _config(session.config, session, model=resolved, resume=session.session_id)
    return Reopen(config, note=f"(continuing on {resolved})")


async def _permissions(repl: CommandHost, session: Session, arg: str) -> Action | None:
    live = session.policy.permission_mode
    wanted = arg.strip()
    if wanted:
        try:
            mode = live.set(wanted)
        except ModeRefused as exc:
            _say(repl, f"{str(exc).capitalize()}.", "yellow")
            return None
        _say(repl, f"Mode for this session: {mode}.", "green")
        return None
    _say(repl, f"Mode: {live.current}  (switch with /permissions MODE: {', '.join(MODES)})")
    if not session.policy.effective.rules:
        _say(repl, "No rules: read-only calls run, the rest asks (see /policy).", "dim")
        return None
    table = Table(box=None, padding=(0, 2), header_style="dim")
    for column in ("kind", "rule", "from"):
        table.add_column(column)
    for entry in session.policy.effective.rules:
        kind = entry.kind if entry.active else f"{entry.kind} (untrusted: off)"
        table.add_row(
            Text(kind, {"deny": "red", "ask": "yellow"}.get(entry.kind, "green")),
            Text(escape_controls(entry.text)),
            Text(escape_controls(entry.source), "dim"),
        )
    repl.console.print(table)
    return None


async def _policy(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from policies import commands

    _say(repl, commands.show(session.config.cwd).text.rstrip())
    return None


async def _agents(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from orchestrator.agents.types import load_agent_types
    from orchestrator.errors import ConfigError
    from orchestrator.paths import WarrenDirs

    policy = session.policy
    try:
        types = load_agent_types(
            policy.engine.workspace,
            trusted=policy.effective.trust == "trusted",
            config_dir=(repl.parts.dirs or WarrenDirs.from_env()).config,
        )
    except ConfigError as exc:
        _say(repl, str(exc), "yellow")
        return None
    table = Table(box=None, padding=(0, 2), header_style="dim")
    for column in ("agent", "from", "tools", "what for"):
        table.add_column(column)
    for agent in types.values():
        table.add_row(
            Text(agent.name, "bold cyan"),
            Text(agent.source + (" (writable)" if agent.writable else ""), "dim"),
            Text(escape_controls(", ".join(agent.tools))),
            Text(escape_controls(agent.description)),
        )
    repl.console.print(table)
    return None


async def _tasks(repl: CommandHost, session: Session, arg: str) -> Action | None:
    """`/tasks`: the background tasks; `/tasks ID`: one, with the tail of its output;
    `/tasks stop ID`: end one."""
    from orchestrator.tasks.registry import TaskError
    from orchestrator.tasks.view import output_tail, task_rows

    registry = session.tasks
    if registry is None:
        _say(repl, "Background tasks are not available in this session.", "yellow")
        return None
    words = arg.split()
    if len(words) == 2 and words[0] == "stop":
        try:
            task = await registry.stop(words[1])
        except TaskError as exc:
            _say(repl, str(exc), "yellow")
            return None
        how = "was stopped" if task.status == "stopped" else f"had already ended ({task.status})"
        _say(repl, f"{task.id} ({escape_controls(task.description)}) {how}.")
        return None
    if len(words) == 1:
        found = registry.get(words[0])
        if found is None:
            _say(repl, f"No task is known by {escape_controls(words[0])!r}.", "yellow")
            return None
        [row] = task_rows([found])
        _say(repl, row)
        tail = await trio.to_thread.run_sync(output_tail, found)
        if tail:
            repl.console.print(Text(escape_controls(tail, keep_lines=True), "dim"))
        return None
    if words:
        _say(repl, "Usage: /tasks, /tasks ID, /tasks stop ID", "yellow")
        return None
    tasks = registry.tasks()
    if not tasks:
        _say(repl, "No background tasks in this session.", "dim")
        return None
    for row in task_rows(tasks):
        _say(repl, row)
    return None


def _workflow_runs(repl: CommandHost, session: Session) -> WorkflowRuns | None:
    if session.workflows is None:
        _say(repl, "Workflows need subagents, which this session does not run.", "yellow")
    return session.workflows


async def _workflows(repl: CommandHost, session: Session, arg: str) -> Action | None:
    """`/workflows`: this workspace's runs; `/workflows RUN_ID`: one, phase by phase;
    `/workflows resume RUN_ID`: resume a stopped run in the background."""
    from orchestrator.tasks.registry import TaskError
    from orchestrator.workflows.meta import WorkflowError
    from orchestrator.workflows.runs import RunStart
    from orchestrator.workflows.view import run_lines, run_rows

    runs = _workflow_runs(repl, session)
    if runs is None:
        return None
    words = arg.split()
    engines = {run_id: live.engine for run_id, live in runs.live.items()}
    try:
        if len(words) == 2 and words[0] == "resume":
            earlier = runs.earlier(words[1])
            live = runs.start(
                RunStart(runs.store.script(earlier.run_id), earlier.args, resume=earlier.run_id)
            )
            _say(repl, f"Resuming {earlier.run_id} as {live.record.run_id} in the background.")
            return None
        if len(words) == 1:
            record = runs.find(words[0])
            for line in run_lines(record, engines.get(record.run_id)):
                _say(repl, line)
            return None
    except (WorkflowError, TaskError) as exc:
        _say(repl, escape_controls(str(exc)), "yellow")
        return None
    if words:
        _say(repl, "Usage: /workflows, /workflows RUN_ID, /workflows resume RUN_ID", "yellow")
        return None
    found = runs.runs()
    if not found:
        saved = ", ".join(runs.saved_names()) or "none"
        _say(repl, f"No workflow runs in this workspace. Saved workflows: {saved}.", "dim")
        return None
    for row in run_rows(found, engines):
        _say(repl, row)
    return None


async def _workflow(repl: CommandHost, session: Session, arg: str) -> Action | None:
    """`/workflow NAME [ARGS]`: start a saved workflow in the background (ARGS, as one
    string, are its `args`); its result reaches the model with the next prompt."""
    from orchestrator.tasks.registry import TaskError
    from orchestrator.workflows.meta import WorkflowError
    from orchestrator.workflows.runs import RunStart

    runs = _workflow_runs(repl, session)
    name, _, rest = arg.strip().partition(" ")
    if runs is None:
        return None
    if not name:
        saved = ", ".join(runs.saved_names()) or "none"
        _say(repl, f"Usage: /workflow NAME [ARGS]. Saved workflows: {saved}.", "yellow")
        return None
    session.start_parts()
    try:
        live = runs.start(RunStart(runs.saved(name), rest.strip() or None, saved=name))
    except (WorkflowError, TaskError) as exc:
        _say(repl, escape_controls(str(exc)), "yellow")
        return None
    _say(repl, f"Workflow {name} started as {live.record.run_id}; /workflows {live.record.run_id}")
    return None


async def _doctor(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from sandbox.commands import doctor

    report = await repl.turn(
        lambda: trio.to_thread.run_sync(doctor, session.policy.home_allow()), status="Probing"
    )
    _say(repl, report.floor.render())
    return None


async def _hooks(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from policies import commands

    _say(repl, commands.hooks_list(session.config.cwd).text.rstrip())
    return None


async def _init(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from orchestrator.cli.repl.starter import write_starter_memory
    from policies import commands

    cwd = session.config.cwd

    def write() -> str:
        memory = write_starter_memory(cwd.resolve())
        return memory + "\n" + commands.init(cwd).text.rstrip()

    # Between sessions: `.warren/` is protected, and the guard of the running writable
    # sandbox removes what appears there, our own writes included.
    return Reopen(
        _config(session.config, session, resume=session.session_id, continue_last=False),
        note="(writing the starter files; the conversation continues)",
        between=write,
    )


async def _resume(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from orchestrator.cli.repl.input import CTRL_C, CTRL_D, prompt_line

    chosen = arg.strip()
    if not chosen:
        found = _list_sessions(repl, session)
        if not found:
            return None
        from prompt_toolkit import PromptSession

        typed = await prompt_line(PromptSession(), "resume which (number, Enter to stay) > ")
        if typed in (CTRL_C, CTRL_D) or not typed.strip():
            return None
        if not typed.strip().isdigit() or not 1 <= int(typed) <= len(found):
            _say(repl, f"No session {typed.strip()!r} in the list.", "yellow")
            return None
        chosen = found[int(typed) - 1].session_id
    if chosen == session.session_id:
        _say(repl, "That is this session.", "dim")
        return None
    return Reopen(_config(session.config, session, resume=chosen, continue_last=False))


async def _sessions(repl: CommandHost, session: Session, arg: str) -> Action | None:
    _list_sessions(repl, session)
    return None


async def _undo(repl: CommandHost, session: Session, arg: str) -> Action | None:
    from orchestrator.changes.undo import undo_last_turn

    recorder = session.changes
    if recorder is None:
        _say(repl, "This session records no changes.", "yellow")
        return None
    await recorder.settled()  # the last turn's record may still be on its way
    outcome = await trio.to_thread.run_sync(undo_last_turn, recorder.log, recorder.store)
    if outcome.undone:  # the model must not go on as if its changes were still there
        session.add_user_note(f"(The user ran /undo, which {outcome.message}.)")
    said = outcome.message[:1].upper() + outcome.message[1:] + "."
    _say(repl, said, "green" if outcome.undone else "yellow")
    return None


async def _expand(repl: CommandHost, session: Session, arg: str) -> Action | None:
    outputs = repl.outputs
    wanted = arg.strip()
    if not outputs:
        _say(repl, "No tool results yet.", "dim")
        return None
    if wanted and (not wanted.isdigit() or not 1 <= int(wanted) <= len(outputs)):
        _say(repl, f"No tool result {wanted!r}: they are numbered 1 to {len(outputs)}.", "yellow")
        return None
    number = int(wanted) if wanted else len(outputs)
    output = outputs[number - 1]
    lines = output.text.splitlines() or ["(no output)"]
    title = Text(f"[{number}] ", "bold cyan")
    title.append(escape_controls(output.display), style="bold red" if output.is_error else "bold")
    title.append(f"  {len(lines)} lines", style="dim")
    repl.console.print(title)
    shown = "\n".join(lines[:_EXPAND_LINES])
    repl.console.print(Text(escape_controls(shown, keep_lines=True)))
    if len(lines) > _EXPAND_LINES:
        _say(repl, f"… {len(lines) - _EXPAND_LINES} more lines not shown", "dim")
    return None


_EXPAND_LINES = 5_000
"""Lines of one result `/expand` prints."""


async def _mcp(repl: CommandHost, session: Session, arg: str) -> Action | None:
    servers = await session.mcp_servers()
    if servers is None or not servers.names():
        _say(repl, "No MCP servers in force here (`warren mcp add` adds one).", "dim")
        return None
    tools = [server for server, _ in servers.tools()]
    prompts = [server for server, _ in servers.prompts()]
    table = Table(box=None, padding=(0, 2), header_style="dim")
    for column in ("server", "status", "pid", "tools", "prompts", "problem"):
        table.add_column(column)
    for name in servers.names():
        status, error, pid = servers.status(name)
        config = servers.config(name)
        # `network = true` is a widening of the floor: shown wherever the server is.
        widened = " (host network)" if config is not None and config.network else ""
        table.add_row(
            Text(escape_controls(name), "bold cyan"),
            Text(status + widened, "green" if status == "ready" else "yellow"),
            "" if pid is None else str(pid),
            str(tools.count(name)),
            str(prompts.count(name)),
            Text(escape_controls(error or "")[:80], "red"),
        )
    repl.console.print(table)
    return None


COMMANDS: dict[str, Command] = {
    "help": Command("the commands and keys", _help),
    "clear": Command("start a new conversation (this one stays resumable)", _clear),
    "compact": Command("summarise the conversation now: /compact [instructions]", _compact),
    "cost": Command("tokens and cost of this session, subagents included", _cost),
    "context": Command("how full the model's context window is", _context),
    "model": Command("show or switch the model: /model [NAME]", _model),
    "permissions": Command("the mode and rules in force; /permissions MODE switches", _permissions),
    "policy": Command("the effective policy, each rule with its file", _policy),
    "agents": Command("the agent types dispatch_agent can start", _agents),
    "tasks": Command("background agents, shells, monitors: /tasks [ID] | /tasks stop ID", _tasks),
    "workflow": Command("start a saved workflow: /workflow NAME [ARGS]", _workflow),
    "workflows": Command(
        "workflow runs: /workflows [RUN_ID] | /workflows resume RUN_ID", _workflows
    ),
    "doctor": Command("prove the sandbox floor again", _doctor),
    "hooks": Command("the hooks in force with their files", _hooks),
    "init": Command("write a starter WARREN.md and .warren/policy.toml", _init),
    "resume": Command("continue an earlier conversation: /resume [ID]", _resume),
    "sessions": Command("earlier sessions in this repository", _sessions),
    "undo": Command("put back the files the last writing turn changed", _undo),
    "expand": Command("a tool result in full: /expand [N] (default: the last)", _expand),
    "mcp": Command("the MCP servers of this session: status, pid, tools", _mcp),
    "exit": Command("leave (the session stays resumable)", _exit),
}
"""Every slash command with its one-line summary (/help, completion)."""


def suggest(name: str) -> str | None:
    """The known command nearest to `name`, if any is near."""
    close = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.5)
    if close:
        return close[0]
    prefixed = [known for known in COMMANDS if known.startswith(name[:2])] if name else []
    return prefixed[0] if prefixed else None


def mcp_prompt_commands(session: Session | None) -> dict[str, tuple[str, mcp_types.Prompt]]:
    """The session's MCP prompts by command name (`mcp__server__prompt`): (server, prompt)."""
    servers = None if session is None else session.mcp
    if servers is None:
        return {}
    return {
        f"mcp__{server}__{prompt.name}": (server, prompt) for server, prompt in servers.prompts()
    }


def mcp_prompt_usage(name: str, prompt: mcp_types.Prompt) -> str:
    """`/name <required> [optional]` and the prompt's description (completion, errors)."""
    words = [f"<{a.name}>" if a.required else f"[{a.name}]" for a in prompt.arguments or []]
    said = " ".join(["/" + name, *words])
    return f"{said}  (MCP) {prompt.description or ''}".rstrip()


async def _mcp_prompt(
    repl: CommandHost,
    session: Session,
    name: str,
    server: str,
    prompt: mcp_types.Prompt,
    arg: str,
) -> Action | None:
    from orchestrator.mcp.servers import McpCallFailed

    servers = session.mcp
    assert servers is not None
    declared = [a.name for a in prompt.arguments or []]
    try:
        words = shlex.split(arg)
    except ValueError as exc:
        _say(repl, f"/{name}: {exc}", "yellow")
        return None
    if len(words) > len(declared) and declared:
        words = [*words[: len(declared) - 1], " ".join(words[len(declared) - 1 :])]
    missing = [a.name for a in (prompt.arguments or [])[len(words) :] if a.required]
    if missing or (words and not declared):
        _say(repl, f"usage: {mcp_prompt_usage(name, prompt)}", "yellow")
        return None
    values = dict(zip(declared, words, strict=False))
    try:
        text = await repl.turn(
            lambda: servers.get_prompt(server, prompt.name, values), status=f"Asking {server}"
        )
    except McpCallFailed as exc:
        _say(repl, str(exc), "yellow")
        return None
    _say(repl, f"(the prompt {prompt.name} of MCP server {server}: {len(text)} characters)", "dim")
    repl.show_result(await repl.turn(partial(session.run, text)))
    return None


async def run_command(repl: CommandHost, session: Session, text: str) -> Action | None:
    name, _, arg = text[1:].partition(" ")
    name = {"quit": "exit", "?": "help"}.get(name, name)
    command = COMMANDS.get(name)
    if command is None:
        server, colon, prompt_name = name.partition(":")
        key = f"mcp__{server}__{prompt_name}" if colon else name
        found = mcp_prompt_commands(session).get(key)
        if found is not None:
            return await _mcp_prompt(repl, session, key, *found, arg)
        nearest = suggest(name)
        hint = f" Did you mean /{nearest}?" if nearest else ""
        _say(repl, f"Unknown command /{name}.{hint} /help lists them.", "yellow")
        return None
    try:
        return await command.handler(repl, session, arg)
    except Exception as exc:  # a broken command must not end the session
        _say(repl, f"/{name} failed: {type(exc).__name__}: {exc}", "red")
        return None


def _config(config: SessionConfig, session: Session | None = None, **changes: Any) -> SessionConfig:
    """`config` with `changes`, validated again (aliases resolved, contradictions refused);
    with `session`, its current mode (`/permissions MODE`, an "always" for edits) is kept."""
    if session is not None and session.policy.mode != session.policy.effective.mode:
        changes.setdefault("permission_mode", session.policy.mode)
    return SessionConfig.model_validate({**config.model_dump(), **changes})


def _list_sessions(repl: CommandHost, session: Session) -> list[SessionSummary]:
    """Earlier sessions started in this workspace, newest first (at most 20), printed with
    the columns of `warren sessions` and a number to pick one by."""
    from orchestrator.cli.subcommands.sessions import session_rows

    store = SessionStore(session.transcript.path.parent)
    found = [
        summary
        for summary in store.summaries(session.config.cwd.resolve())
        if summary.session_id != session.session_id
    ][:20]
    if not found:
        _say(repl, "No earlier sessions in this repository.", "dim")
        return []
    header, *rows = session_rows(found)  # escaped there
    repl.console.print(Text(f"  #  {header}", "dim"), no_wrap=True, overflow="ellipsis")
    for number, row in enumerate(rows, 1):
        repl.console.print(Text(f"{number:>3}  {row}"), no_wrap=True, overflow="ellipsis")
    return found
