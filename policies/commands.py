"""`warren policy ...`: the functions behind the subcommands, on parsed values.

The CLI (`orchestrator/cli/subcommands/policy.py`) parses the command line, calls these and prints
what they return; nothing here writes to the terminal. Each returns a `CommandReport`: its text and
its exit code: 0 done, 1 a check failed (`test` mismatch, `init` refused), 2 the policy could
not be loaded (the text holds the located `PolicyError`). Everything outside the
arguments (environment, managed policy path, trust store, the floor probe) comes through a
`CommandEnvironment`, the seam tests use.

    warren policy check [--json] [--cwd DIR] -- COMMAND...    check(" ".join(COMMAND), ...)
    warren policy check [--json] [--cwd DIR] Edit PATH         check(("Edit", PATH), ...)
    warren policy show [--cwd DIR]                             show(cwd)
    warren policy test [--cwd DIR]                             test(cwd)
    warren policy init [--cwd DIR]                             init(cwd)
    warren policy trust [DIR] / untrust [DIR]                  trust_cmd(path) / untrust_cmd
    warren hooks list [--cwd DIR]                              hooks_list(cwd)
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TextIO

from policies.atomic import open_directory, read_regular
from policies.claude_settings import claude_settings_files, read_claude_settings
from policies.engine import PolicyDecision, PolicyEngine, default_facts
from policies.facts import ToolFacts
from policies.files import (
    MANAGED_POLICY_PATH,
    EffectivePolicy,
    Example,
    PolicyError,
    PolicyFile,
    PolicyPaths,
    load_effective_policy,
    load_policy_file,
    parse_policy_text,
    set_mcp_server,
    toml_string,
)
from policies.mcp import McpServer
from policies.pool import RAY_ADDRESS_ENV
from policies.trust import (
    LOCAL_POLICY,
    PROJECT_POLICY,
    TrustStore,
    project_policy_files,
    project_policy_hash,
    repository_files,
)

__all__ = [
    "CheckTarget",
    "CommandEnvironment",
    "CommandReport",
    "check",
    "check_target",
    "detect_project_commands",
    "hook_lines",
    "hooks_list",
    "init",
    "mcp_get",
    "mcp_list",
    "mcp_set",
    "pool_lines",
    "probe_floor_sync",
    "show",
    "starter_policy",
    "test",
    "trust_cmd",
    "untrust_cmd",
]

CheckTarget = str | tuple[str, str]
"""A Bash command line, or a (tool, path) pair such as ("Edit", "src/a.py")."""

EXIT_OK, EXIT_FAILED, EXIT_POLICY = 0, 1, 2


def probe_floor_sync() -> bool:
    """Run the floor probe (`sandbox.probe`) once, from synchronous code."""
    import trio

    from sandbox.probe import probe_floor

    return trio.run(probe_floor).proven


@dataclass(frozen=True)
class CommandEnvironment:
    """Everything the commands take from outside their arguments; tests inject each."""

    env: Mapping[str, str] | None = None
    """Environment for XDG directories and HOME (default: `os.environ`)."""
    managed: Path | None = MANAGED_POLICY_PATH
    """The managed policy file (default `/etc/warren/policy.toml`; None: no managed level)."""
    trust_store: TrustStore | None = None
    """Default: `$XDG_STATE_HOME/warren/trust.json` from `env`."""
    probe: Callable[[], bool] = probe_floor_sync
    """Proves the floor when a command is not told its state (runs a real sandbox)."""
    command_line: PolicyFile | None = None
    """The command line level (`--allowed-tools`, `--permission-mode`), if any."""
    tool_facts: Mapping[str, ToolFacts] = field(default_factory=dict)
    """The facts of the tools calls may name, by tool name (the CLI passes the built-in
    tools'); a tool missing here has no family and no path."""

    def facts(self, tool: str) -> ToolFacts:
        return self.tool_facts.get(tool) or default_facts(tool)

    def call(self, tool: str, path: str) -> tuple[str, dict[str, Any]]:
        """A path tool's call on `path`, in the tool's first declared path field.

        **Errors:** `PolicyError` when `tool` declares no path field.
        """
        fields = self.facts(tool).path_fields
        if not fields:
            takes = sorted(n for n, f in self.tool_facts.items() if f.path_fields)
            raise PolicyError(
                f"{tool} takes no path; the path tools are " + ", ".join(takes),
                file="command line",
                key="check",
            )
        return tool, {fields[0]: path}

    def read_only(self, tool: str) -> bool:
        """Whether `tool` is read-only whatever its input: it reads files or touches nothing."""
        return self.facts(tool).family in ("read", "meta")

    def store(self) -> TrustStore:
        return self.trust_store or TrustStore.from_env(self.env)

    def load(self, workspace: Path) -> EffectivePolicy:
        paths = PolicyPaths.for_workspace(workspace, env=self.env, managed=self.managed)
        return load_effective_policy(
            workspace,
            command_line=self.command_line,
            paths=paths,
            trust_store=self.store(),
            env=self.env,
        )


_DEFAULT_ENVIRONMENT = CommandEnvironment()

P = ParamSpec("P")


@dataclass(frozen=True)
class CommandReport:
    """What a command did: its exit code and the text the CLI prints (`warren policy ...`)."""

    exit_code: int
    text: str


def _reported(command: Callable[Concatenate[TextIO, P], int]) -> Callable[P, CommandReport]:
    """A command that writes its report to a stream, made to return it as a value."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> CommandReport:
        out = io.StringIO()
        code = command(out, *args, **kwargs)
        return CommandReport(code, out.getvalue())

    return run


def _error(err: PolicyError, out: TextIO) -> int:
    print(f"error: {err}", file=out)
    return EXIT_POLICY


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-" if value is None else str(value)


# -- check --


def check_target(args: Sequence[str], *, after_dashdash: bool) -> CheckTarget:
    """Turn `check`'s positional arguments into a target.

    After `--` the words are one command line joined by blanks (quote a pipeline as one
    word: `-- 'ls | wc -l'`); otherwise `TOOL PATH` for a path tool.
    """
    if after_dashdash:
        if not args:
            raise PolicyError("give the command after `--`", file="command line", key="check")
        return " ".join(args)
    if len(args) == 2:
        return (args[0], args[1])
    raise PolicyError(
        "give `-- COMMAND...` for a Bash command or `TOOL PATH` for a path tool "
        "(`Read src/a.py`, `Edit src/a.py`)",
        file="command line",
        key="check",
    )


def _target_call(
    target: CheckTarget, environment: CommandEnvironment
) -> tuple[str, dict[str, Any]]:
    if isinstance(target, str):
        return "Bash", {"command": target}
    return environment.call(*target)


@_reported
def check(
    out: TextIO,
    target: CheckTarget,
    *,
    json_output: bool = False,
    cwd: Path,
    floor_proven: bool | None = None,
    environment: CommandEnvironment = _DEFAULT_ENVIRONMENT,
) -> int:
    """Print the decision the policy gives one call in `cwd`.

    `floor_proven=None` runs the floor probe (`environment.probe`). The JSON form has
    exactly the keys decision, read_only, concurrency_safe, rule, source, mode, floor.
    """
    workspace = cwd.resolve()
    try:
        policy = environment.load(workspace)
        floor = environment.probe() if floor_proven is None else floor_proven
        engine = PolicyEngine(
            policy,
            workspace=workspace,
            floor_proven=floor,
            env=environment.env,
            tool_facts=environment.tool_facts,
        )
        tool, input = _target_call(target, environment)
    except PolicyError as err:
        return _error(err, out)
    decision = engine.decide(
        tool,
        input,
        tool_read_only=environment.read_only(tool),
        facts=environment.facts(tool),
    )
    if json_output:
        print(json.dumps(_check_json(decision)), file=out)
    else:
        _print_decision(decision, out)
    return EXIT_OK


def _check_json(decision: PolicyDecision) -> dict[str, Any]:
    return {
        "decision": decision.decision,
        "read_only": decision.read_only,
        "concurrency_safe": decision.concurrency_safe,
        "rule": decision.rule,
        "source": decision.source,
        "mode": decision.mode,
        "floor": decision.floor,
    }


def _print_decision(decision: PolicyDecision, out: TextIO) -> None:
    rows = [
        ("decision", decision.decision),
        ("reason", decision.reason),
        ("read_only", decision.read_only),
        ("concurrency_safe", decision.concurrency_safe),
        ("run_read_only", decision.run_read_only),
        ("rule", decision.rule),
        ("source", decision.source),
        ("mode", decision.mode),
        ("floor", decision.floor),
    ]
    for name, value in rows:
        print(f"{name + ':':<18}{_fmt(value)}", file=out)


# -- import --


@_reported
def import_cmd(out: TextIO, cwd: Path, *, dry_run: bool = False) -> int:
    """`warren policy import`: the repository's Claude Code settings files written into its
    Warren policy files (`policies.claude_import`)."""
    from policies.claude_import import import_claude_settings

    try:
        results = import_claude_settings(cwd, dry_run=dry_run)
    except PolicyError as err:
        return _error(err, out)
    if not results:
        print("no Claude Code settings in this repository (.claude/settings*.json)", file=out)
        return EXIT_OK
    for result in results:
        verb = "would add" if dry_run else "added"
        print(f"{result.source} -> {result.target}:", file=out)
        for line in result.written:
            print(f"  {verb} {line}", file=out)
        if not result.written:
            print("  nothing new", file=out)
        for line in result.skipped:
            print(f"  not imported: {line}", file=out)
    if not dry_run and any(result.written for result in results):
        print(
            "the project's policy changed: review it, then run `warren trust` for its allow "
            "rules and hooks to count (the .claude files are still read; remove them if the "
            "Warren files should be the only source)",
            file=out,
        )
    return EXIT_OK


# -- show --


_TRUST_NOTES = {
    "trusted": "trusted",
    "untrusted": "NOT trusted: its allow rules, hooks, mode, limits, writable roots and agents "
    "are ignored (review .warren/, .claude/settings*.json, .mcp.json and its memory files such "
    "as CLAUDE.md, then run `warren policy trust`)",
    "changed": "NOT trusted: a file it contributes (policy, Claude Code settings, agent, MCP or "
    "memory file) changed since you trusted it (review it and run `warren policy trust` again)",
    "no project policy": "no project files to trust (policy, Claude Code settings, agent, MCP or "
    "memory files)",
}


@_reported
def show(out: TextIO, cwd: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT) -> int:
    """Print the effective policy: each rule and setting with the file it comes from."""
    try:
        policy = environment.load(cwd.resolve())
    except PolicyError as err:
        return _error(err, out)
    print(f"workspace: {policy.workspace}", file=out)
    print(f"project:   {_TRUST_NOTES[policy.trust]}", file=out)
    print("files (lowest precedence first):", file=out)
    for layer in policy.layers:
        note = "" if layer.trusted else "  (not trusted)"
        print(f"  {layer.level:<13}{layer.source}{note}", file=out)
    print(f"mode: {policy.mode}  ({policy.mode_source})", file=out)
    print("rules (deny wins, then ask, then allow):", file=out)
    if not policy.rules:
        print("  (none)", file=out)
    for kind in ("deny", "ask", "allow"):
        for entry in policy.rules:
            if entry.kind == kind:
                note = "" if entry.active else "  (ignored: project not trusted)"
                print(f"  {kind:<6}{entry.text:<40} {entry.source}{note}", file=out)
    if policy.deny_read or policy.protected or policy.writable_roots or policy.home_allow:
        print("sandbox additions:", file=out)
        for name, values in (
            ("deny_read", policy.deny_read),
            ("protected", policy.protected),
            ("home_allow", policy.home_allow),
        ):
            for value, source in values:
                print(f"  {name:<15}{value:<30} {source}", file=out)
        for root, source in policy.writable_roots:
            print(f"  {'writable_root':<15}{root!s:<30} {source}", file=out)
    if policy.limits:
        print("limits:", file=out)
        for name, setting in sorted(policy.limits.items()):
            print(f"  {name} = {setting.value}  ({setting.source})", file=out)
    for line in pool_lines(policy, os.environ if environment.env is None else environment.env):
        print(line, file=out)
    if policy.hooks or policy.unsupported_hooks or policy.untrusted_hooks:
        print("hooks:", file=out)
        for line in hook_lines(policy):
            print(f"  {line}", file=out)
    if policy.mcp_servers or policy.unsupported_servers or policy.untrusted_servers:
        print("mcp servers:", file=out)
        for line in server_lines(policy):
            print(f"  {line}", file=out)
    unsupported = [(key, layer.source) for layer in policy.layers for key in layer.unsupported_keys]
    if unsupported:
        print("not supported (Claude Code settings Warren does not have):", file=out)
        for key, source in unsupported:
            print(f"  {key:<40} {source}", file=out)
    if policy.examples:
        print(f"examples: {len(policy.examples)} (check them with `warren policy test`)", file=out)
    return EXIT_OK


def pool_lines(policy: EffectivePolicy, environ: Mapping[str, str]) -> list[str]:
    """Where subagents run (`[pool]`, `policies.pool`): the backend and the cluster address
    with their files, and the address `--pool ray` would use. Only the address is shown:
    Ray's token (`RAY_AUTH_TOKEN`) is never read here."""
    pool = policy.pool
    lines = [f"pool: {pool.backend}  ({pool.backend_source})"]
    if pool.address is not None:
        lines.append(f"  address = {pool.address}  ({pool.address_source})")
    given = environ.get(RAY_ADDRESS_ENV, "").strip()
    if given and pool.address_level != "managed":
        lines.append(f"  {RAY_ADDRESS_ENV} = {given}  (environment: what --pool ray connects to)")
    return lines


# -- MCP servers --


def server_lines(policy: EffectivePolicy) -> list[str]:
    """One line per MCP server in force (name, how it runs, command or URL, file), then one
    per server declared that does not start (unsupported, or an untrusted repository's)."""
    lines: list[str] = []
    for name, server, source in policy.mcp_servers:
        if server.url is not None:
            how, what = "http, outside the floor", server.url
        elif server.sdk:
            how, what = "sdk, run by the SDK host", "(over the control channel)"
        else:
            how = "stdio, " + (
                "UNSANDBOXED" if not server.sandbox else
                "sandboxed, workspace " + ("writable" if server.write else "read-only")
                + (", HOST NETWORK" if server.network else "")
            )
            what = shlex.join([server.command or "", *server.args])
        lines.append(f"{name}: {_one_line(what)}  [{how}]  ({source})")
    for skipped in policy.unsupported_servers:
        lines.append(f"unsupported: {skipped.name} ({skipped.file}): {skipped.why}")
    return lines + _untrusted_lines(policy.untrusted_servers, "server", "start")


@_reported
def mcp_list(
    out: TextIO, cwd: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT
) -> int:
    """Print the MCP servers in force with their files, and those declared that do not
    start."""
    return _listing(
        out, cwd, environment, server_lines, lambda p: bool(p.mcp_servers), "no MCP servers"
    )

# -- hooks --


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _untrusted_lines(untrusted: Sequence[tuple[str, int]], noun: str, verb: str) -> list[str]:
    """One line per file of an untrusted repository: how many of its `noun`s will not `verb`
    until the repository is trusted."""
    return [
        f"not trusted: {count} {noun}{'s' * (count != 1)} in {source} will not {verb} until you "
        "trust the repository (`warren trust`)"
        for source, count in untrusted
    ]


def hook_lines(policy: EffectivePolicy) -> list[str]:
    """One line per hook in force (event, matcher, command, file), then one per hook that is
    declared but does not run: unsupported ones, and an untrusted repository's, per file."""
    lines: list[str] = []
    for hook, source in policy.hooks:
        matcher = ""
        if hook.matcher is not None:
            matcher = (
                f" [regex {hook.matcher}]" if hook.matcher_kind == "regex" else f" [{hook.matcher}]"
            )
        notes = "" if hook.timeout_s == 60 else f"  timeout {hook.timeout_s:g}s"
        notes += "" if hook.sandbox else "  unsandboxed"
        lines.append(f"{hook.event}{matcher}: {_one_line(hook.command)}{notes}  ({source})")
    for skipped in policy.unsupported_hooks:
        matcher = f" [regex {skipped.matcher}]" if skipped.matcher else ""
        lines.append(
            f"unsupported: {skipped.event}{matcher} {skipped.type} {json.dumps(skipped.text)}  "
            f"({skipped.source}: {skipped.key}): {skipped.reason}"
        )
    return lines + _untrusted_lines(policy.untrusted_hooks, "hook", "run")


@_reported
def hooks_list(
    out: TextIO, cwd: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT
) -> int:
    """Print the hooks in force with their files, and those declared that do not run."""
    return _listing(out, cwd, environment, hook_lines, lambda p: bool(p.hooks), "no hooks")


def _listing(
    out: TextIO,
    cwd: Path,
    environment: CommandEnvironment,
    lines: Callable[[EffectivePolicy], list[str]],
    any_in_force: Callable[[EffectivePolicy], bool],
    nothing: str,
) -> int:
    """`warren hooks list` and `warren mcp list`: what is in force here, one line each."""
    try:
        policy = environment.load(cwd.resolve())
    except PolicyError as err:
        return _error(err, out)
    if not any_in_force(policy):
        print(f"{nothing} in force", file=out)
    for line in lines(policy):
        print(line, file=out)
    return EXIT_OK

McpScope = Literal["user", "project", "local"]


def _scope_file(scope: McpScope, workspace: Path, environment: CommandEnvironment) -> Path:
    paths = PolicyPaths.for_workspace(workspace, env=environment.env, managed=environment.managed)
    path = {"user": paths.user, "project": paths.project, "local": paths.local}[scope]
    assert path is not None
    return path


@_reported
def mcp_set(
    out: TextIO,
    cwd: Path,
    name: str,
    server: McpServer | None,
    *,
    scope: McpScope = "local",
    environment: CommandEnvironment = _DEFAULT_ENVIRONMENT,
) -> int:
    """`warren mcp add` (a server) and `warren mcp remove` (None): edit the scope's policy
    file. A repository that was trusted before its own file changed stays trusted (the user
    made the change); one that was not is told to review and trust it."""
    workspace = cwd.resolve()
    path = _scope_file(scope, workspace, environment)
    store = environment.store()
    before = project_policy_hash(workspace)
    was_trusted = before is None or store.is_trusted(workspace, before)
    beneath = workspace if scope != "user" else None
    try:
        changed = set_mcp_server(path, name, server, beneath=beneath)
    except PolicyError as err:
        return _error(err, out)
    if not changed:
        print(f"no MCP server {name!r} in {path}; nothing changed", file=out)
        return EXIT_POLICY
    print(f"{'added' if server else 'removed'} MCP server {name!r} in {path}", file=out)
    if scope != "user":
        if was_trusted:
            store.trust(workspace, project_policy_hash(workspace))
        else:
            print("this repository is not trusted: its servers start once you run "
                  "`warren trust` (review them with `warren mcp list`)", file=out)  # fmt: skip
    return EXIT_OK


@_reported
def mcp_get(
    out: TextIO, cwd: Path, name: str, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT
) -> int:
    """Print one server in force as its policy table, with the file it comes from."""
    try:
        policy = environment.load(cwd.resolve())
    except PolicyError as err:
        return _error(err, out)
    for found, server, source in policy.mcp_servers:
        if found == name:
            print(f"# {source}", file=out)
            print(f"[mcp.servers.{name}]", file=out)
            for key, value in server.model_dump(exclude_defaults=True).items():
                print(f"{key} = {_toml_value(value)}", file=out)
            return EXIT_OK
    print(f"no MCP server {name!r} in force (see `warren mcp list`)", file=out)
    return EXIT_POLICY


def _toml_value(value: Any) -> str:
    import tomlkit

    text: str = tomlkit.item(list(value) if isinstance(value, tuple) else value).as_string()
    return text


# -- test --


def _example_call(example: Example, environment: CommandEnvironment) -> tuple[str, dict[str, Any]]:
    if example.command is not None:
        return "Bash", {"command": example.command}
    if example.path is not None:
        return environment.call(example.tool, example.path)
    return example.tool, dict(example.input or {})


def _describe(example: Example) -> str:
    if example.command is not None:
        return f"Bash({example.command})"
    if example.path is not None:
        return f"{example.tool}({example.path})"
    return example.tool if not example.input else f"{example.tool}({json.dumps(example.input)})"


@_reported
def test(
    out: TextIO,
    cwd: Path,
    *,
    floor_proven: bool | None = None,
    environment: CommandEnvironment = _DEFAULT_ENVIRONMENT,
) -> int:
    """Check every `[[examples]]` entry of the loaded files; 1 when any gets another decision.

    An example with `floor = true/false` is decided under that floor; the others under the
    floor as probed (or as given). Decisions use the current trust state, so an untrusted
    project's allow examples fail until it is trusted (the output says so).
    """
    workspace = cwd.resolve()
    try:
        policy = environment.load(workspace)
    except PolicyError as err:
        return _error(err, out)
    if not policy.examples:
        print("no examples in the loaded policy files", file=out)
        return EXIT_OK
    engines: dict[bool, PolicyEngine] = {}
    failures = 0
    for example, source in policy.examples:
        floor = example.floor
        if floor is None:
            if floor_proven is None:
                floor_proven = environment.probe()
            floor = floor_proven
        if floor not in engines:
            engines[floor] = PolicyEngine(
                policy,
                workspace=workspace,
                floor_proven=floor,
                no_sandbox_consent=True,
                env=environment.env,
                tool_facts=environment.tool_facts,
            )
        try:
            tool, input = _example_call(example, environment)
        except PolicyError as err:
            return _error(err, out)
        read_only = example.read_only
        if read_only is None:
            read_only = environment.read_only(tool)
        decision = engines[floor].decide(
            tool, input, tool_read_only=read_only, facts=environment.facts(tool)
        )
        described = f"{_describe(example)} -> {example.decision}"
        if decision.decision == example.decision:
            print(f"ok    {described}  ({source})", file=out)
            continue
        failures += 1
        print(f"FAIL  {described}  ({source})", file=out)
        print(
            f"      got {decision.decision}: rule {_fmt(decision.rule)} from {decision.source}; "
            f"{decision.reason}",
            file=out,
        )
    if failures and policy.trust in ("untrusted", "changed"):
        print(f"note: the project is {_TRUST_NOTES[policy.trust]}", file=out)
    total = len(policy.examples)
    print(f"{total - failures} of {total} examples passed", file=out)
    return EXIT_FAILED if failures else EXIT_OK


# -- init --


_MAKE_TARGET = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:(?![=:])", re.MULTILINE)
_INTERESTING = ("test", "tests", "check", "lint", "typecheck", "build", "fmt", "format")


def detect_project_commands(root: Path) -> list[tuple[str, str]]:
    """(rule, where it was found) for the test and build commands the project declares."""
    found: list[tuple[str, str]] = []

    def add(rule: str, why: str) -> None:
        if all(rule != existing for existing, _ in found):
            found.append((rule, why))

    makefile = next(
        (root / n for n in ("Makefile", "GNUmakefile", "makefile") if (root / n).is_file()), None
    )
    if makefile is not None:
        targets = set(_MAKE_TARGET.findall(_read(makefile)))
        for target in _INTERESTING:
            if target in targets:
                add(f"Bash(make {target})", f"{makefile.name} target")
    package = _json_object(root / "package.json")
    scripts = package.get("scripts") if package else None
    if isinstance(scripts, dict):
        runner = (
            "pnpm"
            if (root / "pnpm-lock.yaml").exists()
            else ("yarn" if (root / "yarn.lock").exists() else "npm")
        )
        for name in _INTERESTING:
            if name in scripts:
                add(f"Bash({runner} run {name}:*)", "package.json script")
        if "test" in scripts:
            add(f"Bash({runner} test:*)", "package.json script")
    pyproject = _toml_object(root / "pyproject.toml")
    if pyproject is not None:
        tools = pyproject.get("tool") if isinstance(pyproject.get("tool"), dict) else {}
        assert isinstance(tools, dict)
        text = _read(root / "pyproject.toml")
        prefix = "uv run " if (root / "uv.lock").exists() else ""
        if "pytest" in tools or "pytest" in text:
            add(f"Bash({prefix}pytest:*)", "pyproject.toml (pytest)")
        if "tox" in tools or (root / "tox.ini").exists():
            add("Bash(tox:*)", "pyproject.toml (tox)")
        if "ruff" in tools:
            add(f"Bash({prefix}ruff check:*)", "pyproject.toml (ruff)")
        if "mypy" in tools:
            add(f"Bash({prefix}mypy:*)", "pyproject.toml (mypy)")
    if (root / "Cargo.toml").is_file():
        for sub in ("test", "build", "check", "clippy"):
            add(f"Bash(cargo {sub}:*)", "Cargo.toml")
    if (root / "go.mod").is_file():
        for sub in ("test", "build", "vet"):
            add(f"Bash(go {sub}:*)", "go.mod")
    return found


def _read(path: Path) -> str:
    """A build file of the repository: read only when it is a regular file (not a link, FIFO
    or device) of at most 1 MiB, else empty."""
    try:
        found = read_regular(path, limit=1 << 20, beneath=path.parent)
    except OSError:
        return ""
    return found.content.decode("utf-8", errors="replace")


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_read(path)) if path.is_file() else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _toml_object(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return tomllib.loads(_read(path))
    except tomllib.TOMLDecodeError:
        return None


def starter_policy(commands: Sequence[tuple[str, str]]) -> str:
    """The text of a commented starter `.warren/policy.toml` allowing `commands`."""
    allow = "".join(f"    {toml_string(rule)},  # {why}\n" for rule, why in commands)
    examples = "".join(
        f'\n[[examples]]\ntool = "Bash"\ncommand = {toml_string(_example_command(rule))}\n'
        'decision = "allow"\n'
        for rule, _ in commands[:3]
    )
    return f"""\
# Warren policy for this repository (committed). Levels, lowest to highest precedence:
# built-in, user (~/.config/warren/policy.toml), this file, .warren/policy.local.toml (yours,
# not committed), the command line, managed (/etc/warren/policy.toml). A deny anywhere wins.
#
# The allow rules here take effect only after each user trusts the repository
# (`warren policy trust`); deny and ask rules apply at once. Check it with
# `warren policy show` and `warren policy test`.
#
# Rules: `Bash(make check)` exact, `Bash(npm run test:*)` prefix, `Edit(src/**)` paths
# (gitignore globs relative to the repository; `//abs` absolute, `~/` home), `Read(...)`
# covers Read/Glob/Grep/LS, `Edit(...)` covers Edit/Write/MultiEdit/NotebookEdit.

# mode = "default"   # default | accept-edits | plan | dont-ask | bypass

[permissions]
# Commands found in this repository's build files:
allow = [
{allow}]
ask = [
    # "Bash(git push:*)",
]
deny = [
    # "Read(.env)",
]

# [sandbox]
# deny_read = ["~/.config/some-tool"]   # more paths masked from every tool
# protected = ["scripts/deploy.sh"]     # more paths kept read-only in the workspace
# home_allow = ["~/.config/some-tool"]  # more of $HOME visible (read-only); the rest is hidden

# [limits]
# max_turns = 100
# tool_timeout_s = 300
{examples}
[[examples]]
tool = "Bash"
command = "rm -rf /"
decision = "ask"
"""


def _example_command(rule: str) -> str:
    return rule.removeprefix("Bash(").removesuffix(")").removesuffix(":*")


def _create_new(directory: int, name: str, text: str) -> bool:
    """Create `name` in `directory` with `text`; False when anything (even a link) is there."""
    try:
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=directory,
        )
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return True


