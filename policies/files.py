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

import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, assert_never, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from policies.atomic import read_regular, write_atomic
from policies.rules import ParsedRule, RuleSyntaxError, parse_rule
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
    "append_allow_rule",
    "command_line_policy",
    "load_effective_policy",
    "load_policy_file",
    "merge_policy",
    "parse_policy_text",
    "save_remembered_rule",
    "split_tool_list",
    "toml_string",
]

Mode = Literal["default", "accept-edits", "plan", "dont-ask", "bypass"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)
Level = Literal["built-in", "user", "project", "local", "command line", "managed"]
LEVELS: Final[tuple[Level, ...]] = get_args(Level)
"""Lowest to highest precedence."""
RuleKindName = Literal["allow", "ask", "deny"]
HookEvent = Literal[
    "PreToolUse",
    "PostToolUse",
    "UserPromptSubmit",
    "Stop",
    "SubagentStop",
    "SessionStart",
    "SessionEnd",
    "Notification",
    "PreCompact",
]
_TOOL_EVENTS = frozenset({"PreToolUse", "PostToolUse"})
_MATCHER_EVENTS = _TOOL_EVENTS | {"SessionStart", "PreCompact"}
"""Events whose hooks may have a `matcher`: a tool call, or SessionStart's `source` and
PreCompact's `trigger` (as Claude Code allows)."""

MANAGED_POLICY_PATH: Final = Path("/etc/warren/policy.toml")
_MAX_POLICY_BYTES: Final = 1 << 20
"""A policy file larger than this is refused unread."""
_MODE_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"acceptEdits": "accept-edits", "bypassPermissions": "bypass", "dontAsk": "dont-ask"}
)


class PolicyError(Exception):
    """A policy that cannot be used. Nothing runs on it.

    `file` is the path of the policy file (or `command line`, `built-in`), `line` the 1-based
    line when known, `key` the dotted key (`permissions.allow[2]`) when known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        where = ":".join(part for part in (file, str(line) if line else None) if part)
        text = ": ".join(part for part in (where, key, message) if part)
        super().__init__(text)
        self.message = message
        self.file = file
        self.line = line
        self.key = key


# -- schema --


def _valid_rule(text: str) -> str:
    try:
        parse_rule(text)
    except RuleSyntaxError as exc:
        raise ValueError(str(exc)) from None
    return text.strip()


RuleText = Annotated[StrictStr, AfterValidator(_valid_rule)]


def _valid_matcher(text: str) -> str:
    """A hook matcher: a rule (`Bash(git push:*)`, `Edit(src/**)`, `Bash`), or, as Claude
    Code writes them, a regular expression over names (`Edit|Write`, `mcp__.*`); empty or
    `*` matches everything. The hooks layer (orchestrator/hooks/matchers.py) decides which."""
    text = text.strip()
    if text in ("", "*"):
        return text
    try:
        parse_rule(text)
    except RuleSyntaxError as rule_error:
        try:
            re.compile(text)
        except (re.error, RecursionError, OverflowError):
            raise ValueError(
                f"neither a rule nor a regular expression: {rule_error}"
            ) from None
    return text


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PermissionRules(_Section):
    """`[permissions]`: rules in `Tool(specifier)` syntax (see `policies.rules`)."""

    allow: tuple[RuleText, ...] = ()
    """Calls that run without asking. A project's allow rules count once it is trusted."""
    ask: tuple[RuleText, ...] = ()
    """Calls that always ask (beat allow rules at every level)."""
    deny: tuple[RuleText, ...] = ()
    """Calls that never run, whatever any other level says."""


class SandboxAdditions(_Section):
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


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class Limits(_Section):
    """`[limits]`: each one from the highest level that sets it."""

    max_turns: Annotated[int, Field(strict=True, ge=1, le=100_000)] | None = None
    """Model turns per run before it stops with `max_turns`. Kernel default 100."""
    max_subagents: Annotated[int, Field(strict=True, ge=0, le=10)] | None = None
    """Subagent worker processes at once (0 disables dispatch_agent). At most 10."""
    max_concurrency: Annotated[int, Field(strict=True, ge=1, le=10)] | None = None
    """Concurrency-safe tool calls run at once. At most 10 (the design's cap)."""
    tool_timeout_s: Annotated[float, Field(gt=0, le=86_400), AfterValidator(_finite)] | None = None
    """Seconds a tool call may run unless the tool says otherwise. Kernel default 300."""
    max_budget_usd: Annotated[float, Field(gt=0), AfterValidator(_finite)] | None = None
    """US dollars the session may spend on the model, subagents included. Default: no limit."""
    max_output_tokens_total: Annotated[int, Field(strict=True, ge=1)] | None = None
    """Output tokens the session may generate, subagents included. Default: no limit."""
    compact_threshold: (
        Annotated[float, Field(ge=0.5, le=0.95), AfterValidator(_finite)] | None
    ) = None
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


class Hook(_Section):
    """`[[hooks]]`: a command run at an event (validated here, run by the hooks layer)."""

    event: HookEvent
    command: Annotated[StrictStr, Field(min_length=1)]
    """Shell command line, run in the sandbox with the event as JSON on stdin."""
    matcher: Annotated[StrictStr, AfterValidator(_valid_matcher)] | None = None
    """For PreToolUse/PostToolUse: only calls this rule (or regular expression over tool
    names, `Edit|Write`) matches; for SessionStart/PreCompact: a regular expression over the
    `source`/`trigger`. Default: every one."""
    timeout_s: Annotated[float, Field(gt=0, le=3600), AfterValidator(_finite)] = 60.0
    """Seconds before the hook is killed. Default 60."""
    sandbox: StrictBool = True
    """Run under the floor (workspace as the tools have it, no network, secrets masked).
    Only a user or managed policy may set false; a repository's hooks always run sandboxed."""

    @model_validator(mode="after")
    def _matcher_for_tool_events(self) -> Hook:
        if self.matcher is not None and self.event not in _MATCHER_EVENTS:
            raise ValueError(
                "`matcher` only applies to PreToolUse, PostToolUse, SessionStart and "
                f"PreCompact hooks, not {self.event}"
            )
        return self


