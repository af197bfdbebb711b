"""Subagents as the orchestrator sees them: agent types, the runner seam, their events.

`dispatch_agent` (orchestrator/agents/dispatch_agent.py) hands a `SubagentRequest` to a
`SubagentRunner` and gets one `SubagentOutcome` back. The orchestrator never imports the
implementation: the worker pool (`workers.pool.WorkerPool`) runs each subagent in its own
sandboxed process, and only the composition root (the CLI) wires it in.

Agent types are the built-in read-only explorer `general` (Read, Glob, Grep, LS, Think and
Bash, in a worker whose workspace is mounted read-only), plus Markdown files with YAML front
matter from the user's config directory (`~/.config/warren/agents/*.md`) and, once the user
trusts the repository, from the project (`.warren/agents/*.md`); a later source replaces an
earlier type of the same name:

    ---
    name: reviewer
    description: Reviews a diff for bugs and missing tests.
    tools: Read, Grep, mcp__time   # or a YAML list; default: Read, Glob, Grep, LS, Think
    model: claude-haiku-4-5        # default: the session's model
    max_turns: 20                  # default: 50
    writable: false                # default: false (the workspace is mounted read-only)
    ---
    You are a careful reviewer. ...   (the body is the system prompt)

A type is read-only exactly when it is not `writable`: its worker's sandbox mounts the
workspace read-only, whatever tools it names. Bash in it runs under the session's policy like
the main agent's (a read-only command unasked, any other asked, or denied headless), and even
an approved write fails there ('Read-only file system'); its worker is reused (`leaves_state`).

`tools` may name MCP tools (`mcp__server__tool`, or `mcp__server` for all of one server's):
their servers run beside the coordinator, never per worker, and each call of the subagent is
run there after the session's policy allowed it (orchestrator/agents/mcp.py).

Claude Code's agent definitions are agent types too: `~/.claude/agents/*.md`
(`$CLAUDE_CONFIG_DIR/agents`) at the user's level and, once trusted, the repository's
`.claude/agents/*.md` (part of what trust hashes), read with Claude Code's meaning of the front
matter (orchestrator/claude_code/agents.py: no `tools` means every tool but `dispatch_agent`,
which makes a writable type). A writable type still needs the policy's `dispatch_agent(NAME)`
allow (or an answer to its ask) to run. Within a level Warren's own definition of a name wins
over Claude Code's.

An application driving Warren through the Claude Agent SDK may define agent types in its
`initialize` (`agents`, orchestrator/claude_code/sdk_control.py): read with the same Claude Code
meaning (`sdk_agent_types`), trusted as the user's own and last, so they replace a type of the
same name; still under the policy.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchestrator.calls.permissions import Allow, Deny
from orchestrator.claude_code.agents import (
    SDK_AGENTS,
    agent_fields,
    claude_agents_dir,
    sdk_agent_fields,
)
from orchestrator.errors import ConfigError
from orchestrator.events import Event
from orchestrator.messages import Message, Usage
from orchestrator.model.base import ToolSpec
from orchestrator.model.catalog import resolve_model
from orchestrator.outcome import TerminalReason
from orchestrator.tools.registry import STATELESS_TOOLS
from sandbox.safe_read import read_bounded_regular

if TYPE_CHECKING:
    from orchestrator.hooks.runner import HookOutcome
    from orchestrator.model.base import ToolSpec
    from orchestrator.tools.base import ToolOutput

__all__ = [
    "DEFAULT_MAX_TURNS",
    "GENERAL",
    "AgentType",
    "SubagentEvent",
    "SubagentFinished",
    "SubagentHookEvent",
    "SubagentHooks",
    "SubagentMcp",
    "SubagentOutcome",
    "SubagentPermission",
    "SubagentReason",
    "SubagentRequest",
    "SubagentRunner",
    "SubagentStarted",
    "SubagentUpdate",
    "WarmsWriters",
    "WorkerFailure",
    "load_agent_types",
    "parse_agent_file",
    "sdk_agent_types",
]

DEFAULT_MAX_TURNS = 50
"""Model requests of a subagent whose definition does not say."""

MAX_AGENT_FILE_BYTES = 256 * 1024
"""Largest project agent definition read (a system prompt, not a data file)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_IGNORED_KEYS = frozenset({"color"})
MCP_PREFIX = "mcp__"
_MCP_NAME = re.compile(r"^mcp__[A-Za-z0-9_-]+?(__.+)?$")
"""Front matter keys other agent tools write that mean nothing here."""
Dialect = Literal["warren", "claude"]


