"""The Session: one object that owns a run's parts, so every front end wires them once.

`warren -p`, `warren demo` and the tests open a session and send it prompts:

    async with open_session(config, parts) as session:
        result = await session.run("fix the build")
        result = await session.run("now add a test")   # the same conversation

A session owns the floor report, the policy, the sandboxed tool hosts, the worker pool, the
model (a broker over the client when one is wired in, so budgets hold for every agent), the
transcript, the audit log, the log file and the event sinks. `open_session` builds them from a
`SessionConfig` (frozen, what the user chose) and `SessionParts` (what the composition root
plugs in: the tool hosts, the pool, the broker; tests inject fakes here instead of patching).
The REPL, hooks, `mcp serve` and a server process are meant to plug in at the same two seams.

State that cannot be written is translated once, here: at start-up it is a `StateUnwritable`
(a `ConfigError`: one line, exit 2, nothing ran); mid-run a failed transcript, audit or log
write interrupts the run, which ends `io_error` (exit 8).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import structlog
import trio
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.agents.types import (
    SubagentEvent,
    SubagentRunner,
    SubagentUpdate,
    load_agent_types,
)
from orchestrator.calls.denials import DenialLog
from orchestrator.calls.permissions import Asker, PermissionFn, headless_asker
from orchestrator.calls.pipeline import InProcessRunner, ToolPipeline, ToolRunner
from orchestrator.calls.policy import SessionPolicy, load_session_policy
from orchestrator.calls.terminal_asker import TerminalAsker
from orchestrator.changes import store_gc
from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.recorder import ChangeRecorder, RecordingRunner, change_log_path
from orchestrator.claude_code.output import (
    OutputFormat,
    OutputPrinter,
    ProgressPrinter,
    hook_errors,
)
from orchestrator.conversation.compaction import Compaction, Compactor
from orchestrator.conversation.context import (
    ContextSandbox,
    ContextSnapshot,
    MemorySources,
    context_spec,
    gather_context,
    system_prompt,
)
from orchestrator.conversation.loop import LoopConfig, ModelUsage, RunControl, RunResult, run_loop
from orchestrator.conversation.repair import normalize_for_api
from orchestrator.errors import ConfigError, SessionError, TranscriptWriteError
from orchestrator.events import (
    AssistantTurn,
    CompactBoundary,
    Event,
    EventSink,
    RetryScheduled,
    ToolResultsMessage,
)
from orchestrator.hooks.build import build_hook_runner
from orchestrator.hooks.runner import HookRunner, WarmHookHost
from orchestrator.limits import Limits
from orchestrator.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from orchestrator.model.base import ModelClient
from orchestrator.model.catalog import context_window, resolve_model
from orchestrator.paths import WarrenDirs
from orchestrator.records.audit import AuditLog
from orchestrator.records.logs import LogSink, configure_logging
from orchestrator.records.transcripts import SessionStore, Transcript
from orchestrator.session import startup_gc
from orchestrator.session.later import FirstResponseStarts, LaterSubagents, LaterToolHosts
from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from policies.claude_names import SUBAGENT_TOOL
from policies.files import Mode
from policies.pool import PoolBackend, PoolConfig, check_max_subagents, resolve_pool
from policies.sources import PolicyError

if TYPE_CHECKING:
    from orchestrator.claude_code.sdk_control import HostParts
    from orchestrator.mcp.deferred import DeferredMcp
    from orchestrator.mcp.servers import McpServers
    from orchestrator.model.switch import SwitchableModel
    from sandbox.probe import FloorReport, KnownFloor
    from sandbox.spare import SpareSource

__all__ = [
    "DEFAULT_MODEL",
    "AskerFactory",
    "BrokerFactory",
    "FloorNotProven",
    "MeteredModel",
    "RunnerFactory",
    "Session",
    "SessionConfig",
    "SessionParts",
    "StateUnwritable",
    "SubagentsFactory",
    "build_pool",
    "open_session",
]

DEFAULT_MODEL = "claude-sonnet-4-6"

SANDBOX_OFF_WARNING = (
    "warning: --sandbox=off: tool calls run directly on this machine, with your full "
    "permissions, network and secrets; only the permission checks stand between the model "
    "and your system."
)


@runtime_checkable
class MeteredModel(ModelClient, Protocol):
    """A model client that adds up what every request through it used (the broker)."""

    usage: Usage
    cost_usd: float


RunnerFactory = Callable[[ToolContext, SessionPolicy], AbstractAsyncContextManager[ToolRunner]]
"""Opens where tool calls run for one session (the CLI passes the sandboxed tool hosts)."""

SubagentsFactory = Callable[
    [ToolContext, SessionPolicy, ModelClient, Limits, PoolConfig],
    AbstractAsyncContextManager[SubagentRunner],
]
"""Opens the worker pool of one session, on the backend the `PoolConfig` names; the model it
gets is the session's (the broker, when one is wired in), so subagents share the session's
limits and budget."""

McpFactory = Callable[[ToolContext, SessionPolicy], AbstractAsyncContextManager["McpServers"]]
"""Starts the policy's MCP servers beside the session (the CLI passes them in the floor)."""
AskerFactory = Callable[[SessionPolicy, Callable[[str], Awaitable[object]]], Asker]
"""Makes the session's `Asker` from its policy (for "always" rules and mode changes) and the
Notification hooks (told each time the user is asked)."""

BrokerFactory = Callable[[ModelClient, Limits, Callable[[str], ModelClient] | None], MeteredModel]
"""Wraps the session's model client in the broker that enforces `Limits` for every agent; the
third argument makes the client for an agent type that names another model (None: the
session's model answers every request, as a scripted or injected one must)."""


class FloorNotProven(ConfigError):
    """`--sandbox=required` and the start-up probe could not prove the floor."""

    def __init__(self, report: str) -> None:
        super().__init__(
            "the sandbox floor is not proven on this machine, so no tool may run "
            "(--sandbox=required). The probe said:\n"
            + report
            + "\nFix the problem above (`warren doctor` re-checks), or run with --sandbox=off "
            "to run tools unsandboxed.",
            source="sandbox",
        )


class StateUnwritable(ConfigError):
    """Warren's state directory (sessions, logs, audit) cannot be written at start-up."""

    def __init__(self, path: Path, exc: OSError | TranscriptWriteError) -> None:
        why = exc.strerror or exc if isinstance(exc, OSError) else exc.message.rstrip(".")
        super().__init__(
            f"cannot write Warren's state in {path}: {why}. Free some space, "
            "or point XDG_STATE_HOME at a writable directory.",
            source="state",
        )


