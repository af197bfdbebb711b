"""Policy files: their schema, loading with located errors, and the merge into one policy.

Six levels, lowest to highest precedence (DESIGN.md, "Policy files"):

    built-in      policies/defaults.toml, shipped with Warren
    user          $XDG_CONFIG_HOME/warren/policy.toml (default ~/.config/warren/policy.toml)
    project       <workspace>/.warren/policy.toml, committed with the repository
    local         <workspace>/.warren/policy.local.toml, ignored by git
    command line  --allowed-tools / --disallowed-tools / --permission-mode
    managed       /etc/warren/policy.toml, set by the machine's administrator

Scalars (`mode`, each limit) come from the highest level that sets them, so managed cannot be
overridden. Rules are collected from every level; the engine lets a deny anywhere win.
The project and local files are the repository's: until the user trusts it
(`policies.trust`), their allow rules, hooks, mode, limits and writable roots are ignored,
while their deny and ask rules and sandbox masks apply at once.

A broken file is one `PolicyError` naming the file, the line and the key, and nothing runs
on it: `load_effective_policy` either returns a whole policy or raises.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, assert_never, get_args

from pydantic import AfterValidator, Field, StrictBool, StrictStr, ValidationError, model_validator

from policies.atomic import read_regular, write_atomic
from policies.claude_names import warren_mode
from policies.claude_settings import (
    ClaudeSettings,
    claude_settings_files,
    count_declared_hooks,
    read_claude_settings,
    user_claude_settings,
)
from policies.hooks import Hook, HookEvent, UnsupportedHook
from policies.mcp import (
    MCP_JSON,
    McpJson,
    McpJsonError,
    McpSection,
    McpServer,
    UnsupportedServer,
    read_mcp_json,
)
from policies.mcp import (
    SERVER_NAME as MCP_SERVER_NAME,
)
from policies.pool import POOL_LEVELS, PoolSection, PoolSetting, merge_pool
from policies.rules import ParsedRule, RuleSyntaxError, parse_rule
from policies.sources import (
    MAX_SOURCE_BYTES,
    PolicyError,
    PolicyTable,
    finite,
    read_source_text,
)
from policies.trust import (
    LOCAL_POLICY,
    TrustState,
    TrustStore,
    project_policy_files,
    project_policy_hash,
)

__all__ = [
    "LEVELS",
    "MANAGED_POLICY_PATH",
    "MODES",
    "EffectivePolicy",
    "Example",
    "Hook",
    "HookEvent",
    "Level",
    "LimitSetting",
    "Limits",
    "Mode",
    "PermissionRules",
    "PolicyError",
    "PolicyFile",
    "PolicyLayer",
    "PolicyPaths",
    "RuleEntry",
    "RuleKindName",
    "SandboxAdditions",
    "UnsupportedHook",
    "append_allow_rule",
    "claude_policy",
    "command_line_policy",
    "load_effective_policy",
    "load_policy_file",
    "merge_policy",
    "parse_policy_text",
    "read_for_edit",
    "save_remembered_rule",
    "set_mcp_server",
    "split_tool_list",
    "toml_string",
]

Mode = Literal["default", "accept-edits", "plan", "dont-ask", "bypass"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
Level = Literal["built-in", "user", "project", "local", "command line", "managed"]
LEVELS: Final[tuple[Level, ...]] = get_args(Level)
"""Lowest to highest precedence."""
RuleKindName = Literal["allow", "ask", "deny"]

MANAGED_POLICY_PATH: Final = Path("/etc/warren/policy.toml")
_MAX_POLICY_BYTES: Final = MAX_SOURCE_BYTES
"""A policy file larger than this is refused unread."""


# -- schema --


def _valid_rule(text: str) -> str:
    try:
        parse_rule(text)
    except RuleSyntaxError as exc:
        raise ValueError(str(exc)) from None
    return text.strip()


RuleText = Annotated[StrictStr, AfterValidator(_valid_rule)]


class PermissionRules(PolicyTable):
    """`[permissions]`: rules in `Tool(specifier)` syntax (see `policies.rules`)."""

    allow: tuple[RuleText, ...] = ()
    """Calls that run without asking. A project's allow rules count once it is trusted."""
    ask: tuple[RuleText, ...] = ()
    """Calls that always ask (beat allow rules at every level)."""
    deny: tuple[RuleText, ...] = ()
    """Calls that never run, whatever any other level says."""


class SandboxAdditions(PolicyTable):
    """`[sandbox]`: additions to the floor's defaults (`sandbox.spec`), never removals."""

    deny_read: tuple[StrictStr, ...] = ()
    """More paths masked from reads (`~`, `{config}`, `{state}` expand; sandbox syntax)."""
    protected: tuple[StrictStr, ...] = ()
    """More paths that stay read-only inside writable roots (relative to each root)."""
    writable_roots: tuple[StrictStr, ...] = ()
    """More directories tools may write (relative to the file's directory, or `~/`, or
    absolute). Ignored in an untrusted project."""
    home_allow: tuple[StrictStr, ...] = ()
    """More paths under `$HOME` the sandbox sees, read-only (`~/...` or absolute); the rest of
    the home is hidden. Ignored in an untrusted project."""