class AgentType(BaseModel):
    """What a subagent of this type may do, and how it is told to behave."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Model-facing name (`subagent_type`), also the policy specifier `dispatch_agent(name)`."""
    description: str
    """When to use this type: listed in dispatch_agent's description for the model."""
    system_prompt: str
    """The subagent's instructions (the body of its definition file)."""
    tools: tuple[str, ...] = STATELESS_TOOLS
    """Names of the tools the subagent gets. Default: the read-only built-ins
    (`orchestrator.tools.registry.STATELESS_TOOLS`; `general` adds Bash). An MCP server's
    tools are named `mcp__server__tool`, or all of them `mcp__server` (`allows`)."""
    model: str | None = None
    """The model that answers it, an id or an alias (`haiku`: resolved to the id); None
    (default) for the session's."""
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    """Model requests before the run ends with `max_turns`. Default 50."""
    writable: bool = False
    """Whether its worker gets the workspace writable (only once the permission function
    allows the dispatch_agent call). Default False: mounted read-only, whatever `tools` says
    (Bash included: a write fails there), and the call is concurrency-safe."""
    source: Literal["builtin", "user", "project", "sdk"] = "builtin"
    """Where it is defined; `sdk`: the `agents` of an SDK host's `initialize`."""
    path: Path | None = None
    """The definition file, for messages."""

    @field_validator("model")
    @classmethod
    def _resolve_alias(cls, value: str | None) -> str | None:
        return None if value is None else resolve_model(value)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"agent name {value!r} must be one word of letters, digits, '-' or '_'"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _mcp_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name.startswith(MCP_PREFIX) and not _MCP_NAME.match(name):
                raise ValueError(
                    f"{name!r}: an MCP tool is named mcp__<server>__<tool>, or mcp__<server> "
                    "for all the tools of one server"
                )
        return value

    def allows(self, tool: str) -> bool:
        """Whether the subagent may use `tool`: named in `tools`, or an MCP tool of a server
        named there as `mcp__server`."""
        if tool in self.tools:
            return True
        if not tool.startswith(MCP_PREFIX):
            return False
        server, sep, name = tool[len(MCP_PREFIX) :].partition("__")
        return bool(sep and name) and f"{MCP_PREFIX}{server}" in self.tools

    @property
    def leaves_state(self) -> bool:
        """Whether a run can leave anything behind in its worker: then the worker is replaced
        after the run instead of reused. Only a writable type's can. In a read-only worker
        the workspace cannot change, every Bash command is a one-shot whose processes are
        killed when its call ends (`sandbox.process.orphans`), the run's shell files go with
        its context, and the worker empties its private /tmp and /dev/shm after each run
        (workers/agent_worker.py); MCP tools run in the coordinator."""
        return self.writable

    def system_blocks(self, *, workspace: Path, cwd: Path) -> list[str]:
        access = "read and write" if self.writable else "read (it is mounted read-only)"
        return [
            self.system_prompt,
            f"You are a subagent of Warren, dispatched by another agent. You may {access} the "
            f"workspace {workspace}; the current directory is {cwd}. Use absolute paths. "
            "When you are done, answer with a concise report of what you found or did: it is "
            "returned to the agent that dispatched you, and the user does not see it.",
        ]


GENERAL = AgentType(
    name="general",
    description="A read-only explorer: searches and reads the codebase to answer a question "
    "or survey an area, and reports what it found. Use it for open-ended searches that may "
    "take several rounds of Glob, Grep and Read, and for history: it has Bash for read-only "
    "commands (git log, git blame, git show, rg).",
    system_prompt="You are an agent for exploring a codebase. Search broadly, read what "
    "matters, and report precisely: file paths, line numbers and the relevant code. You "
    "cannot modify files: the workspace is mounted read-only. Use Bash for read-only "
    "commands that the other tools cannot replace: git history and state (git log, git "
    "blame, git show, git diff, git status), rg with options Grep lacks, wc. Do not run "
    "builds, tests or anything that writes: such commands need the user's approval and fail "
    "in your read-only sandbox anyway.",
    tools=(*STATELESS_TOOLS, "Bash"),
)


