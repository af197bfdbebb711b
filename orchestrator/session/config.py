"""What a session is opened with: the user's choices (`SessionConfig`) and what the
composition root plugs in (`SessionParts`), and the limits and pool they resolve to.

`SessionConfig` is frozen and checked once (contradictory flags are one error naming both);
`SessionParts` is the seam where the CLI plugs in tool hosts, the worker pool and the broker,
and where tests inject fakes instead of patching. `build_limits` and `build_pool` resolve the
command line over the policy over the defaults.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.agents.types import SubagentRunner, SubagentUpdate
from orchestrator.calls.permissions import Asker
from orchestrator.calls.pipeline import ToolRunner
from orchestrator.calls.policy import SessionPolicy
from orchestrator.claude_code.output import OutputFormat
from orchestrator.errors import ConfigError, TranscriptWriteError
from orchestrator.events import EventSink
from orchestrator.limits import Limits
from orchestrator.messages import Usage
from orchestrator.model.base import ModelClient
from orchestrator.model.catalog import resolve_model
from orchestrator.paths import WarrenDirs
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry
from policies.files import Mode
from policies.pool import PoolBackend, PoolConfig, check_max_subagents, resolve_pool
from policies.sources import PolicyError

if TYPE_CHECKING:
    from orchestrator.claude_code.sdk_control import HostParts
    from orchestrator.mcp.servers import McpServers
    from sandbox.probe import KnownFloor
    from sandbox.spare import SpareSource

__all__ = [
    "DEFAULT_MODEL",
    "AskerFactory",
    "BrokerFactory",
    "FloorNotProven",
    "McpFactory",
    "MeteredModel",
    "RunnerFactory",
    "SessionConfig",
    "SessionParts",
    "StateUnwritable",
    "SubagentsFactory",
    "build_limits",
    "build_pool",
]

DEFAULT_MODEL = "claude-sonnet-4-6"


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
    wait_for_tasks: bool = True
    """A run whose model ends its turn while background agents or monitors run waits for
    their notifications and goes on (headless runs); False ends it, the notifications joining
    the next prompt (the interactive session). Default True."""
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
    of once the first request is on its way (orchestrator/session/later.py): a session of the
    warm server, with nothing to import and spare tool hosts to adopt, so its first tool call
    finds them ready."""


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