class Limits(PolicyTable):
    """`[limits]`: each one from the highest level that sets it."""

    max_turns: Annotated[int, Field(strict=True, ge=1, le=100_000)] | None = None
    """Model turns per run before it stops with `max_turns`. Kernel default 100."""
    max_subagents: Annotated[int, Field(strict=True, ge=0, le=64)] | None = None
    """Subagents at once (0 disables dispatch_agent). At most 10 with the local pool, 64 on
    a Ray cluster (`policies.pool.check_max_subagents`, when the session knows its pool)."""
    max_concurrency: Annotated[int, Field(strict=True, ge=1, le=10)] | None = None
    """Concurrency-safe tool calls run at once. At most 10 (the design's cap)."""
    tool_timeout_s: Annotated[float, Field(gt=0, le=86_400), AfterValidator(finite)] | None = None
    """Seconds a tool call may run unless the tool says otherwise. Kernel default 300."""
    max_budget_usd: Annotated[float, Field(gt=0), AfterValidator(finite)] | None = None
    """US dollars the session may spend on the model, subagents included. Default: no limit."""
    max_output_tokens_total: Annotated[int, Field(strict=True, ge=1)] | None = None
    """Output tokens the session may generate, subagents included. Default: no limit."""
    compact_threshold: Annotated[float, Field(ge=0.5, le=0.95), AfterValidator(finite)] | None = (
        None
    )
    """Fraction of the context window filled before the conversation is compacted. Default 0.8."""
    context_window: Annotated[int, Field(strict=True, ge=1_000)] | None = None
    """Tokens of the model's context window. Default: the model table's."""
    max_output_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    """`max_tokens` of each model request. Default: the model's (its output limit, at most
    32,000)."""
    max_thinking_tokens: Annotated[int, Field(strict=True, ge=1024)] | None = None
    """Extended thinking's token budget per response. Default: no extended thinking."""
    max_stop_hook_blocks: Annotated[int, Field(strict=True, ge=0, le=1_000)] | None = None
    """Times Stop/SubagentStop hooks may keep one run going before it ends `hook_blocked`.
    Default 5."""
    max_tasks: Annotated[int, Field(strict=True, ge=0, le=64)] | None = None
    """Background tasks (agents, shells, monitors) running at once; 0 turns them off.
    Default 16."""
    task_output_bytes: Annotated[int, Field(strict=True, ge=4096)] | None = None
    """Bytes of output one background shell or monitor keeps; past it the oldest go.
    Default 1 MiB."""
    task_time_s: Annotated[float, Field(gt=0, le=604_800), AfterValidator(finite)] | None = None
    """Seconds a background task may run before it is stopped. Default 3,600."""
    workflow_agents: Annotated[int, Field(strict=True, ge=1, le=10_000)] | None = None
    """Agents one workflow run may start. Default 100."""
    workflow_cpu_s: Annotated[int, Field(strict=True, ge=1, le=86_400)] | None = None
    """CPU seconds a workflow's script may use (its agents not counted). Default 60."""
    workflow_memory_mb: Annotated[int, Field(strict=True, ge=64, le=65_536)] | None = None
    """Megabytes of memory a workflow's script may use. Default 512."""
    workflow_time_s: Annotated[float, Field(gt=0, le=604_800), AfterValidator(finite)] | None = None
    """Seconds a workflow's script may run, its agents' time included. Default 3,600."""


class Example(PolicyTable):
    """`[[examples]]`: a call and the decision it must get (`warren policy test`)."""

    tool: Annotated[StrictStr, Field(min_length=1)]
    command: StrictStr | None = None
    """For Bash: the command line."""
    path: StrictStr | None = None
    """For path tools: the path, relative to the workspace or absolute."""
    input: dict[str, Any] | None = None
    """For other tools: the tool input."""
    decision: Literal["allow", "ask", "deny"]
    floor: StrictBool | None = None
    """Decide as if the floor were (not) proven; default: the floor as probed."""
    read_only: StrictBool | None = None
    """Whether the tool is read-only for this input; default: true for the tools that
    declare the `read` or `meta` family."""

    @model_validator(mode="after")
    def _shape(self) -> Example:
        if self.tool == "Bash":
            if self.command is None or self.path is not None or self.input is not None:
                raise ValueError("a Bash example needs `command` (and no `path` or `input`)")
        elif self.command is not None:
            raise ValueError(f"a {self.tool} example takes `path` or `input`, not `command`")
        elif self.path is not None and self.input is not None:
            raise ValueError(
                f"a {self.tool} example takes `path` (a path tool) or `input`, not both"
            )
        return self


class PolicyFile(PolicyTable):
    """One policy file (or the command line's flags), as written."""

    mode: Mode | None = None
    """default | accept-edits | plan | dont-ask | bypass; unset leaves it to lower levels."""
    permissions: PermissionRules = PermissionRules()
    sandbox: SandboxAdditions = SandboxAdditions()
    limits: Limits = Limits()
    hooks: tuple[Hook, ...] = ()
    examples: tuple[Example, ...] = ()
    mcp: McpSection = McpSection()
    pool: PoolSection = PoolSection()
    """Where subagents run; the user's and the managed policy only (`policies.pool`)."""


_MODELS: Final[Mapping[str, type[PolicyTable]]] = MappingProxyType(
    {
        "permissions": PermissionRules,
        "sandbox": SandboxAdditions,
        "limits": Limits,
        "hooks": Hook,
        "examples": Example,
        "mcp": McpSection,
        "pool": PoolSection,
    }
)


# -- loading one file --