def parse_agent_file(
    path: Path,
    source: Literal["user", "project"],
    *,
    dialect: Dialect = "warren",
    all_tools: Collection[str] = (),
) -> AgentType:
    """One definition file (YAML front matter between `---` lines, then the system prompt).

    `dialect="claude"` reads it with Claude Code's meaning
    (`orchestrator.claude_code.agents.agent_fields`); `all_tools` is then what no `tools`
    key stands for.

    **Errors:** `ConfigError` naming the file when it cannot be read or is not a valid
    definition.
    """
    import yaml

    try:
        if source == "project":
            # Repository content: never a link out (`x.md -> ~/.ssh/id_rsa` would go into a
            # system prompt), a FIFO or an endless device (tests/orchestrator/test_subagents).
            data, cut = read_bounded_regular(path, MAX_AGENT_FILE_BYTES)
            if cut:
                raise ConfigError(
                    f"an agent definition is larger than {MAX_AGENT_FILE_BYTES} bytes",
                    source=str(path),
                )
            text = data.decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the agent definition: {exc}", source=str(path)) from exc
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if not lines or lines[0].strip() != "---" or end is None:
        raise ConfigError(
            "an agent definition starts with YAML front matter between two `---` lines",
            source=str(path),
        )
    try:
        front: Any = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"the front matter is not valid YAML: {exc}", source=str(path)) from exc
    if not isinstance(front, dict):
        raise ConfigError("the front matter must be a mapping of keys", source=str(path))
    fields = {k: v for k, v in front.items() if k not in _IGNORED_KEYS}
    if isinstance(fields.get("tools"), str):
        fields["tools"] = [t.strip() for t in fields["tools"].split(",") if t.strip()]
    if dialect == "claude":
        fields = agent_fields(fields, path, all_tools)
    fields.setdefault("name", path.stem)
    body = "\n".join(lines[end + 1 :]).strip()
    try:
        return AgentType.model_validate(
            {**fields, "system_prompt": body, "source": source, "path": path}
        )
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "front matter"
        raise ConfigError(f"{where}: {first['msg']}", source=str(path)) from exc


def sdk_agent_types(
    definitions: Mapping[str, Any], *, all_tools: Collection[str]
) -> dict[str, AgentType]:
    """The `agents` of an SDK host's `initialize` (the SDK's `AgentDefinition`s by name) as
    agent types, with Claude Code's meaning of their fields as for `.claude/agents`
    (`orchestrator.claude_code.agents.sdk_agent_fields`): no `tools` is `all_tools` (a
    writable type), `model: inherit` the session's. A field Warren has no meaning for
    (`skills`, `mcpServers`, `permissionMode`, ...) is an error naming it.

    **Errors:** `ConfigError` naming the agent.
    """
    types: dict[str, AgentType] = {}
    for name, definition in definitions.items():
        where = f"{SDK_AGENTS}: {name}"
        fields = sdk_agent_fields(definition, where, all_tools)
        try:
            types[name] = AgentType.model_validate({**fields, "name": name, "source": "sdk"})
        except pydantic.ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field_name = ".".join(str(p) for p in first["loc"]) or "definition"
            raise ConfigError(f"{field_name}: {first['msg']}", source=where) from exc
        unknown_tools = sorted(
            t for t in types[name].tools if not t.startswith(MCP_PREFIX) and t not in all_tools
        )
        if unknown_tools:
            raise ConfigError(
                f"tools: no tool named {', '.join(unknown_tools)} (known: "
                f"{', '.join(sorted(all_tools))})",
                source=where,
            )
    return types