class SessionConfig(BaseModel):
    """Everything a session is configured with (the CLI fills it from flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cwd: Path
    """The workspace root: an absolute path to an existing directory."""
    model: str = DEFAULT_MODEL
    """A Claude model id or alias (`sonnet`, `opus`, `haiku`: resolved to the id here, so
    requests carry the real one), or `scripted:PATH` to replay a script. Default
    claude-sonnet-4-6."""
    output_format: OutputFormat = "text"
    """What goes to stdout: the final text, one JSON result, or one JSON event per line.
    Default `text`."""
    max_turns: int | None = Field(default=None, ge=1)
    """`--max-turns`; None: the policy's `limits.max_turns`, else `Limits`' default."""
    max_concurrency: int | None = Field(default=None, ge=1, le=64)
    """`--max-concurrency`; None: the policy's `limits.max_concurrency`, else the default."""
    max_budget_usd: float | None = Field(default=None, gt=0)
    """`--max-budget-usd`; None: the policy's `limits.max_budget_usd`, else no budget."""
    compact_threshold: float | None = Field(default=None, ge=0.5, le=0.95)
    """`--compact-threshold`; None: the policy's `limits.compact_threshold`, else 0.8."""
    max_thinking_tokens: int | None = Field(default=None, ge=1024)
    """`--max-thinking-tokens`: extended thinking with this budget per response; None: the
    policy's `limits.max_thinking_tokens`, else no extended thinking."""
    permission_mode: Mode | None = None
    """Overrides the policy files' `mode`: `default` (read-only calls run, others ask, which
    headless means deny), `accept-edits`, `plan`, `dont-ask`, `bypass`. Default: the policy's."""
    no_sandbox_consent: bool = False
    """`--i-know-there-is-no-sandbox`: let `bypass` run without a proven floor. Default off."""
    asks: Literal["deny", "terminal"] = "deny"
    """Who answers a call the policy asks about: nobody (deny, with a message saying how to
    allow it), or the user at the terminal (`/dev/tty`). Default `deny`."""
    allowed_tools: frozenset[str] = frozenset()
    """Rules allowed without asking (`--allowed-tools`). Default none."""
    disallowed_tools: frozenset[str] = frozenset()
    """Rules denied outright (`--disallowed-tools`). Default none."""
    resume: str | None = None
    """Session id to continue. Default: a new session."""
    continue_last: bool = False
    """Continue the most recent session started in `cwd`. Default off."""
    verbose: bool = False
    """Readable logs on stderr (structlog's console renderer). Default off."""
    progress: bool = False
    """Human progress lines (tool calls, results) on stderr. Default off."""
    fail_on_denial: bool = False
    """`--fail-on-denial`: a run that completed with denied calls ends `permission_denied`
    (exit 7) instead of `completed`. Default off (exit 0, as Claude Code's, the denials in
    the result)."""
    include_partial_messages: bool = False
    """`--include-partial-messages`: stream-json carries the model's text as it streams
    (`stream_event` lines, as Claude Code's). Default off."""
    mcp_configs: tuple[str, ...] = ()
    """`--mcp-config`: `.mcp.json` texts or paths whose servers join the command line's level.
    Default none."""
    fallback_model: str | None = None
    """`--fallback-model`: answers once the model is overloaded (`orchestrator.model.fallback`).
    An id or an alias. Default none."""
    sandbox: Literal["required", "off"] = "required"
    """`required` (default): prove the floor at start-up and run every tool call in a
    sandboxed tool host, refusing to run otherwise; `off`: run tools in this process, loudly."""
    system_prompt: str | None = None
    """`--system-prompt`: replaces Warren's base system prompt (`""`: none); the workspace
    context follows either way. Default None: Warren's."""
    append_system_prompt: str | None = None
    """`--append-system-prompt`: added after the base system prompt. Default none."""
    add_dirs: tuple[Path, ...] = ()
    """`--add-dir`: more writable roots (absolute), at the command line's level. Default none."""
    session_id: str | None = None
    """`--session-id`: the new session's id (a UUID not in use). Default: a fresh one."""
    fork_session: bool = False
    """`--fork-session`: a resumed conversation continues in a new session. Default off."""
    tools: tuple[str, ...] | None = None
    """`--tools`: the built-in tools offered (by name; `()`: none). Default None: all."""
    settings: str | None = None
    """`--settings`: a Claude Code settings file's path or JSON text, read at the command
    line's level. Default none."""
    setting_sources: frozenset[Literal["user", "project", "local"]] | None = None
    """`--setting-sources`: which Claude Code settings files and agent directories are read.
    Default None: all."""
    pool: PoolBackend | None = None
    """`--pool`: where subagents run, `local` or `ray` (the cluster at `RAY_ADDRESS`, else the
    policy's `[pool] address`); over the user's `[pool] backend`, never the managed one's.
    Default None: the policy's, else `local`."""

    @field_validator("model")
    @classmethod
    def _resolve_alias(cls, value: str) -> str:
        return resolve_model(value)

    @field_validator("fallback_model")
    @classmethod
    def _resolve_fallback(cls, value: str | None) -> str | None:
        return None if value is None else resolve_model(value)

    @model_validator(mode="after")
    def _consistent(self) -> SessionConfig:
        if self.resume and self.continue_last:
            raise ValueError("--resume and --continue cannot be used together; pick one")
        both = self.allowed_tools & self.disallowed_tools
        if both:
            raise ValueError(
                f"{', '.join(sorted(both))} is in both --allowed-tools and --disallowed-tools"
            )
        if not self.cwd.is_absolute():
            raise ValueError("cwd must be an absolute path")
        if self.fork_session and not (self.resume or self.continue_last):
            raise ValueError("--fork-session needs --resume or --continue")
        if self.session_id is not None:
            if (self.resume or self.continue_last) and not self.fork_session:
                raise ValueError(
                    "--session-id with --resume or --continue needs --fork-session (the "
                    "resumed session keeps its id)"
                )
            try:
                uuid.UUID(self.session_id)
            except ValueError:
                raise ValueError(f"--session-id {self.session_id!r} is not a UUID") from None
        return self