class Example(_Section):
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


class PolicyFile(_Section):
    """One policy file (or the command line's flags), as written."""

    mode: Mode | None = None
    """default | accept-edits | plan | dont-ask | bypass; unset leaves it to lower levels."""
    permissions: PermissionRules = PermissionRules()
    sandbox: SandboxAdditions = SandboxAdditions()
    limits: Limits = Limits()
    hooks: tuple[Hook, ...] = ()
    examples: tuple[Example, ...] = ()


_MODELS: Final[Mapping[str, type[BaseModel]]] = MappingProxyType(
    {
        "permissions": PermissionRules,
        "sandbox": SandboxAdditions,
        "limits": Limits,
        "hooks": Hook,
        "examples": Example,
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
    try:
        found = read_regular(
            path, limit=_MAX_POLICY_BYTES, beneath=beneath, follow_links=beneath is None
        )
    except OSError as exc:
        raise PolicyError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    match found.state:
        case "missing":
            return None
        case "file":
            raw = found.content
        case "link":
            raise PolicyError(
                "it, or a directory on the way to it, is a symbolic link; Warren does not "
                "follow links in a repository (make it a regular file)",
                file=str(path),
            )
        case "not a regular file":
            raise PolicyError("cannot read the file: not a regular file", file=str(path))
        case "too large":
            raise PolicyError(
                f"cannot read the file: larger than {_MAX_POLICY_BYTES} bytes", file=str(path)
            )
        case unreachable:
            assert_never(unreachable)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise PolicyError("the file is not valid UTF-8", file=str(path), line=line) from None
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


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
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

    @classmethod
    def for_workspace(
        cls,
        workspace: Path,
        *,
        env: Mapping[str, str] | None = None,
        managed: Path | None = MANAGED_POLICY_PATH,
    ) -> PolicyPaths:
        """The standard places for `workspace` (XDG_CONFIG_HOME honoured)."""
        env = os.environ if env is None else env
        home = Path(env.get("HOME") or Path.home())
        config = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        project, local = project_policy_files(workspace)
        return cls(
            user=config / "warren" / "policy.toml", project=project, local=local, managed=managed
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
) -> PolicyFile:
    """The command line's flags as the `command line` level's policy.

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
    mode = _MODE_ALIASES.get(permission_mode, permission_mode) if permission_mode else None
    if mode is not None and mode not in MODES:
        raise PolicyError(
            f"unknown mode `{permission_mode}`; choose one of {', '.join(MODES)}",
            file="command line",
            key="--permission-mode",
        )
    return PolicyFile.model_validate({"mode": mode, "permissions": {"allow": allow, "deny": deny}})


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
    """Hooks that may run (an untrusted project's are left out), with their source."""
    examples: tuple[tuple[Example, str], ...] = ()

    def limit(self, name: str) -> int | float | None:
        setting = self.limits.get(name)
        return None if setting is None else setting.value


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
) -> EffectivePolicy:
    """Load every level for `workspace` and merge them. Raises one located `PolicyError`.

    `paths`, `trust_store`, `env`, `home` and `defaults` (the built-in file's text) are seams
    for tests; by default they come from the environment and the package.
    """
    env = os.environ if env is None else env
    workspace = workspace.resolve()
    home = (home or Path(env.get("HOME") or Path.home())).resolve()
    paths = paths or PolicyPaths.for_workspace(workspace, env=env)
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
    levels: tuple[tuple[Level, Path | None], ...] = (
        ("user", paths.user),
        ("project", paths.project),
        ("local", paths.local),
    )
    for level, path in levels:
        if path is None:
            continue
        in_repository = level in ("project", "local") and path.is_relative_to(workspace)
        loaded = load_policy_file(path, beneath=workspace if in_repository else None)
        if loaded is not None:
            anchor = workspace if level in ("project", "local") else path.parent.resolve()
            layers.append(
                PolicyLayer(level, str(path), loaded, anchor, trusted=trusted or level == "user")
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
    examples: list[tuple[Example, str]] = []
    for layer in layers:  # lowest first: later (higher) levels overwrite scalars
        policy = layer.policy
        if layer.trusted and policy.mode is not None:
            mode, mode_source = policy.mode, layer.source
        if layer.trusted:
            for name, value in policy.limits.model_dump(exclude_none=True).items():
                limits[name] = LimitSetting(value, layer.source)
            for root in policy.sandbox.writable_roots:
                writable.append((_root_path(root, layer.anchor, home), layer.source))
            home_allow.extend((path, layer.source) for path in policy.sandbox.home_allow)
            for hook in policy.hooks:
                if not hook.sandbox and layer.level not in ("user", "managed"):
                    raise PolicyError(
                        "`sandbox = false` is only allowed in the user's or the managed "
                        f"policy; a {layer.level} hook always runs in the sandbox",
                        file=layer.source,
                        key="hooks",
                    )
                hooks.append((hook, layer.source))
        deny_read.extend((pattern, layer.source) for pattern in policy.sandbox.deny_read)
        protected.extend((pattern, layer.source) for pattern in policy.sandbox.protected)
        examples.extend((example, layer.source) for example in policy.examples)
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
    text = _read_for_edit(path, beneath)
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


def _read_for_edit(path: Path, beneath: Path | None) -> str:
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