def parse_policy_text(text: str, *, file: str) -> PolicyFile:
    """Parse and validate one policy file's text. Raises one located `PolicyError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(str(exc), text, file) from None
    except RecursionError:
        raise PolicyError("nested too deeply to read", file=file) from None
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise _schema_error(exc, text, file) from None
    except RecursionError:
        raise PolicyError("nested too deeply to read", file=file) from None


def load_policy_file(path: Path, *, beneath: Path | None = None) -> PolicyFile | None:
    """Load one policy file; None when it does not exist. Raises a located `PolicyError`.

    With `beneath` (the repository, for its project and local files) no link is followed,
    below it or as the file; without, the file may be a link (the user's own files). Either
    way a FIFO, a device or a file over 1 MiB is an error, never a read that hangs.
    """
    text = read_source_text(path, beneath=beneath)
    if text is None:
        return None
    return parse_policy_text(text, file=str(path))


_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_AT_END = re.compile(r"\s*\(at end of document\)\s*$")


def _syntax_error(message: str, text: str, file: str) -> PolicyError:
    line: int | None = None
    if match := _AT.search(message):
        line = int(match.group(1))
        message = message[: match.start()]
    elif match := _AT_END.search(message):
        line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        message = message[: match.start()] + " (at the end of the file)"
    key = None
    if line is not None:
        key = next((".".join(map(str, p)) for p, n in _key_index(text) if n == line), None)
    return PolicyError(f"TOML syntax error: {message}", file=file, line=line, key=key)


def _schema_error(exc: ValidationError, text: str, file: str) -> PolicyError:
    index = _key_index(text)
    located: list[tuple[int, int, PolicyError]] = []
    for order, error in enumerate(exc.errors(include_url=False)):
        loc = tuple(error["loc"])
        line = _locate(index, text, loc, error.get("input"))
        message = _schema_message(error, loc)
        error_obj = PolicyError(message, file=file, line=line, key=_format_loc(loc) or None)
        located.append((line if line is not None else 1 << 30, order, error_obj))
    # One error, the first in the file: what a reader fixing it top-down meets first.
    return min(located, key=lambda item: (item[0], item[1]))[2]


def _schema_message(error: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = ", ".join(parent.model_fields) if parent is not None else ""
        return f"unknown key `{loc[-1]}`" + (f" (known keys: {known})" if known else "")
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def _model_at(loc: Sequence[Any]) -> type[PolicyTable] | None:
    names = [part for part in loc if isinstance(part, str)]
    if not names:
        return PolicyFile
    if len(names) == 1:
        return _MODELS.get(names[0])
    return None


def _format_loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


_HEADER = re.compile(r"\s*(\[\[?)\s*([^\[\]#]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(
    r"\s*((?:[A-Za-z0-9_-]+|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
    r"(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"(?:[^\"\\]|\\.)*\"|'[^']*'))*)\s*="
)
_KEY_PART = re.compile(r"[A-Za-z0-9_-]+|\"(?:[^\"\\]|\\.)*\"|'[^']*'")

KeyPath = tuple[str | int, ...]


def _key_parts(text: str) -> tuple[str, ...]:
    parts = []
    for part in _KEY_PART.findall(text):
        parts.append(part[1:-1] if part[:1] in "\"'" else part)
    return tuple(parts)


def _key_index(text: str) -> list[tuple[KeyPath, int]]:
    """Best-effort map of key paths to 1-based lines (headers and `key =` lines).

    Good enough to point at the key a schema error names; not a TOML parser (a `key =`
    inside a multi-line string is indexed too, which can only make a location less exact).
    """
    index: list[tuple[KeyPath, int]] = []
    table: KeyPath = ()
    counters: dict[tuple[str, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if header := _HEADER.match(line):
            name = _key_parts(header.group(2))
            if header.group(1) == "[[":
                counters[name] = counters.get(name, -1) + 1
                table = (*name, counters[name])
            else:
                table = name
            index.append((table, number))
        elif key := _KEY.match(line):
            index.append(((*table, *_key_parts(key.group(1))), number))
    return index


def _locate(
    index: list[tuple[KeyPath, int]], text: str, loc: tuple[Any, ...], value: Any
) -> int | None:
    best: tuple[int, int] | None = None  # (length of the common prefix, line)
    for path, number in index:
        common = 0
        for have, want in zip(path, loc, strict=False):
            if have != want:
                break
            common += 1
        # `[[mode]]` indexes as ("mode", 0) while the error is at ("mode",): still a match.
        if common and (best is None or common > best[0]):
            best = (common, number)
    if best is None:
        return None
    length, line = best
    if length < len(loc) and isinstance(value, str) and value:
        # An element of an array: find the line holding the offending string after the key.
        lines = text.splitlines()
        candidates = {f'"{value}"', f"'{value}'"}
        for number in range(line, min(len(lines), line + 500) + 1):
            if any(candidate in lines[number - 1] for candidate in candidates):
                return number
    return line


# -- where the files are --


@dataclass(frozen=True)
class PolicyPaths:
    """Where each level's file lives; injectable so tests never read the real ones."""

    user: Path | None
    project: Path
    local: Path
    managed: Path | None = MANAGED_POLICY_PATH
    claude_user: Path | None = None
    """The user's Claude Code settings (`policies.claude_settings`); None: not read."""
    claude_project: Path | None = None
    """The repository's `.claude/settings.json`; None: not read."""
    claude_local: Path | None = None
    """The repository's `.claude/settings.local.json`; None: not read."""

    @classmethod
    def for_workspace(
        cls,
        workspace: Path,
        *,
        env: Mapping[str, str] | None = None,
        managed: Path | None = MANAGED_POLICY_PATH,
    ) -> PolicyPaths:
        """The standard places for `workspace` (XDG_CONFIG_HOME and CLAUDE_CONFIG_DIR
        honoured), Claude Code's settings files included."""
        env = os.environ if env is None else env
        home = Path(env.get("HOME") or Path.home())
        config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        project, local = project_policy_files(workspace)
        claude_project, claude_local = claude_settings_files(workspace)
        return cls(
            user=config / "warren" / "policy.toml",
            project=project,
            local=local,
            managed=managed,
            claude_user=user_claude_settings(env),
            claude_project=claude_project,
            claude_local=claude_local,
        )


# -- the command line as a policy --


def split_tool_list(values: Iterable[str]) -> tuple[str, ...]:
    """Split `--allowed-tools` values on commas and blanks outside parentheses.

    `"Bash(npm run test:*), Edit"` is two rules, not four words.
    """
    out: list[str] = []
    for value in values:
        depth = 0
        current: list[str] = []
        for char in value:
            if char == "(":
                depth += 1
            elif char == ")":
                depth = max(0, depth - 1)
            if depth == 0 and (char == "," or char.isspace()):
                if "".join(current).strip():
                    out.append("".join(current).strip())
                current = []
                continue
            current.append(char)
        if "".join(current).strip():
            out.append("".join(current).strip())
    return tuple(out)


def command_line_policy(
    *,
    allowed_tools: Iterable[str] = (),
    disallowed_tools: Iterable[str] = (),
    permission_mode: str | None = None,
    writable_roots: Iterable[Path] = (),
) -> PolicyFile:
    """The command line's flags as the `command line` level's policy (`--add-dir`: the
    absolute `writable_roots`).

    Each value may hold several rules (see `split_tool_list`). A bad value raises a
    `PolicyError` whose file is `command line` and whose key is the flag.
    """
    allow = split_tool_list(allowed_tools)
    deny = split_tool_list(disallowed_tools)
    for flag, rules in (("--allowed-tools", allow), ("--disallowed-tools", deny)):
        for rule in rules:
            try:
                parse_rule(rule)
            except RuleSyntaxError as exc:
                raise PolicyError(str(exc), file="command line", key=flag) from None
    mode = (warren_mode(permission_mode) or permission_mode) if permission_mode else None
    if mode is not None and mode not in MODES:
        raise PolicyError(
            f"unknown mode `{permission_mode}`; choose one of {', '.join(MODES)}",
            file="command line",
            key="--permission-mode",
        )
    return PolicyFile.model_validate(
        {
            "mode": mode,
            "permissions": {"allow": allow, "deny": deny},
            "sandbox": {"writable_roots": tuple(str(root) for root in writable_roots)},
        }
    )


# -- the merge --


@dataclass(frozen=True)
class PolicyLayer:
    """One level's policy as loaded."""

    level: Level
    source: str
    """The file's path, or `built-in` / `command line`."""
    policy: PolicyFile
    anchor: Path
    """The directory `/x` path rules of this level are relative to (resolved)."""
    trusted: bool = True
    """False for the project and local files of a repository the user has not trusted."""
    unsupported_hooks: tuple[UnsupportedHook, ...] = ()
    """Hooks a Claude Code settings file declares that Warren does not run (listed)."""
    unread_hooks: int = 0
    """Hooks an untrusted repository's Claude Code settings declare: counted, never read
    into `policy` (`claude_settings.count_declared_hooks`)."""
    unsupported_servers: tuple[UnsupportedServer, ...] = ()
    """MCP servers a `.mcp.json` declares that Warren does not run (listed)."""
    unread_servers: int = 0
    """MCP servers an untrusted repository's `.mcp.json` declares: counted, never started."""
    unsupported_keys: tuple[str, ...] = ()
    """Keys of a Claude Code settings file Warren does not have (`permissions.X`): shown."""


@dataclass(frozen=True)
class RuleEntry:
    """One rule with where it came from."""

    kind: RuleKindName
    parsed: ParsedRule
    level: Level
    source: str
    anchor: Path
    active: bool = True
    """False for an untrusted project's allow rule: shown, never applied."""

    @property
    def text(self) -> str:
        return self.parsed.text


@dataclass(frozen=True)
class LimitSetting:
    value: int | float
    source: str


@dataclass(frozen=True)
class EffectivePolicy:
    """Every level merged: what the engine decides with and `warren policy show` prints."""

    workspace: Path
    """Resolved."""
    layers: tuple[PolicyLayer, ...]
    """Lowest to highest precedence; levels without a file are absent."""
    mode: Mode
    mode_source: str
    rules: tuple[RuleEntry, ...]
    """Highest level first, so the first match names the strongest source."""
    trust: TrustState
    project_hash: str | None
    limits: Mapping[str, LimitSetting] = field(default_factory=dict)
    deny_read: tuple[tuple[str, str], ...] = ()
    """(pattern, source) added to the floor's masks."""
    protected: tuple[tuple[str, str], ...] = ()
    writable_roots: tuple[tuple[Path, str], ...] = ()
    home_allow: tuple[tuple[str, str], ...] = ()
    """(path, source) of the home paths bound back into the sandbox, read-only."""
    hooks: tuple[tuple[Hook, str], ...] = ()
    """The hooks in force, with the file each came from, lowest level first: Warren's
    `[[hooks]]` and those mapped from Claude Code's settings alike (`Hook.matcher_kind` tells
    their matchers apart). An untrusted repository's are never here."""
    examples: tuple[tuple[Example, str], ...] = ()
    unsupported_hooks: tuple[UnsupportedHook, ...] = ()
    """Hooks the loaded Claude Code settings declare that Warren does not run (shown)."""
    untrusted_hooks: tuple[tuple[str, int], ...] = ()
    """(file, number of hooks) of an untrusted repository's files that declare hooks: shown
    and announced at start-up, never run."""
    mcp_servers: tuple[tuple[str, McpServer, str], ...] = ()
    """(name, server, file) of the MCP servers in force; a higher level's server of the same
    name replaces a lower one's. An untrusted repository's are never here."""
    mcp_read_only_tools: bool = False
    """`[mcp] allow_read_only_tools`: see `policies.mcp.McpSection`."""
    unsupported_servers: tuple[UnsupportedServer, ...] = ()
    untrusted_servers: tuple[tuple[str, int], ...] = ()
    """(file, number of servers) of an untrusted repository's files that declare MCP
    servers: shown and announced at start-up, never started."""
    pool: PoolSetting = field(default_factory=PoolSetting)
    """`[pool]` of the user's and the managed policy, merged (`policies.pool.resolve_pool`
    adds `--pool` and `RAY_ADDRESS`)."""

    def limit(self, name: str) -> int | float | None:
        setting = self.limits.get(name)
        return None if setting is None else setting.value

    def hooks_for(self, event: HookEvent) -> tuple[tuple[Hook, str], ...]:
        """The hooks in force for `event`, with their files, in `hooks` order."""
        return tuple(entry for entry in self.hooks if entry[0].event == event)

    def untrusted_hooks_notice(self) -> str | None:
        """The one start-up line saying an untrusted repository's hooks will not run; None
        when there are none."""
        return _untrusted_notice(
            self.untrusted_hooks, self.workspace, "hooks will not run", "`warren hooks list`"
        )

    def untrusted_servers_notice(self) -> str | None:
        """The one start-up line saying an untrusted repository's MCP servers will not start;
        None when there are none."""
        return _untrusted_notice(
            self.untrusted_servers,
            self.workspace,
            "MCP servers will not start",
            "`warren policy show`",
        )


def _untrusted_notice(
    counts: tuple[tuple[str, int], ...], workspace: Path, what: str, review: str
) -> str | None:
    total = sum(count for _, count in counts)
    if not total:
        return None
    where = ", ".join(f"{count} in {_relative(file, workspace)}" for file, count in counts)
    return (
        f"warren: this repository's {what} until you trust it ({where}); "
        f"review them with {review}, then run `warren trust`"
    )


def _relative(file: str, workspace: Path) -> str:
    path = Path(file)
    return str(path.relative_to(workspace)) if path.is_relative_to(workspace) else file


def _defaults_text() -> str:
    return resources.files("policies").joinpath("defaults.toml").read_text(encoding="utf-8")


def load_effective_policy(
    workspace: Path,
    *,
    command_line: PolicyFile | None = None,
    paths: PolicyPaths | None = None,
    trust_store: TrustStore | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    defaults: str | None = None,
    command_line_settings: ClaudeSettings | None = None,
    setting_sources: Collection[str] | None = None,
    command_line_mcp: Sequence[tuple[str, McpJson]] = (),
) -> EffectivePolicy:
    """Load every level for `workspace` and merge them. Raises one located `PolicyError`.

    `command_line_settings` (`--settings`) and `command_line_mcp` ((source, servers) of each
    `--mcp-config`) join the command line's level, below its flags;
    `setting_sources` (`--setting-sources`: `user`, `project`, `local`) names the Claude Code
    settings files read (default: all three).

    `paths`, `trust_store`, `env`, `home` and `defaults` (the built-in file's text) are seams
    for tests; by default they come from the environment and the package.
    """
    env = os.environ if env is None else env
    workspace = workspace.resolve()
    home = (home or Path(env.get("HOME") or Path.home())).resolve()
    paths = paths or PolicyPaths.for_workspace(workspace, env=env)
    if setting_sources is not None:
        paths = dataclasses.replace(
            paths,
            claude_user=paths.claude_user if "user" in setting_sources else None,
            claude_project=paths.claude_project if "project" in setting_sources else None,
            claude_local=paths.claude_local if "local" in setting_sources else None,
        )
    trust_store = trust_store or TrustStore.from_env(env)
    project_hash = project_policy_hash(workspace, policy_files=(paths.project, paths.local))
    trust = trust_store.state(workspace, project_hash)
    trusted = trust in ("trusted", "no project policy")

    layers = [
        PolicyLayer(
            "built-in",
            "built-in",
            parse_policy_text(_defaults_text() if defaults is None else defaults, file="built-in"),
            workspace,
        )
    ]
    levels: tuple[tuple[Level, Path | None, Path | None], ...] = (
        ("user", paths.user, paths.claude_user),
        ("project", paths.project, paths.claude_project),
        ("local", paths.local, paths.claude_local),
    )
    for level, path, claude in levels:
        if level == "project":
            mcp_layer = _mcp_json_layer(workspace, trusted=trusted)
            if mcp_layer is not None:
                layers.append(mcp_layer)
        # Claude Code's file first: within a level Warren's own file wins (its mode, limits).
        if claude is not None:
            layer = _claude_layer(level, claude, workspace, trusted=trusted or level == "user")
            if layer is not None:
                layers.append(layer)
        if path is not None:
            in_repository = level in ("project", "local") and path.is_relative_to(workspace)
            loaded = load_policy_file(path, beneath=workspace if in_repository else None)
            if loaded is not None:
                anchor = workspace if level in ("project", "local") else path.parent.resolve()
                trust_layer = trusted or level == "user"
                layers.append(PolicyLayer(level, str(path), loaded, anchor, trusted=trust_layer))
    if command_line_settings is not None:
        layers.append(
            PolicyLayer(
                "command line",
                command_line_settings.file,
                claude_policy(command_line_settings),
                workspace,
                unsupported_hooks=command_line_settings.unsupported,
                unsupported_keys=tuple(
                    f"permissions.{k}" for k in command_line_settings.permissions.unsupported
                ),
            )
        )
    for source, declared in command_line_mcp:
        layers.append(
            PolicyLayer(
                "command line",
                source,
                PolicyFile(mcp=McpSection(servers=declared.servers)),
                workspace,
                unsupported_servers=declared.unsupported,
            )
        )
    if command_line is not None:
        layers.append(PolicyLayer("command line", "command line", command_line, workspace))
    if paths.managed is not None:
        managed = load_policy_file(paths.managed)
        if managed is not None:
            layers.append(
                PolicyLayer("managed", str(paths.managed), managed, paths.managed.parent.resolve())
            )
    return merge_policy(workspace, tuple(layers), trust=trust, project_hash=project_hash, home=home)


def _check_sandboxed(layer: PolicyLayer) -> None:
    """Only the user's own policy and the managed one may run a hook outside the sandbox, or
    send the workspace to a cluster (`[pool]`); a file that says so anywhere else is wrong,
    trusted or not."""
    if layer.level not in POOL_LEVELS and layer.policy.pool.is_set():
        raise PolicyError(
            "`[pool]` is only allowed in the user's or the managed policy: a repository "
            "cannot send your code to a cluster",
            file=layer.source,
            key="pool",
        )
    if layer.level in ("user", "managed"):
        return
    for index, hook in enumerate(layer.policy.hooks):
        if not hook.sandbox:
            raise PolicyError(
                "`sandbox = false` is only allowed in the user's or the managed policy; a "
                f"{layer.level} hook always runs in the sandbox",
                file=layer.source,
                key=f"hooks[{index}].sandbox",
            )
    for name, server in layer.policy.mcp.servers.items():
        if not server.sandbox and server.command is not None:
            raise PolicyError(
                "`sandbox = false` is only allowed in the user's or the managed policy; a "
                f"{layer.level} MCP server always runs in the sandbox",
                file=layer.source,
                key=f"mcp.servers.{name}.sandbox",
            )


def _mcp_json_layer(workspace: Path, *, trusted: bool) -> PolicyLayer | None:
    """The repository's `.mcp.json` (Claude Code's format) as a project layer; None when
    there is none. Untrusted: its servers are only counted, for the notice (a file that does
    not parse counts as none)."""
    path = workspace / MCP_JSON
    try:
        declared = read_mcp_json(path, beneath=workspace)
    except McpJsonError as exc:
        if not trusted:
            return None
        raise PolicyError(str(exc).removeprefix(f"{path}: "), file=str(path)) from None
    if declared is None:
        return None
    if not trusted:
        count = len(declared.servers) + len(declared.unsupported)
        return PolicyLayer(
            "project", str(path), PolicyFile(), workspace, trusted=False, unread_servers=count
        )
    return PolicyLayer(
        "project",
        str(path),
        PolicyFile(mcp=McpSection(servers=declared.servers)),
        workspace,
        unsupported_servers=declared.unsupported,
    )


def _claude_layer(
    level: Level, path: Path, workspace: Path, *, trusted: bool
) -> PolicyLayer | None:
    """Claude Code's settings file at `path` as a layer of `level`; None when it is absent.

    The user's file may be a link; a repository's is read without following any, and only
    when the repository is trusted: otherwise its hooks are only counted, for the notice.
    """
    in_repository = level != "user" and path.is_relative_to(workspace)
    anchor = workspace if level != "user" else path.parent.resolve()
    if not trusted:
        # As for Warren's own project files: deny and ask rules hold at once; the merge
        # shows its allow rules inactive and takes no mode or roots from it. A file that
        # does not parse gives no rules here; trusting it shows the error.
        count = count_declared_hooks(path, beneath=workspace)
        if count is None:
            return None
        try:
            settings = read_claude_settings(path, beneath=workspace)
        except PolicyError:
            settings = None
        policy = PolicyFile()
        if settings is not None:  # its hooks only counted, never taken
            policy = claude_policy(dataclasses.replace(settings, hooks=()))
        return PolicyLayer(level, str(path), policy, anchor, trusted=False, unread_hooks=count)
    settings = read_claude_settings(path, beneath=workspace if in_repository else None)
    if settings is None:
        return None
    return PolicyLayer(
        level,
        str(path),
        claude_policy(settings),
        anchor,
        unsupported_hooks=settings.unsupported,
        unsupported_keys=tuple(f"permissions.{k}" for k in settings.permissions.unsupported),
    )


def claude_policy(settings: ClaudeSettings) -> PolicyFile:
    """A Claude Code settings file as a Warren policy: its permissions (rules, mode,
    writable roots) and its hooks."""
    permissions = settings.permissions
    try:
        return PolicyFile.model_validate(
            {
                "mode": permissions.mode,
                "permissions": {
                    "allow": permissions.allow,
                    "ask": permissions.ask,
                    "deny": permissions.deny,
                },
                "sandbox": {"writable_roots": permissions.additional_directories},
                "hooks": settings.hooks,
            }
        )
    except ValidationError as exc:  # checked field by field when read; kept as a located error
        problem = exc.errors(include_url=False)[0]
        raise PolicyError(problem["msg"], file=settings.file, key="permissions") from None


def merge_policy(
    workspace: Path,
    layers: Sequence[PolicyLayer],
    *,
    trust: TrustState = "no project policy",
    project_hash: str | None = None,
    home: Path | None = None,
) -> EffectivePolicy:
    """Merge loaded layers (lowest precedence first) into the effective policy.

    A pure function of its inputs: `load_effective_policy` reads the files and the trust
    store, then calls this. `home` resolves `~/` in writable roots (default: the user's).
    """
    layers = tuple(layers)
    home = home or Path.home()
    mode: Mode = "default"
    mode_source = "built-in"
    limits: dict[str, LimitSetting] = {}
    rules: list[RuleEntry] = []
    deny_read: list[tuple[str, str]] = []
    protected: list[tuple[str, str]] = []
    writable: list[tuple[Path, str]] = []
    home_allow: list[tuple[str, str]] = []
    hooks: list[tuple[Hook, str]] = []
    unsupported: list[UnsupportedHook] = []
    untrusted_hooks: list[tuple[str, int]] = []
    examples: list[tuple[Example, str]] = []
    servers: dict[str, tuple[McpServer, str]] = {}
    read_only_tools = False
    unsupported_servers: list[UnsupportedServer] = []
    untrusted_servers: list[tuple[str, int]] = []
    for layer in layers:  # lowest first: later (higher) levels overwrite scalars
        policy = layer.policy
        _check_sandboxed(layer)
        if layer.trusted and policy.mode is not None:
            mode, mode_source = policy.mode, layer.source
        if layer.trusted:
            for name, value in policy.limits.model_dump(exclude_none=True).items():
                limits[name] = LimitSetting(value, layer.source)
            for root in policy.sandbox.writable_roots:
                writable.append((_root_path(root, layer.anchor, home), layer.source))
            home_allow.extend((path, layer.source) for path in policy.sandbox.home_allow)
            hooks.extend((hook, layer.source) for hook in policy.hooks)
            unsupported.extend(layer.unsupported_hooks)
            servers.update(
                (name, (server, layer.source)) for name, server in policy.mcp.servers.items()
            )
            if policy.mcp.allow_read_only_tools is not None:
                read_only_tools = policy.mcp.allow_read_only_tools
            unsupported_servers.extend(layer.unsupported_servers)
        else:
            if count := len(policy.hooks) + layer.unread_hooks:
                untrusted_hooks.append((layer.source, count))
            if count := len(policy.mcp.servers) + layer.unread_servers:
                untrusted_servers.append((layer.source, count))
        deny_read.extend((pattern, layer.source) for pattern in policy.sandbox.deny_read)
        protected.extend((pattern, layer.source) for pattern in policy.sandbox.protected)
        examples.extend((example, layer.source) for example in policy.examples)
    pool = merge_pool(
        (layer.policy.pool, layer.source, layer.level)
        for layer in layers
        if layer.level in POOL_LEVELS
    )
    for layer in reversed(layers):  # highest first
        permissions = layer.policy.permissions
        for kind, texts in (
            ("deny", permissions.deny),
            ("ask", permissions.ask),
            ("allow", permissions.allow),
        ):
            for text in texts:
                rules.append(
                    RuleEntry(
                        kind,  # type: ignore[arg-type]
                        parse_rule(text),
                        layer.level,
                        layer.source,
                        layer.anchor,
                        active=layer.trusted or kind != "allow",
                    )
                )
    return EffectivePolicy(
        workspace=workspace,
        layers=layers,
        mode=mode,
        mode_source=mode_source,
        rules=tuple(rules),
        trust=trust,
        project_hash=project_hash,
        limits=limits,
        deny_read=tuple(deny_read),
        protected=tuple(protected),
        writable_roots=tuple(writable),
        home_allow=tuple(home_allow),
        hooks=tuple(hooks),
        examples=tuple(examples),
        unsupported_hooks=tuple(unsupported),
        untrusted_hooks=tuple(untrusted_hooks),
        mcp_servers=tuple((name, server, source) for name, (server, source) in servers.items()),
        mcp_read_only_tools=read_only_tools,
        unsupported_servers=tuple(unsupported_servers),
        untrusted_servers=tuple(untrusted_servers),
        pool=pool,
    )


def _root_path(text: str, anchor: Path, home: Path) -> Path:
    if text == "~" or text.startswith("~/"):
        return (home / text[2:]).resolve()
    return (anchor / text).resolve()


# -- writing a remembered rule --


def toml_string(text: str) -> str:
    """`text` as a TOML basic string (every control character escaped)."""
    out = ['"']
    for char in text:
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


_LOCAL_HEADER = """\
# Warren: this repository's policy for you alone (not committed; see .gitignore).
# "Don't ask again" answers are added to the allow list below.
"""


def append_allow_rule(path: Path, rule: str, *, beneath: Path | None = None) -> bool:
    """Add `rule` to `[permissions] allow` of the policy file at `path`, keeping it valid.

    Edited with tomlkit, so comments and layout are kept: the rule joins the existing array
    (or an `allow` key or a `[permissions]` table is added). The result is parsed and
    checked before it replaces the file atomically (`policies.atomic.write_atomic`). With
    `beneath` (the repository), no directory below it may be a link; the file itself is never
    a link. Returns False when the rule was already there.

    **Errors:** `PolicyError` when the rule is invalid, the file is broken, a link, or the
    edit cannot be made safely (then the user adds the rule by hand); the file is unchanged.
    """
    rule = rule.strip()
    try:
        parse_rule(rule)
    except RuleSyntaxError as exc:
        raise PolicyError(str(exc), file=str(path), key="permissions.allow") from None
    text = read_for_edit(path, beneath)
    before = parse_policy_text(text, file=str(path)) if text else PolicyFile()
    if rule in before.permissions.allow:
        return False
    updated = _insert_allow(text, rule)
    after: PolicyFile | None = None
    if updated is not None:
        try:
            after = parse_policy_text(updated, file=str(path))
        except PolicyError:
            after = None
    if updated is None or after is None or after != _with_allow(before, rule):
        raise PolicyError(
            f"cannot add {toml_string(rule)} to the allow list automatically; "
            "add it to `[permissions] allow` by hand",
            file=str(path),
            key="permissions.allow",
        )
    try:
        write_atomic(path, updated.encode("utf-8"), beneath=beneath)
    except OSError as exc:
        raise PolicyError(str(exc), file=str(path)) from None
    return True


def read_for_edit(path: Path, beneath: Path | None) -> str:
    """A policy file's text before an edit (`""` when it does not exist).

    **Errors:** `PolicyError` for a link, a FIFO, a file too large or not UTF-8.
    """
    try:
        found = read_regular(path, limit=_MAX_POLICY_BYTES, beneath=beneath)
    except OSError as exc:
        raise PolicyError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    match found.state:
        case "missing":
            return ""
        case "file":
            try:
                return found.content.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = found.content.count(b"\n", 0, exc.start) + 1
                raise PolicyError(
                    "the file is not valid UTF-8", file=str(path), line=line
                ) from None
        case "link":
            why = "it, or a directory on the way to it, is a symbolic link"
        case "not a regular file":
            why = "it is not a regular file"
        case "too large":
            why = f"it is larger than {_MAX_POLICY_BYTES} bytes"
        case unreachable:
            assert_never(unreachable)
    raise PolicyError(f"Warren does not edit this file: {why} (nothing changed)", file=str(path))


def _with_allow(policy: PolicyFile, rule: str) -> PolicyFile:
    permissions = policy.permissions.model_copy(update={"allow": (*policy.permissions.allow, rule)})
    return policy.model_copy(update={"permissions": permissions})


def _insert_allow(text: str, rule: str) -> str | None:
    """`text` with `rule` appended to `permissions.allow`, or None when tomlkit cannot."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError
    from tomlkit.items import Array, InlineTable, Table

    if not text.strip():
        document = tomlkit.parse(_LOCAL_HEADER)
        document.add(tomlkit.nl())
    else:
        try:
            document = tomlkit.parse(text)
        except TOMLKitError:
            return None
    try:
        permissions = document.get("permissions")
        if permissions is None:
            table = tomlkit.table()
            table.add("allow", tomlkit.array().multiline(True))
            document.add("permissions", table)
            permissions = document["permissions"]
        if not isinstance(permissions, Table | InlineTable):
            return None
        allow = permissions.get("allow")
        if allow is None:
            inline = isinstance(permissions, InlineTable)
            permissions.add("allow", tomlkit.array().multiline(not inline))
            allow = permissions["allow"]
        if not isinstance(allow, Array):
            return None
        allow.append(rule)
        return tomlkit.dumps(document)
    except (TOMLKitError, ValueError, TypeError, KeyError):
        return None


def save_remembered_rule(workspace: Path, rule: str, *, trust_store: TrustStore) -> Path:
    """Persist a "don't ask again" rule to the workspace's local policy file.

    Writing the file changes the repository's hash, which would make it untrusted and the
    new rule ignored. So the hash is re-recorded when the repository was trusted just before
    the write, or when it contributed nothing at all (then the file is the user's own). A
    repository that was untrusted stays untrusted. The file is written without following
    links in the repository (a `.warren` or `policy.local.toml` that is a link is refused).
    Returns the path.

    **Errors:** `PolicyError` (the rule, the file, a link, or the trust store could not be
    written; in each case the files are as they were before, except that the rule may be
    saved while the trust store could not be updated, which the message says).
    """
    workspace = workspace.resolve()
    before = project_policy_hash(workspace)
    was_trusted = before is None or trust_store.is_trusted(workspace, before)
    local = workspace / LOCAL_POLICY
    append_allow_rule(local, rule, beneath=workspace)
    if was_trusted:
        try:
            trust_store.trust(workspace, project_policy_hash(workspace))
        except OSError as exc:
            raise PolicyError(
                f"the rule was saved, but the trust store could not be updated ({exc}); "
                "run `warren policy trust` to use it",
                file=str(trust_store.file),
            ) from None
    return local


# -- MCP servers in a policy file (`warren mcp add|remove`) --


def set_mcp_server(
    path: Path, name: str, server: McpServer | None, *, beneath: Path | None = None
) -> bool:
    """Add (or replace) `[mcp.servers.NAME]` in the policy file at `path`, or remove it when
    `server` is None, keeping comments and layout (tomlkit). The result is parsed and checked
    before it replaces the file atomically; `beneath` as in `append_allow_rule`. Returns False
    when there was nothing to remove.

    **Errors:** `PolicyError` (a bad name, a broken file, a link; the file is unchanged).
    """
    import tomlkit

    if not MCP_SERVER_NAME.fullmatch(name) or "__" in name:
        raise PolicyError(
            f"server name {name!r}: use letters, digits, `-` and `_` (no `__`)",
            file=str(path),
            key="mcp.servers",
        )
    text = read_for_edit(path, beneath)
    before = parse_policy_text(text, file=str(path)) if text else PolicyFile()
    document = tomlkit.parse(text)
    servers = document.setdefault("mcp", tomlkit.table()).setdefault("servers", tomlkit.table())
    if server is None:
        if name not in servers:
            return False
        del servers[name]
    else:
        table = tomlkit.table()
        for key, value in server.model_dump(exclude_defaults=True).items():
            table[key] = list(value) if isinstance(value, tuple) else value
        servers[name] = table
    updated = tomlkit.dumps(document)
    after = parse_policy_text(updated, file=str(path))
    expected = dict(before.mcp.servers)
    if server is None:
        expected.pop(name)
    else:
        expected[name] = server
    if after.mcp.servers != expected:
        raise PolicyError(
            "cannot edit the MCP servers of this file automatically; edit it by hand",
            file=str(path),
            key=f"mcp.servers.{name}",
        )
    try:
        write_atomic(path, updated.encode("utf-8"), beneath=beneath)
    except OSError as exc:
        raise PolicyError(str(exc), file=str(path)) from None
    return True