@dataclass(frozen=True)
class SessionParts:
    """What the composition root plugs into a session (each optional; tests inject fakes)."""

    dirs: WarrenDirs | None = None
    """Where state and config live. Default: from the environment (XDG)."""
    stdout: IO[str] | None = None
    """Where the output format writes. Default `sys.stdout`."""
    extra_sinks: tuple[EventSink, ...] = ()
    """More consumers of the run's events (the demo's timeline)."""
    tools: Callable[[], ToolRegistry] | None = None
    """Replaces the built-in tool set."""
    model: ModelClient | None = None
    """Replaces the model named in the config."""
    broker: BrokerFactory | None = None
    """Wraps the model so `Limits` (concurrency, budgets) hold for every agent. Without one,
    budgets are not enforced."""
    runner: RunnerFactory | None = None
    """The sandboxed tool hosts; required unless the config's sandbox is `off`."""
    subagents: SubagentsFactory | None = None
    """The worker pool behind `dispatch_agent`; without one there are no subagents."""
    on_subagent: Callable[[SubagentUpdate], None] | None = None
    """Called with every subagent update."""
    mcp: McpFactory | None = None
    """The policy's MCP servers; without it none start (and the policy's are ignored)."""
    asker: AskerFactory | None = None
    """Who answers the calls the policy asks about, given the session's policy and its
    Notification hooks (the REPL's dialogs). Default: the config's `asks`."""
    terminal: Path = Path("/dev/tty")
    """The user's terminal, where `asks="terminal"` asks. A server's session process has no
    controlling terminal and gets its client's by path (`/dev/pts/N`)."""
    host: HostParts | None = None
    """An SDK host drives the session (`--input-format stream-json`): its `initialize`'s hook
    callbacks and agent types join the session's, and it may switch the model
    (`Session.set_model`)."""
    known_floor: KnownFloor | None = None
    """A floor the warm server proved before it forked this session: used instead of the
    start-up probe when the session's own host has the same `floor_key` (else it probes)."""
    spares: SpareSource | None = None
    """The warm server's spare sandboxes, for the context probe (`ContextSandbox.spares`;
    the tool hosts get them through `runner`)."""
    start_at_once: bool = False
    """Start the tool hosts, the pool and the change scan at once (in the background) instead
    of once the first request is on its way (orchestrator/session/later.py): a session of the warm
    server, with nothing to import and spare tool hosts to adopt, so its first tool call finds
    them ready."""


def build_limits(config: SessionConfig, policy: SessionPolicy) -> Limits:
    """The session's limits: the command line over the policy's `[limits]` over defaults."""
    try:
        return Limits.build(
            {name: setting.value for name, setting in policy.effective.limits.items()},
            {
                "max_turns": config.max_turns,
                "max_concurrency": config.max_concurrency,
                "max_budget_usd": config.max_budget_usd,
                "compact_threshold": config.compact_threshold,
                "max_thinking_tokens": config.max_thinking_tokens,
            },
        )
    except ValueError as exc:
        raise ConfigError(str(exc), source="limits") from exc


def build_pool(
    config: SessionConfig, policy: SessionPolicy, environ: Mapping[str, str] | None = None
) -> PoolConfig:
    """The pool the session's subagents run in (`policies.pool.resolve_pool`: the managed
    policy, `--pool`, `RAY_ADDRESS`, the user's policy), and the policy's
    `limits.max_subagents` checked against it (10 locally, 64 on a cluster).

    **Errors:** `ConfigError` (one line naming the flag, variable or file).
    """
    effective = policy.effective
    try:
        pool = resolve_pool(effective.pool, config.pool, os.environ if environ is None else environ)
        setting = effective.limits.get("max_subagents")
        if setting is not None:
            check_max_subagents(int(setting.value), setting.source, pool)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return pool


def make_model(name: str, cwd: Path) -> ModelClient:
    """The model client a config names: a Claude model, or a scripted replay."""
    if name.startswith("scripted:"):
        from orchestrator.model.scripted import ScriptedModel

        path = Path(name.removeprefix("scripted:")).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return ScriptedModel.from_file(path, variables={"workspace": str(cwd)})
    from orchestrator.model.anthropic import AnthropicModel

    return AnthropicModel(model=name)