def load_agent_types(
    workspace: Path,
    *,
    trusted: bool,
    config_dir: Path,
    known_tools: Collection[str] | None = None,
    claude_dir: Path | None = None,
    claude_sources: Collection[str] | None = None,
    sdk_agents: Mapping[str, Any] | None = None,
) -> dict[str, AgentType]:
    """Every agent type of a session, by name: `general`, then the user's definitions
    (Claude Code's `claude_dir`, default `claude_agents_dir()`, then Warren's
    `config_dir/agents/*.md`), then the project's (`.claude/agents/*.md`, then
    `.warren/agents/*.md`) when `trusted`. A later definition replaces an earlier one of the
    same name. `claude_sources` (`--setting-sources`) says which Claude Code directories are
    read (`user`, `project`; None: both). `sdk_agents`: an SDK host's definitions
    (`sdk_agent_types`), last: the application that runs the session is trusted, and its
    types win.

    `known_tools`: when given, a definition naming any other tool is an error (and it is
    what a Claude Code definition without `tools` gets; default: the built-in tools).

    **Errors:** `ConfigError` naming the file of the first bad definition.
    """
    types = {GENERAL.name: GENERAL}
    if claude_sources is None:
        claude_sources = ("user", "project")
    sources: list[tuple[Path, Literal["user", "project"], Dialect]] = []
    if "user" in claude_sources:
        sources.append((claude_dir or claude_agents_dir(), "user", "claude"))
    sources.append((config_dir / "agents", "user", "warren"))
    if trusted:
        if "project" in claude_sources:
            sources.append((workspace / ".claude" / "agents", "project", "claude"))
        sources.append((workspace / ".warren" / "agents", "project", "warren"))
    if known_tools is None:
        from orchestrator.tools.registry import builtin_facts

        every: Collection[str] = tuple(builtin_facts())
    else:
        every = known_tools
    for directory, source, dialect in sources:
        for path in sorted(directory.glob("*.md")) if directory.is_dir() else []:
            agent = parse_agent_file(path, source, dialect=dialect, all_tools=every)
            # An MCP tool may be listed only once its server is up: checked at each call.
            named = {t for t in agent.tools if not t.startswith(MCP_PREFIX)}
            unknown = sorted(named - set(known_tools or ())) if known_tools else []
            if unknown:
                raise ConfigError(
                    f"tools: no tool named {', '.join(unknown)} (known: "
                    f"{', '.join(sorted(known_tools or ()))})",
                    source=str(path),
                )
            types[agent.name] = agent
    if sdk_agents:
        types.update(sdk_agent_types(sdk_agents, all_tools=every))
    return types


# --- the runner seam -----------------------------------------------------------------------------

WorkerFailure = Literal["worker_crashed", "worker_limit", "worker_protocol", "worker_unavailable"]
"""Ends that only a subagent in another process has: its worker died, was killed past a
limit, broke the protocol, or could not be started."""

SubagentReason = TerminalReason | WorkerFailure

SubagentPermission = Callable[[str, dict[str, Any]], Awaitable[Allow | Deny]]
"""The final answer for one tool call of a subagent (tool name, raw input): the session's
permission function, with asks resolved by its asker."""


SubagentHookEvent = Literal["PreToolUse", "PostToolUse", "SubagentStop"]
"""The hook events a subagent fires; they run in the coordinator."""


class SubagentHooks(Protocol):
    """The session's hooks as one subagent fires them (orchestrator/agents/hooks.py's
    `AgentHooks`): the runner asks these when its worker says a call or the agent's end is
    due, and tells the worker `events` at the start, so a session without hooks sends no
    hook messages at all."""

    @property
    def events(self) -> frozenset[SubagentHookEvent]:
        """The events the session has hooks for."""
        ...

    @property
    def max_stop_blocks(self) -> int:
        """Times SubagentStop hooks may keep the agent going (`[limits]`)."""
        ...

    async def pre_tool_use(
        self, tool: str, input: dict[str, Any], tool_use_id: str
    ) -> HookOutcome: ...

    async def post_tool_use(
        self, tool: str, input: dict[str, Any], tool_use_id: str, response: Any
    ) -> HookOutcome: ...

    async def subagent_stop(self, *, active: bool) -> HookOutcome: ...