@_reported
def init(out: TextIO, cwd: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT) -> int:
    """Write a starter `.warren/policy.toml`; never overwrite an existing one."""
    root = cwd.resolve()
    target = root / PROJECT_POLICY
    commands = detect_project_commands(root)
    text = starter_policy(commands)
    parse_policy_text(text, file=str(target))  # never write a file Warren cannot load
    try:
        directory = open_directory(target.parent, beneath=root, create=True)
    except OSError as exc:
        print(f"error: {exc} (nothing was written)", file=out)
        return EXIT_FAILED
    try:
        if not _create_new(directory, target.name, text):
            print(f"error: {target} exists; edit it instead (nothing was written)", file=out)
            return EXIT_FAILED
        _create_new(directory, ".gitignore", f"{LOCAL_POLICY.name}\n")
    finally:
        os.close(directory)
    print(f"wrote {target}", file=out)
    for rule, why in commands:
        print(f"  allow {rule}  ({why})", file=out)
    print("review it, then run `warren policy trust` so its allow rules apply", file=out)
    return EXIT_OK


# -- trust --


@_reported
def trust_cmd(
    out: TextIO, path: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT
) -> int:
    """Trust the repository at `path` as its policy files are now, after showing them.

    A broken policy file is not trusted (exit 2).
    """
    root = path.resolve()
    current = project_policy_hash(root)
    try:
        loaded = [(f, load_policy_file(f, beneath=root)) for f in project_policy_files(root)]
        settings = [read_claude_settings(f, beneath=root) for f in claude_settings_files(root)]
    except PolicyError as err:
        return _error(err, out)
    if current is None:
        print(
            f"{root} has no policy, Claude Code settings, agent, MCP or memory files; "
            "nothing to trust",
            file=out,
        )
        return EXIT_OK
    if project_policy_hash(root) != current:
        print(
            "error: a policy file changed while it was being read; run the command again", file=out
        )
        return EXIT_FAILED
    try:
        environment.store().trust(root, current)
    except OSError as exc:
        print(f"error: {exc}", file=out)
        return EXIT_FAILED
    print(f"trusted {root} (contents {current[:12]})", file=out)
    for file in repository_files(root):
        if file.exists() or file.is_symlink():
            print(f"  covers: {os.path.relpath(file, root)}", file=out)
    for file, policy in loaded:
        if policy is None:
            continue
        for rule in policy.permissions.allow:
            print(f"  now allowed: {rule}  ({file})", file=out)
        for hook in policy.hooks:
            print(f"  hook now runs: {hook.event}: {hook.command}  ({file})", file=out)
        if policy.mode is not None:
            print(f"  mode: {policy.mode}  ({file})", file=out)
    for claude in settings:
        if claude is None:
            continue
        for hook in claude.hooks:
            print(
                f"  hook now runs: {hook.event}: {_one_line(hook.command)}  ({claude.file})",
                file=out,
            )
        for skipped in claude.unsupported:
            print(
                f"  hook does not run: {skipped.event} {skipped.type} ({claude.file}: "
                f"{skipped.key}): {skipped.reason}",
                file=out,
            )
    return EXIT_OK


@_reported
def untrust_cmd(
    out: TextIO, path: Path, *, environment: CommandEnvironment = _DEFAULT_ENVIRONMENT
) -> int:
    """Forget the trust decision for the repository at `path`."""
    root = path.resolve()
    try:
        untrusted = environment.store().untrust(root)
    except OSError as exc:
        print(f"error: {exc}", file=out)
        return EXIT_FAILED
    if untrusted:
        print(f"untrusted {root}", file=out)
    else:
        print(f"{root} was not trusted", file=out)
    return EXIT_OK