class Session:
    """One conversation: send prompts with `run`, stop the current one with `interrupt`.

    Made by `open_session`, which owns the parts; a `Session` only uses them.
    """

    def __init__(
        self,
        *,
        config: SessionConfig,
        policy: SessionPolicy,
        limits: Limits,
        transcript: Transcript,
        model: ModelClient,
        pipeline: ToolPipeline,
        printer: OutputPrinter,
        emit: EventSink,
        system: list[str],
        history: list[Message],
        io_guard: _IoGuard,
        denials: DenialLog | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        """The policy in force (the REPL shows its rules and switches its mode)."""
        self.limits = limits
        self.transcript = transcript
        self.model = model
        self.history = history
        """The conversation so far (a resumed session starts with its transcript's)."""
        self._pipeline = pipeline
        self._printer = printer
        self._emit = emit
        self._system = system
        self._io = io_guard
        self._denials = denials or DenialLog()
        self._control: RunControl | None = None
        self._start_context: list[str] = []
        """SessionStart hooks' context, added to the next prompt."""
        self.subagent_spend: dict[str, ModelUsage] = {}
        """Subagents' model turns in the current run, by model (the result's `modelUsage`)."""
        self.switch: SwitchableModel | None = None
        """Where `set_model` switches the model (sessions an SDK host drives)."""
        self.mcp_source: DeferredMcp | None = None
        """The session's MCP servers, started once the first model request is answered
        (orchestrator/mcp/deferred.py); None without servers."""
        self.changes: ChangeRecorder | None = None
        """The per-turn change sets (orchestrator/changes/recorder.py) behind `/undo`."""
        self.later: list[Callable[[], None]] = []
        """Starts the parts the first request does not need (tool hosts, pool, change scan:
        orchestrator/session/later.py), called when that request is on its way (`start_parts`)."""
        self._later_started = False
        self.compactor = Compactor(
            window=limits.context_window or context_window(model.model),
            threshold=limits.compact_threshold,
        )
        """Context accounting and compaction, kept across runs
        (orchestrator/conversation/compaction.py)."""

    @property
    def session_id(self) -> str:
        return self.transcript.session_id

    def set_model(self, name: str | None) -> str:
        """Answer the next requests with model `name` (an alias or id; None: the session's
        own), an SDK host's `set_model`; the model id chosen.

        **Errors:** `ValueError` for a model Warren does not know, or a session that no host
        drives.
        """
        if self.switch is None:
            raise ValueError("only a session an SDK host drives can switch its model")
        return self.switch.select(name)

    def interrupt(self) -> None:
        """Stop the current run: it ends `interrupted`, its transcript resumable. No effect
        between runs."""
        if self._control is not None:
            self._control.interrupt()

    async def run(self, prompt: str) -> RunResult:
        """Send `prompt` and run the agent loop until it ends; the result is printed in the
        config's output format and recorded in the transcript.

        **Cancellation:** `interrupt()` ends the run `interrupted`; an outer cancellation
        propagates (the transcript keeps every complete message).
        **Errors:** none for model, tool or state-writing failures: those are terminal
        reasons (`model_error`, `budget_exceeded`, `io_error`, ...).
        """
        control = RunControl()
        self._control = control
        self._io.control = control
        self._denials.take()  # a run reports its own denials only
        self.subagent_spend.clear()
        if self._io.failure is not None:  # an earlier run could not write: nor can this one
            control.interrupt()
        hooks = self._pipeline.hooks
        started = time.monotonic()
        context = list(self._start_context)
        self._start_context = []
        if hooks is not None:
            hooks.stop_requested = None
            with trio.CancelScope() as scope:
                control._scope = scope
                if control.interrupted:
                    scope.cancel()
                submitted = await hooks.user_prompt_submit(prompt)
            control._scope = None
            if submitted.blocked or hooks.stop_requested is not None:
                why = hooks.stop_requested or submitted.reason_text
                return self._finish(
                    self._rejected(f"The prompt was blocked by a hook: {why}", started)
                )
            context.extend(submitted.context)
        if self.mcp_source is not None and "@" in prompt:
            from orchestrator.mcp.resources import resolve_mentions

            servers = await self.mcp_servers()
            if servers is not None:
                context.extend(await resolve_mentions(prompt, servers))
        message = Message(
            role="user",
            content=[TextBlock(text=prompt), *(TextBlock(text=text) for text in context)],
        )
        self._io.write(lambda: self.transcript.message(message))
        self._io.write(lambda: self.transcript.note_prompt(prompt))
        spent = _spend(self.model)
        model: ModelClient = self.model
        starts = [] if self._later_started else [self.start_parts]
        if self.mcp_source is not None and not self.mcp_source.requested:
            starts.append(self.mcp_source.start)
        if starts:
            model = FirstResponseStarts(self.model, starts)
        try:
            result = await run_loop(
                model=model,
                messages=[*self.history, message],
                pipeline=self._pipeline,
                config=LoopConfig(
                    system=self._system,
                    max_turns=self.limits.max_turns,
                    max_concurrency=self.limits.max_concurrency,
                    max_tokens=self.limits.max_output_tokens,
                    thinking_budget=self.limits.max_thinking_tokens,
                    max_stop_hook_blocks=self.limits.max_stop_hook_blocks,
                ),
                emit=self._emit,
                control=control,
                compactor=self.compactor,
            )
        finally:
            self._control = None
            self._io.control = None
        result = _with_session_spend(result, self.model, spent)
        result = _with_subagent_models(result, self.subagent_spend)
        if self._io.failure is not None:
            result = dataclasses.replace(result, reason="io_error", result=self._io.failure)
        self.history = result.messages
        return self._finish(result)

    def _rejected(self, why: str, started: float) -> RunResult:
        """A run that never reached the model: a hook rejected its prompt."""
        return RunResult(
            "hook_blocked", list(self.history), 0, Usage(), 0.0, why,
            time.monotonic() - started,
        )  # fmt: skip

    @property
    def mcp(self) -> McpServers | None:
        """The session's MCP servers once they have been started (`start_mcp`,
        `mcp_servers`), else None."""
        return None if self.mcp_source is None else self.mcp_source.servers

    def start_mcp(self) -> None:
        """Start the MCP servers now, not after the first model request (the REPL: the user
        is typing)."""
        if self.mcp_source is not None:
            self.mcp_source.start()

    def start_parts(self) -> None:
        """Start the tool hosts, the worker pool and the change scan now, not once the first
        request is on its way (the REPL: the user is typing). Idempotent."""
        self._later_started = True
        startup_gc.resume()  # the start-up is over (orchestrator/session/startup_gc.py)
        for start in self.later:
            start()

    async def mcp_servers(self) -> McpServers | None:
        """The session's MCP servers, started now if they were not yet (each may still be
        starting); None when it has none."""
        return None if self.mcp_source is None else await self.mcp_source.ready()

    async def start(self) -> None:
        """Fire SessionStart (`startup`, or `resume` for a resumed conversation): what the
        hooks print joins the first prompt as context; `continue: false` makes the first run
        end `hook_blocked`."""
        hooks = self._pipeline.hooks
        if hooks is None:
            return
        outcome = await hooks.session_start("resume" if self.history else "startup")
        self._start_context.extend(outcome.context)

    def _finish(self, result: RunResult) -> RunResult:
        denials = self._denials.take()
        if denials:
            result = dataclasses.replace(result, permission_denials=denials)
            if self.config.fail_on_denial and result.reason == "completed":
                result = dataclasses.replace(result, reason="permission_denied")
        self._io.write(
            lambda: self.transcript.write(
                {
                    "type": "result",
                    "reason": result.reason,
                    "num_turns": result.num_turns,
                    "usage": result.usage.model_dump(),
                    "total_cost_usd": result.cost_usd,
                    "permission_denials": len(result.permission_denials),
                }
            )
        )
        self._io.write(lambda: self.transcript.note_run(result.num_turns, result.cost_usd))
        structlog.get_logger().info(
            "run finished", reason=result.reason, turns=result.num_turns, cost=result.cost_usd
        )
        # Last: stdout may be a terminal that is gone (SIGHUP); the transcript has it all.
        self._printer.finish(result)
        return result

    @property
    def tools(self) -> ToolRegistry:
        """The tools this session offers (built-in, `dispatch_agent`, MCP servers')."""
        return self._pipeline.tools

    async def call_tool(self, name: str, input: dict[str, Any]) -> ToolResultBlock:
        """Run one tool call from outside the conversation (`warren mcp serve`): the same
        pipeline as the model's calls (schema, hooks, policy, audit log, output cap, the
        floor); an ask is answered by the session's asker (a denial when headless).
        Never raises for a bad call: the result says what went wrong."""
        block = ToolUseBlock(id=f"toolu_ext_{uuid.uuid4().hex[:20]}", name=name, input=input)
        try:
            return await self._pipeline.execute(self._pipeline.prepare(block))
        finally:
            self._end_turn()

    def _end_turn(self) -> None:
        """A call from outside the loop is a turn of its own in the change log."""
        if self.changes is not None:
            self.changes.end_turn()

    def context_usage(self) -> tuple[int, int]:
        """Tokens the next request would hold (the last reported count plus what was added
        since, estimated) and the model's window: how full the context is (`/context`)."""
        account = self.compactor.account
        fixed = account.fixed_chars(self._system, self._pipeline.tools.specs())
        return account.estimate(self.history, fixed), self.compactor.window

    async def shell(self, command: str) -> ToolResultBlock:
        """Run a command the user typed (the REPL's `!command`) with the Bash tool in the
        read-write tool host: deny rules apply, nothing asks. The command and its output join
        the conversation as a user message, so the model sees them with the next prompt.

        **Cancellation:** propagates; the command is stopped and nothing is added.
        """
        block = ToolUseBlock(id=f"user_{uuid.uuid4().hex[:12]}", name="Bash", input={
            "command": command, "description": "typed by the user"
        })  # fmt: skip
        try:
            result = await self._pipeline.run_typed(block)
        finally:
            self._end_turn()
        output = result.content if isinstance(result.content, str) else "\n".join(
            b.text for b in result.content if isinstance(b, TextBlock)
        )  # fmt: skip
        self.add_user_note(
            f"<bash-input>{command}</bash-input>\n"
            f"<bash-{'stderr' if result.is_error else 'stdout'}>{output}"
            f"</bash-{'stderr' if result.is_error else 'stdout'}>"
        )
        return result

    def add_user_note(self, text: str) -> None:
        """Add a user message to the conversation (and the transcript) without running the
        loop: the next prompt follows it (consecutive user messages are merged for the API)."""
        message = Message.user_text(text)
        self._io.write(lambda: self.transcript.message(message))
        self.history = [*self.history, message]

    async def compact(self, instructions: str | None = None) -> Compaction:
        """Summarise the conversation now (the REPL's `/compact [instructions]`), between runs:
        the history becomes the compact boundary, recorded in the transcript.

        **Errors:** `ModelError` when the summary request fails (nothing changed);
        `SessionError` when there is nothing to compact yet.
        """
        if not self.history:
            raise SessionError("there is nothing to compact yet")
        compaction = await self.compactor.compact(
            normalize_for_api(list(self.history)),
            trigger="manual",
            model=self.model,
            system=self._system,
            tools=self._pipeline.tools.specs(),
            pipeline=self._pipeline,
            emit=self._emit,
            instructions=instructions,
        )
        self.history = compaction.messages
        return compaction


@asynccontextmanager
async def open_session(
    config: SessionConfig, parts: SessionParts | None = None
) -> AsyncIterator[Session]:
    """Build a session's parts, yield the `Session`, and close every part on the way out.

    **Cancellation:** leaving the block closes the tool hosts, the pool and the model,
    shielded and bounded (15 s); the transcript keeps every complete message.
    **Errors:** `FloorNotProven` when the sandbox is required but unproven; `StateUnwritable`
    when the state directory cannot be written; `ConfigError` for a bad model script, policy,
    session, directory or pool. A `ConfigError` raised once the tool hosts run (the pool
    refusing to open) leaves their nursery wrapped in a group: it is unwrapped here, so every
    front end prints it as the one line it is.
    """
    try:
        async with _open_session(config, parts) as session:
            yield session
    except BaseExceptionGroup as group:
        matched, rest = group.split(ConfigError)
        leaves = _leaves(matched) if matched is not None and rest is None else []
        if len(leaves) != 1:
            raise
        raise leaves[0] from None


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


@asynccontextmanager
async def _open_session(
    config: SessionConfig, parts: SessionParts | None
) -> AsyncIterator[Session]:
    parts = parts or SessionParts()
    dirs = parts.dirs or WarrenDirs.from_env()
    cwd = config.cwd.resolve()
    if not cwd.is_dir():
        raise ConfigError(f"{cwd} is not a directory", source="--cwd")
    io_guard = _IoGuard()
    async with AsyncExitStack() as stack:
        transcript, history = _open_transcript(config, dirs, cwd)
        stack.callback(io_guard.close, transcript.close)
        log_sink = _open_log(dirs, transcript.session_id, config.verbose, io_guard)
        stack.callback(io_guard.close, log_sink.close)
        audit = _open_audit(transcript, config)
        stack.callback(io_guard.close, audit.close)

        model = parts.model or make_model(config.model, cwd)
        # Closed here too: start-up may have made its SDK client (closing twice is harmless).
        stack.push_async_callback(_shielded, model.aclose)
        up = await _start_up(
            config, cwd, dirs, parts.runner, parts.known_floor, model, parts.spares
        )
        snapshot, floor, floor_state, policy = up.snapshot, up.floor, up.floor_state, up.policy
        if floor is not None:
            io_guard.write(
                lambda: audit.record(
                    "floor",
                    proven=floor.proven,
                    bwrap=floor.bwrap_path,
                    bwrap_version=floor.bwrap_version,
                    bwrap_source=floor.bwrap_source,
                    notes=list(floor.notes),
                )
            )
        audit.floor = floor_state
        audit.mode = policy.mode
        limits = build_limits(config, policy)
        pool_config = build_pool(config, policy)
        if config.fallback_model is not None and config.fallback_model != model.model:
            from orchestrator.model.fallback import FallbackModel

            model = FallbackModel(model, make_model(config.fallback_model, cwd))
        switch: SwitchableModel | None = None
        if parts.host is not None:
            from orchestrator.model.switch import SwitchableModel

            model = switch = SwitchableModel(model, lambda name: _host_model(config, name, cwd))
        if parts.broker is not None:
            # An agent type's `model` is sent to the API; a scripted or injected model is the
            # only one there is and answers every agent.
            scripted = parts.model is not None or config.model.startswith("scripted:")
            client_for = None if scripted else (lambda name: _host_model(config, name, cwd))
            model = parts.broker(model, limits, client_for)
        stack.push_async_callback(_shielded, model.aclose)
        registry = (
            parts.tools()
            if parts.tools is not None
            else builtin_tools(bash_classifier=policy.bash_classifier())
        )
        if config.tools is not None:
            registry = _only_tools(registry, config.tools)
        printer = OutputPrinter(
            config.output_format,
            transcript.session_id,
            parts.stdout or sys.stdout,
            partial=config.include_partial_messages,
        )
        denials = DenialLog()
        subagent_spend: dict[str, ModelUsage] = {}
        # Last out: the store's hold is let go, then a collection runs when one is due.
        stack.callback(store_gc.collect_when_due, dirs.state, dirs.objects, dirs.sessions)
        stack.enter_context(store_gc.hold(dirs.objects))
        changes = ChangeRecorder(
            (cwd, *policy.writable_roots()),
            ContentStore(dirs.objects),
            change_log_path(transcript.path),
            write=lambda step: io_guard.write(step, "change log"),
            index_dir=dirs.state / "scans",
            skip=(dirs.state, dirs.config),
        )
        stack.callback(changes.close)
        stack.callback(changes.end_turn)  # a turn cut short by the session's end
        # After-scans and records off the calls' path; what is queued is done before the two
        # callbacks above run.
        await stack.enter_async_context(changes.running())
        sinks: list[EventSink] = [
            denials,
            changes,
            io_guard.sink(_transcript_sink(transcript)),
            io_guard.sink(audit),
            printer,
            *parts.extra_sinks,
        ]
        if config.progress:
            sinks.append(ProgressPrinter(sys.stderr))
        else:
            sinks.append(hook_errors(sys.stderr))
        emit = _Fanout(sinks)
        ctx = ToolContext(
            workspace=cwd,
            cwd=cwd,
            session_id=transcript.session_id,
            extra_roots=policy.writable_roots(),
            read_deny=policy.read_deny_rules(),
        )
        stack.push_async_callback(_shielded, ctx.aclose)
        sandboxed = floor_state == "proven"
        runner = await stack.enter_async_context(
            parts.runner(ctx, policy)
            if parts.runner is not None and sandboxed
            else _in_process(ctx)
        )
        permission = policy.permission_fn()
        hooks = build_hook_runner(
            policy,
            workspace=cwd,
            sandboxed=sandboxed,
            session_id=transcript.session_id,
            transcript_path=str(transcript.path),
            extra_roots=ctx.extra_roots,
            emit=emit,
            warm=runner if isinstance(runner, WarmHookHost) else None,
            host_hooks=parts.host.hooks if parts.host is not None else (),
        )
        asker: Asker = (
            parts.asker(policy, hooks.notification)
            if parts.asker is not None
            else TerminalAsker(policy, tty=parts.terminal, notify=hooks.notification)
            if config.asks == "terminal"
            else headless_asker
        )
        if parts.mcp is not None and policy.effective.mcp_servers:
            from orchestrator.mcp.deferred import DeferredMcp  # no MCP SDK until they start

            open_mcp = parts.mcp
            servers = await stack.enter_async_context(
                DeferredMcp(
                    lambda: open_mcp(ctx, policy),
                    [name for name, _, _ in policy.effective.mcp_servers],
                ).running()
            )
            registry = ToolRegistry(list(registry), [servers])
        else:
            servers = None
        pool: SubagentRunner | None = None
        if (
            parts.subagents is not None
            and sandboxed
            and limits.max_subagents > 0
            and (config.tools is None or SUBAGENT_TOOL in config.tools)
        ):
            pool = await stack.enter_async_context(
                parts.subagents(ctx, policy, model, limits, pool_config)
            )
            dispatch = _dispatch_tool(
                pool,
                registry,
                policy,
                dirs,
                permission,
                asker,
                context=snapshot.render(),
                on_update=_subagent_sink(
                    printer, io_guard.sink(audit), denials, subagent_spend, parts.on_subagent
                ),
                hooks=hooks,
                max_stop_hook_blocks=limits.max_stop_hook_blocks,
                output_cap=limits.max_tool_output_chars,
                claude_sources=(
                    ("user", "project")
                    if config.setting_sources is None
                    else tuple(config.setting_sources)
                ),
                sdk_agents=parts.host.agents if parts.host is not None else None,
            )
            registry = registry.with_tools([dispatch])
        # What the first request does not need starts once it is on its way (Session.run).
        later = [
            part.start
            for part in (runner, pool)
            if isinstance(part, LaterToolHosts | LaterSubagents)
        ]
        if _may_write(policy.mode, registry, servers is not None, changes.tree.roots):
            later.append(changes.tree.start)  # the first scan overlaps the first request
        printer.init(
            cwd=str(cwd),
            model=model.model,
            tools=registry.names(),
            transcript=str(transcript.path),
            permission_mode=policy.mode,
            # Claude Code's word for a server not connected yet: none has started at init.
            mcp_servers=[
                {"name": name, "status": "pending"}
                for name, _, _ in (policy.effective.mcp_servers if servers is not None else ())
            ],
            sandbox=floor_state,
        )
        pipeline = ToolPipeline(
            runner=RecordingRunner(runner, changes),
            tools=registry,
            ctx=ctx,
            permission=permission,
            asker=asker,
            assessor=policy.assessor(),
            emit=emit,
            default_timeout_s=limits.tool_timeout_s,
            output_cap=limits.max_tool_output_chars,
            hooks=hooks,
        )
        structlog.get_logger().bind(session_id=transcript.session_id).info(
            "session opened", model=model.model, cwd=str(cwd), resumed=bool(history)
        )
        if io_guard.failure is not None:
            raise ConfigError(
                f"{io_guard.failure}. Free some space, or point XDG_STATE_HOME at a writable "
                "directory.",
                source="state",
            )
        session = Session(
            config=config,
            policy=policy,
            limits=limits,
            transcript=transcript,
            model=model,
            pipeline=pipeline,
            printer=printer,
            emit=emit,
            system=system_prompt(
                snapshot, base=config.system_prompt, append=config.append_system_prompt
            ),
            history=history,
            io_guard=io_guard,
            denials=denials,
        )
        session.subagent_spend = subagent_spend
        session.changes = changes
        session.mcp_source = servers
        session.switch = switch
        session.later = later
        if parts.start_at_once:
            session.start_parts()
        if hooks.has("SessionEnd"):
            stack.push_async_callback(_shielded, _session_end(hooks))
        await session.start()
        yield session


# --- builders -------------------------------------------------------------------------------


def _host_model(config: SessionConfig, name: str, cwd: Path) -> ModelClient:
    """A client for another model than the session's (an SDK host switched to it, or an agent
    type names it), with the session's fallback."""
    model = make_model(name, cwd)
    if config.fallback_model is not None and config.fallback_model != model.model:
        from orchestrator.model.fallback import FallbackModel

        model = FallbackModel(model, make_model(config.fallback_model, cwd))
    return model


def _open_transcript(
    config: SessionConfig, dirs: WarrenDirs, cwd: Path
) -> tuple[Transcript, list[Message]]:
    """A new transcript, or the resumed one with its history."""
    store = SessionStore(dirs.sessions)
    try:
        if not (config.resume or config.continue_last):
            return _create_transcript(store, config, cwd), []
        session_id = config.resume or store.latest_for(cwd)
        if session_id is None:
            raise ConfigError(f"no earlier session in {cwd} to continue", source="--continue")
        try:
            loaded = store.load(session_id)
        except SessionError as exc:
            raise ConfigError(str(exc), source="--resume") from exc
        if config.fork_session:  # the conversation goes on in a new session; the old one stays
            transcript = _create_transcript(store, config, cwd)
            try:
                transcript.write({"type": "fork", "from_session": session_id})
                for message in loaded.messages:
                    transcript.message(message)
            except (OSError, TranscriptWriteError):
                transcript.close()
                raise
            return transcript, list(loaded.messages)
        transcript = store.open(session_id)
        try:
            transcript.write({"type": "resume", "skipped_lines": loaded.skipped_lines})
        except (OSError, TranscriptWriteError):
            transcript.close()
            raise
        return transcript, list(loaded.messages)
    except (OSError, TranscriptWriteError) as exc:
        raise StateUnwritable(dirs.sessions, exc) from exc


def _may_write(mode: str, registry: ToolRegistry, mcp: bool, roots: Sequence[Path]) -> bool:
    """Whether a call of this session can change the writable roots at all: not in plan mode
    (until the user leaves it: the first writing call then scans, and waits), not with only
    reading tools, not on read-only file systems. The first scan costs a whole tree's read:
    a session that cannot write does not pay it."""
    if mode == "plan":
        return False
    if not mcp and all(tool.facts.family in ("read", "meta") for tool in registry):
        return False
    return any(not _read_only_fs(root) for root in roots)


def _read_only_fs(root: Path) -> bool:
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return True  # a root that is not there: nothing in it to record


def _only_tools(registry: ToolRegistry, names: tuple[str, ...]) -> ToolRegistry:
    """The built-in tools `--tools` names; a name that is no tool is an error naming it."""
    known = {*registry.names(), SUBAGENT_TOOL}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(
            f"no tool named {', '.join(unknown)} (known: {', '.join(sorted(known))})",
            source="--tools",
        )
    return registry.only(lambda tool: tool.name in names)


def _create_transcript(store: SessionStore, config: SessionConfig, cwd: Path) -> Transcript:
    try:
        return store.create(cwd=cwd, model=config.model, session_id=config.session_id)
    except SessionError as exc:
        raise ConfigError(str(exc), source="--session-id") from exc


def _open_log(dirs: WarrenDirs, session_id: str, verbose: bool, io_guard: _IoGuard) -> LogSink:
    try:
        return configure_logging(
            log_file=dirs.logs / f"{session_id}.log", verbose=verbose, on_error=io_guard.failed
        )
    except OSError as exc:
        raise StateUnwritable(dirs.logs, exc) from exc


def _open_audit(transcript: Transcript, config: SessionConfig) -> AuditLog:
    path = transcript.path.with_suffix(".audit.jsonl")
    try:
        return AuditLog(path, mode=config.permission_mode or "(policy)", floor="unproven")
    except OSError as exc:
        raise StateUnwritable(path.parent, exc) from exc


async def _start_up(
    config: SessionConfig,
    cwd: Path,
    dirs: WarrenDirs,
    runner: RunnerFactory | None,
    known_floor: KnownFloor | None = None,
    model: ModelClient | None = None,
    spares: SpareSource | None = None,
) -> _StartedUp:
    """Everything a run needs before its first request. The SDK import (about a second) runs
    while the floor probe, the policy and then the context snapshot follow one another: the
    snapshot is workspace content, gathered in a read-only sandbox under the loaded policy
    (issue 9: nothing from the repository is read or run on the host). A `known_floor` of
    the same host stands in for the probe (`sandbox.probe.reuse_floor`), and its host for
    detecting one when this process's environment would find the same (`reuse_known`); the
    `model`'s SDK client is made meanwhile, in a thread. With the warm server's `spares`,
    the snapshot's sandbox is a spare started ahead of the session when one matches
    (`orchestrator.conversation.context.ContextSandbox`)."""
    started: list[_StartedUp] = []
    failure: list[Exception] = []

    async def probe_then_context() -> None:
        try:
            floor: FloorReport | None = None
            host = None
            if config.sandbox == "required":
                from sandbox.host import detect_host
                from sandbox.probe import probe_floor, reuse_floor, reuse_known

                reused = reuse_known(known_floor)
                if reused is not None:
                    host, floor = reused
                else:
                    try:
                        host = await detect_host()
                    except Exception:  # the probe reports a missing bwrap itself
                        host = None
                    if host is not None:
                        floor = reuse_floor(known_floor, host)
                    if floor is None:
                        floor = await probe_floor(host=host)
            state = _floor_state(config, floor, runner)
            policy = load_session_policy(
                cwd,
                floor_proven=state == "proven",
                permission_mode=config.permission_mode,
                allowed_tools=config.allowed_tools,
                disallowed_tools=config.disallowed_tools,
                no_sandbox_consent=config.no_sandbox_consent,
                add_dirs=config.add_dirs,
                settings=config.settings,
                setting_sources=config.setting_sources,
                mcp_configs=config.mcp_configs,
            )
            for notice in (
                policy.effective.untrusted_hooks_notice(),
                policy.effective.untrusted_servers_notice(),
            ):
                if notice:
                    sys.stderr.write(notice + "\n")  # once per start-up (issues 12, 14)
            memory = MemorySources.for_session(
                cwd,
                config_dir=dirs.config,
                deny=policy.read_deny_patterns(),
                writable_roots=policy.writable_roots(),
            )
            sandbox = (
                ContextSandbox(
                    context_spec(
                        memory.root, deny_read=policy.deny_read(), home_allow=policy.home_allow()
                    ),
                    host,
                    spares,
                )
                if state == "proven"
                else None
            )
            snapshot = await gather_context(cwd, sandbox=sandbox, memory=memory)
            started.append(_StartedUp(snapshot, floor, state, policy))
        except Exception as exc:  # re-raised below, outside the nursery (no ExceptionGroup)
            failure.append(exc)

    async def warm_up_sdk() -> None:
        if not config.model.startswith("scripted:"):
            from orchestrator.model.anthropic import AnthropicModel, warm_up

            if isinstance(model, AnthropicModel):
                await model.warm_up()
            else:
                await warm_up()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(warm_up_sdk)
        nursery.start_soon(probe_then_context)
    if failure:
        raise failure[0]
    return started[0]


@dataclass(frozen=True)
class _StartedUp:
    snapshot: ContextSnapshot
    floor: FloorReport | None
    floor_state: Literal["proven", "off"]
    policy: SessionPolicy


def _floor_state(
    config: SessionConfig, floor: FloorReport | None, runner: RunnerFactory | None
) -> Literal["proven", "off"]:
    """`off` (said loudly), or `proven`; an unproven floor under `required` stops the run."""
    if config.sandbox == "off":
        sys.stderr.write(SANDBOX_OFF_WARNING + "\n")
        return "off"
    assert floor is not None
    if not floor.proven:
        raise FloorNotProven(floor.render())
    if runner is None:
        raise ConfigError("no sandboxed tool runner was wired in", source="sandbox")
    return "proven"


def _dispatch_tool(
    pool: SubagentRunner,
    registry: ToolRegistry,
    policy: SessionPolicy,
    dirs: WarrenDirs,
    permission: PermissionFn,
    asker: Asker,
    *,
    context: str,
    on_update: Callable[[SubagentUpdate], None],
    hooks: HookRunner,
    max_stop_hook_blocks: int,
    output_cap: int,
    claude_sources: tuple[str, ...] = ("user", "project"),
    sdk_agents: Mapping[str, Any] | None = None,
) -> Tool[Any]:
    """`dispatch_agent` over the worker pool, with the agent types this workspace defines
    (its `.warren/agents/` and `.claude/agents/` only when trusted), the session's tools and
    permissions, and the main agent's context text (git snapshot, memory files) for every
    subagent."""
    from orchestrator.agents.dispatch_agent import DispatchAgentTool

    return DispatchAgentTool(
        runner=pool,
        agent_types=load_agent_types(
            policy.engine.workspace,
            trusted=policy.effective.trust == "trusted",
            config_dir=dirs.config,
            known_tools=registry.names(),
            claude_sources=claude_sources,
            sdk_agents=sdk_agents,
        ),
        tools=registry,
        permission=permission,
        asker=asker,
        assessor=policy.assessor(),
        sidechain_root=dirs.sessions,
        on_update=on_update,
        context=context,
        hooks=hooks,
        max_stop_hook_blocks=max_stop_hook_blocks,
        output_cap=output_cap,
        protected=policy.protected(),
    )


# --- parts ----------------------------------------------------------------------------------


@dataclass
class _IoGuard:
    """The one boundary for state writes during a session (transcript, audit, log).

    The first `OSError` (ENOSPC, EROFS, EIO...) or `TranscriptWriteError` (the transcript
    store's, which cuts a partial record back first) is remembered as one sentence and
    interrupts the current run, which then ends `io_error`; later writes are skipped, so a
    full disk does not turn every event into another failure.
    """

    failure: str | None = None
    control: RunControl | None = None

    def failed(self, what: str, exc: OSError | TranscriptWriteError) -> None:
        if self.failure is None:
            why = exc.strerror or exc if isinstance(exc, OSError) else exc.message.rstrip(".")
            self.failure = f"could not write the {what}: {why}"
            structlog.get_logger().error("state write failed", what=what, error=str(exc))
        if self.control is not None:
            self.control.interrupt()

    def write(self, step: Callable[[], None], what: str = "transcript") -> None:
        if self.failure is not None:
            return
        try:
            step()
        except (OSError, TranscriptWriteError) as exc:  # the transcript store's typed error
            self.failed(what, exc)

    def sink(self, sink: EventSink) -> EventSink:
        what = "audit log" if isinstance(sink, AuditLog) else "transcript"

        def guarded(event: Event) -> None:
            self.write(lambda: sink(event), what)

        return guarded

    def close(self, close: Callable[[], None]) -> None:
        try:
            close()
        except (OSError, TranscriptWriteError) as exc:
            self.failed("state", exc)


@dataclass
class _Fanout:
    sinks: list[EventSink] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)