class SubagentMcp(Protocol):
    """The tools the coordinator serves one subagent: its MCP tools (orchestrator/agents/mcp.py's
    `AgentMcp`), and `StructuredOutput` for a dispatch with `output_schema`
    (orchestrator/agents/structured.py's `ServedTools`). The runner offers `specs` to the worker
    and hands it each call's result."""

    def specs(self) -> list[ToolSpec]:
        """The tools served to the agent, as the coordinator describes them (the same list for
        the whole run)."""
        ...

    async def call(self, tool: str, input: dict[str, Any]) -> ToolOutput:
        """Run one call the permission answer allowed (an error result otherwise); never
        raises for a bad call."""
        ...


@dataclass(frozen=True)
class SubagentRequest:
    agent_id: str
    """Unique in the session: names the sidechain transcript and tags every event."""
    agent_type: AgentType
    prompt: str
    system: list[str]
    """System prompt blocks, most stable first."""
    hooks: SubagentHooks | None = None
    """The session's hooks for this agent; None: none fire."""
    mcp: SubagentMcp | None = None
    """The tools the coordinator serves it (its MCP tools, StructuredOutput); None: none."""
    write_paths: tuple[Path, ...] = ()
    """A writable type's write scope: only these directories (absolute, checked and made by
    orchestrator/calls/scopes.py) are writable in its sandbox. Empty: the whole workspace."""
    history: tuple[Message, ...] = ()
    """The agent's earlier conversation, which `prompt` continues (`SendMessage`, a fork);
    empty: a new agent."""
    fork: ForkBase | None = None
    """A fork of the main agent: its requests are sent as the main agent's are (None: as
    the agent type's)."""


@dataclass(frozen=True)
class ForkBase:
    """What a fork's requests keep of the main agent's last request, so that the API's prompt
    cache serves the conversation they share (orchestrator/agents/fork.py): the pool sends
    these tools, limits and, on the first request, cache breakpoints where that request had
    them, in place of the worker's."""

    tools: tuple[ToolSpec, ...]
    max_tokens: int
    thinking_budget: int | None
    prefix: int
    """Messages of the main agent's request at the head of the fork's history: the first
    request places its breakpoints on the last two of them. 0: none (a continued fork)."""


@dataclass(frozen=True)
class SubagentOutcome:
    agent_id: str
    reason: SubagentReason
    result: str
    """The final text of the subagent, or a sentence saying what happened to it."""
    num_turns: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    duration_s: float = 0.0
    worker_pid: int | None = None
    """The host pid of the worker's sandbox (bwrap), when one ran it (on `worker_node`, when
    that is set)."""
    worker_node: str | None = None
    """Where a remote worker ran it (`node 1a2b3c4d (10.0.0.7)`); None: on this machine."""
    snapshot: str | None = None
    """The id of the workspace snapshot a remote worker read; None: the live workspace."""


@dataclass(frozen=True)
class SubagentStarted:
    agent_id: str
    agent_type: str
    description: str
    transcript: Path | None
    tool_use_id: str | None = None
    """The `dispatch_agent` call that started it (stream-json's `parent_tool_use_id`)."""


@dataclass(frozen=True)
class SubagentEvent:
    """An event of a subagent's own loop, tagged with its id."""

    agent_id: str
    event: Event
    worker_pid: int | None = None
    """The host pid of the worker's sandbox running it (the REPL's subagent rows)."""


@dataclass(frozen=True)
class SubagentFinished:
    outcome: SubagentOutcome


SubagentUpdate = SubagentStarted | SubagentEvent | SubagentFinished
"""What `dispatch_agent` reports about its subagents while they run."""


class SubagentRunner(Protocol):
    """Runs one subagent to its end somewhere else (the worker pool).

    **Cancellation:** the subagent is stopped (bounded) before `Cancelled` propagates.
    **Errors:** none for the subagent's own failures, which are outcomes.
    """

    async def run(
        self,
        request: SubagentRequest,
        *,
        on_event: Callable[[SubagentEvent], None],
        permission: SubagentPermission,
    ) -> SubagentOutcome: ...


@runtime_checkable
class WarmsWriters(Protocol):
    """A `SubagentRunner` that can have a writable worker ready before the first writer is
    dispatched (the worker pool); `dispatch_agent` tells it when one of its types may write."""

    def expect_writers(self) -> None: ...