def _transcript_sink(transcript: Transcript) -> EventSink:
    def write(event: Event) -> None:
        match event:
            case AssistantTurn(turn=turn):
                transcript.message(turn.message)
            case ToolResultsMessage(message=message):
                transcript.message(message)
            case CompactBoundary():
                # The full history stays above; loading restarts from here (transcripts.load).
                transcript.write(
                    {
                        "type": "compact_boundary",
                        "trigger": event.trigger,
                        "pre_tokens": event.pre_tokens,
                        "post_tokens": event.post_tokens,
                        "summarised": event.summarised,
                    }
                )
                for message in event.messages:
                    transcript.message(message)
            case RetryScheduled():
                transcript.write(
                    {
                        "type": "retry",
                        "attempt": event.attempt,
                        "delay_s": event.delay_s,
                        "error": event.error,
                    }
                )
            case _:
                pass

    return write


def _subagent_sink(
    printer: OutputPrinter,
    audit: EventSink,
    denials: DenialLog,
    spend: dict[str, ModelUsage],
    extra: Callable[[SubagentUpdate], None] | None,
) -> Callable[[SubagentUpdate], None]:
    """Subagents' events: tagged lines in stream-json, their permission decisions in the
    session's audit log and its denials, their model turns in `spend` (the result's
    `modelUsage`), and whatever the embedder wants (`on_subagent`)."""

    def report(update: SubagentUpdate) -> None:
        printer.subagent(update)
        if isinstance(update, SubagentEvent):
            audit(update.event)
            denials(update.event, update.agent_id)
            if isinstance(update.event, AssistantTurn):
                turn = update.event.turn
                spend[turn.model] = spend.get(turn.model, ModelUsage()).add(turn)
        if extra is not None:
            extra(update)

    return report


def _spend(model: ModelClient) -> tuple[Usage, float] | None:
    return (model.usage, model.cost_usd) if isinstance(model, MeteredModel) else None


def _with_session_spend(
    result: RunResult, model: ModelClient, before: tuple[Usage, float] | None
) -> RunResult:
    """The run's usage and cost counted at the broker: the main agent's and every
    subagent's (the loop alone sees only the main agent's)."""
    after = _spend(model)
    if before is None or after is None:
        return result
    (used, _), (was, _) = after, before
    usage = Usage(
        input_tokens=used.input_tokens - was.input_tokens,
        output_tokens=used.output_tokens - was.output_tokens,
        cache_creation_input_tokens=used.cache_creation_input_tokens
        - was.cache_creation_input_tokens,
        cache_read_input_tokens=used.cache_read_input_tokens - was.cache_read_input_tokens,
    )
    return dataclasses.replace(result, usage=usage, cost_usd=after[1] - before[1])


def _with_subagent_models(result: RunResult, spend: dict[str, ModelUsage]) -> RunResult:
    """`modelUsage` counts subagents' turns too, as Claude Code's does (their cost is in
    `total_cost_usd` already, counted at the broker)."""
    if not spend:
        return result
    merged = dict(result.model_usage)
    for model, entry in spend.items():
        was = merged.get(model, ModelUsage())
        merged[model] = ModelUsage(
            was.usage + entry.usage, was.cost_usd + entry.cost_usd, was.requests + entry.requests
        )
    return dataclasses.replace(result, model_usage=merged)


async def _shielded(close: Callable[[], Awaitable[None]]) -> None:
    """Teardown that a cancellation cannot skip, bounded so a stuck part cannot hang exit."""
    with trio.CancelScope(shield=True), trio.move_on_after(15):
        await close()


def _session_end(hooks: HookRunner) -> Callable[[], Awaitable[None]]:
    async def end() -> None:
        await hooks.session_end()

    return end


@asynccontextmanager
async def _in_process(ctx: ToolContext) -> AsyncIterator[ToolRunner]:
    yield InProcessRunner()
