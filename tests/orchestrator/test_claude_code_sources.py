"""Claude Code's files as Warren's sources (issue 16, items 4 and 5): `.claude/settings.json`
permissions and `.claude/agents/*.md` count once the repository is trusted, through the same
code `warren policy check|show|trust` and a session run (real files, the real trust store)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agents.types import load_agent_types
from orchestrator.calls.policy import load_session_policy
from orchestrator.errors import ConfigError
from orchestrator.tools.registry import builtin_facts
from policies import commands
from policies.claude_settings import parse_claude_settings
from policies.commands import CommandEnvironment
from policies.files import (
    EffectivePolicy,
    PolicyError,
    PolicyPaths,
    command_line_policy,
    load_effective_policy,
    parse_policy_text,
)
from policies.mcp import parse_mcp_json


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def environment(tmp_path: Path, home: Path) -> CommandEnvironment:
    env = {
        "HOME": str(home),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    return CommandEnvironment(env=env, managed=None, probe=lambda: True, tool_facts=builtin_facts())


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A repository with only Claude Code's files: settings and one agent."""
    ws = tmp_path / "ws"
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".claude" / "agents").mkdir(parents=True)
    (ws / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"deny": ["Read(.env)"], "allow": ["Bash(make:*)"]}})
    )
    (ws / ".claude" / "agents" / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews diffs.\nmodel: inherit\n---\nYou review diffs.\n"
    )
    return ws


def _check(workspace: Path, environment: CommandEnvironment, *target: str) -> dict[str, Any]:
    call: commands.CheckTarget = target[0] if len(target) == 1 else (target[0], target[1])
    report = commands.check(call, json_output=True, cwd=workspace, environment=environment)
    decision: dict[str, Any] = json.loads(report.text)
    return decision


def _agents(workspace: Path, environment: CommandEnvironment, home: Path) -> dict[str, Any]:
    trusted = environment.load(workspace).trust == "trusted"
    return load_agent_types(
        workspace,
        trusted=trusted,
        config_dir=home / "config",
        claude_dir=home / ".claude" / "agents",
    )


def test_claude_settings_and_agents_count_once_trusted(
    workspace: Path, environment: CommandEnvironment, home: Path
) -> None:
    """Acceptance: untrusted, `Bash(make:*)` and the reviewer do not count (the deny rule
    holds at once, as a project's deny rules do); trusted, both do, shown with their file;
    the agent file is part of what trust hashes."""
    settings = str(workspace / ".claude" / "settings.json")
    assert _check(workspace, environment, "make build")["decision"] != "allow"
    denied = _check(workspace, environment, "Read", ".env")
    assert (denied["decision"], denied["source"]) == ("deny", settings)
    assert "reviewer" not in _agents(workspace, environment, home)

    assert commands.trust_cmd(workspace, environment=environment).exit_code == 0
    make = _check(workspace, environment, "make build")
    assert (make["decision"], make["rule"], make["source"]) == ("allow", "Bash(make:*)", settings)
    assert _check(workspace, environment, "Read", ".env")["decision"] == "deny"
    shown = commands.show(workspace, environment=environment).text
    assert "Bash(make:*)" in shown
    assert settings in shown
    reviewer = _agents(workspace, environment, home)["reviewer"]
    # No `tools`: every tool but dispatch_agent, a writable type; `inherit`: the session's.
    assert reviewer.model is None and reviewer.writable and reviewer.source == "project"
    assert "Edit" in reviewer.tools and "dispatch_agent" not in reviewer.tools

    (workspace / ".claude" / "agents" / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews diffs.\n---\nApprove everything.\n"
    )
    assert _check(workspace, environment, "make build")["decision"] != "allow"
    assert "reviewer" not in _agents(workspace, environment, home)


# --- settings files: the permissions they map to ---------------------------------------------


def test_permissions_map_to_warrens_terms() -> None:
    settings = parse_claude_settings(
        json.dumps(
            {
                "permissions": {
                    "allow": ["Bash(npm test *)", "Task(reviewer)", "Agent"],
                    "ask": ["Bash(git push:*)"],
                    "deny": ["Read(./secrets/**)", "WebFetch(domain:example.com)"],
                    "defaultMode": "dontAsk",
                    "additionalDirectories": ["../shared"],
                    "disableBypassPermissionsMode": "disable",
                }
            }
        ),
        file="s.json",
    )
    permissions = settings.permissions
    assert permissions.allow == ("Bash(npm test *)", "dispatch_agent(reviewer)", "dispatch_agent")
    assert permissions.ask == ("Bash(git push:*)",)
    assert permissions.deny == ("Read(./secrets/**)", "WebFetch(domain:example.com)")
    assert permissions.mode == "dont-ask"
    assert permissions.additional_directories == ("../shared",)
    assert permissions.unsupported == ("disableBypassPermissionsMode",)


@pytest.mark.parametrize(
    ("permissions", "key", "fragment"),
    [
        ({"allow": ["Bash(a:* b)"]}, "permissions.allow[0]", "may only end"),
        ({"deny": ["Read(.env)", 3]}, "permissions.deny[1]", "rule string"),
        ({"ask": "Bash"}, "permissions.ask", "list of rules"),
        ({"defaultMode": "auto"}, "permissions.defaultMode", "not a mode Warren has"),
        ({"additionalDirectories": [""]}, "permissions.additionalDirectories", "directory"),
    ],
)
def test_a_bad_permission_is_an_error_at_its_json_path(
    permissions: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(PolicyError) as info:
        parse_claude_settings(json.dumps({"permissions": permissions}), file="s.json")
    assert (info.value.file, info.value.key) == ("s.json", key)
    assert fragment in str(info.value)


def _load(workspace: Path, environment: CommandEnvironment, **options: Any) -> EffectivePolicy:
    paths = PolicyPaths.for_workspace(workspace, env=environment.env, managed=None)
    return load_effective_policy(
        workspace, paths=paths, trust_store=environment.store(), env=environment.env, **options
    )


def test_warrens_own_file_wins_within_a_level_and_roots_wait_for_trust(
    workspace: Path, environment: CommandEnvironment, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (workspace / ".claude" / "settings.json").write_text(
        json.dumps(
            {
                "permissions": {
                    "defaultMode": "acceptEdits",
                    "additionalDirectories": ["../shared"],
                    "allow": ["Bash(make:*)"],
                }
            }
        )
    )
    (workspace / ".warren").mkdir()
    (workspace / ".warren" / "policy.toml").write_text('mode = "plan"\n')
    untrusted = _load(workspace, environment)
    assert untrusted.mode == "default" and untrusted.writable_roots == ()
    commands.trust_cmd(workspace, environment=environment)
    trusted = _load(workspace, environment)
    assert (trusted.mode, trusted.mode_source) == ("plan", str(workspace / ".warren/policy.toml"))
    assert trusted.writable_roots == ((shared, str(workspace / ".claude/settings.json")),)
    (workspace / ".warren" / "policy.toml").unlink()
    commands.trust_cmd(workspace, environment=environment)
    assert _load(workspace, environment).mode == "accept-edits"


def test_setting_sources_and_the_settings_flag(
    workspace: Path, environment: CommandEnvironment
) -> None:
    commands.trust_cmd(workspace, environment=environment)
    texts = {entry.text for entry in _load(workspace, environment).rules}
    assert {"Bash(make:*)", "Read(.env)"} <= texts
    only_user = _load(workspace, environment, setting_sources={"user"})
    assert not {"Bash(make:*)", "Read(.env)"} & {entry.text for entry in only_user.rules}
    flag = parse_claude_settings(
        json.dumps({"permissions": {"allow": ["Bash(npm test *)"]}}), file="--settings"
    )
    with_flag = _load(workspace, environment, command_line_settings=flag)
    [entry] = [e for e in with_flag.rules if e.text == "Bash(npm test *)"]
    assert (entry.level, entry.source, entry.active) == ("command line", "--settings", True)


# --- agent definitions -----------------------------------------------------------------------


def _agent(directory: Path, name: str, front: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.md").write_text(f"---\nname: {name}\n{front}---\nDo it.\n")


def test_claude_code_front_matter_means_what_it_means_there(
    workspace: Path, environment: CommandEnvironment, home: Path
) -> None:
    agents = workspace / ".claude" / "agents"
    _agent(agents, "reader", "description: Reads.\ntools: Read, Grep, Glob\nmodel: haiku\n")
    _agent(agents, "fixer", "description: Fixes.\ntools: Read, Edit, Task\n")
    _agent(agents, "most", "description: Most.\ndisallowedTools: Bash, Write\n")
    _agent(home / ".claude" / "agents", "mine", "description: Mine.\ntools: Read\n")
    # Within a level Warren's own definition of a name wins over Claude Code's.
    _agent(workspace / ".warren" / "agents", "fixer", "description: Warren's fixer.\n")
    commands.trust_cmd(workspace, environment=environment)
    types = _agents(workspace, environment, home)
    assert types["reader"].tools == ("Read", "Grep", "Glob") and not types["reader"].writable
    assert types["reader"].model == "claude-haiku-4-5"
    assert types["fixer"].description == "Warren's fixer." and not types["fixer"].writable
    assert types["most"].writable
    assert {"Bash", "Write", "dispatch_agent"}.isdisjoint(types["most"].tools)
    assert types["mine"].source == "user"
    without_user = load_agent_types(
        workspace,
        trusted=True,
        config_dir=home / "config",
        claude_dir=home / ".claude" / "agents",
        claude_sources=("project",),
    )
    assert "mine" not in without_user and "reader" in without_user


def test_a_claude_code_agent_key_warren_lacks_is_an_error_naming_it(
    workspace: Path, home: Path
) -> None:
    _agent(workspace / ".claude" / "agents", "odd", "description: Odd.\npermissionMode: plan\n")
    with pytest.raises(ConfigError) as info:
        load_agent_types(workspace, trusted=True, config_dir=home / "config", claude_dir=home)
    assert "permissionMode" in str(info.value) and "odd.md" in str(info.value)


@pytest.mark.parametrize(
    ("command", "allowed"),
    [
        ("python3 -m pytest", True),
        ("python3 -m pytest -q tests/a.py", True),
        ("python3 -m pytestx", False),
        ("python3 -m pytest -q && rm -rf src", False),  # `*` never reaches another command
        ("python3 -m pytest $(rm -rf src)", False),
    ],
)
def test_a_wildcard_rule_from_the_command_line_decides_calls(
    workspace: Path, environment: CommandEnvironment, command: str, allowed: bool
) -> None:
    flags = command_line_policy(allowed_tools=["Bash(python3 -m pytest *)"])
    with_flags = dataclasses.replace(environment, command_line=flags)
    decision = _check(workspace, with_flags, command)
    assert (decision["decision"] == "allow") is allowed
    if allowed:
        assert decision["rule"] == "Bash(python3 -m pytest *)"


# --- warren policy import ---------------------------------------------------------------------


def test_import_writes_the_settings_as_warren_policy_keeping_comments(workspace: Path) -> None:
    (workspace / ".claude" / "settings.local.json").write_text(
        json.dumps(
            {
                "permissions": {"defaultMode": "acceptEdits", "ask": ["Bash(git push:*)"]},
                "hooks": {
                    "PostToolUse": [
                        {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "fmt"}]}
                    ]
                },
            }
        )
    )
    (workspace / ".warren").mkdir()
    project = workspace / ".warren" / "policy.toml"
    project.write_text('# ours: keep me\n[permissions]\nallow = ["Bash(make:*)"]  # here\n')
    dry = commands.import_cmd(workspace, dry_run=True)
    assert "would add deny Read(.env)" in dry.text
    assert project.read_text().startswith("# ours") and "Read(.env)" not in project.read_text()

    report = commands.import_cmd(workspace)
    assert report.exit_code == 0, report.text
    text = project.read_text()
    assert "# ours: keep me" in text and "# here" in text
    imported = parse_policy_text(text, file="p")
    assert imported.permissions.allow == ("Bash(make:*)",)  # not repeated
    assert imported.permissions.deny == ("Read(.env)",)
    local = parse_policy_text((workspace / ".warren/policy.local.toml").read_text(), file="l")
    assert local.mode == "accept-edits" and local.permissions.ask == ("Bash(git push:*)",)
    [hook] = local.hooks
    assert (hook.event, hook.command, hook.matcher_kind, hook.matcher) == (
        "PostToolUse", "fmt", "regex", "Edit|Write"
    )  # fmt: skip
    again = commands.import_cmd(workspace)
    assert again.text.count("nothing new") == 2


def test_mcp_config_servers_join_the_command_line_level(
    workspace: Path,
    environment: CommandEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert environment.env is not None
    for name, value in environment.env.items():  # the session reads the process's (no seam)
        monkeypatch.setenv(name, value)
    text = json.dumps(
        {
            "mcpServers": {
                "notes": {"command": "notes-server", "args": ["--stdio"]},
                "host": {"type": "sdk", "name": "host"},  # served by an SDK's process
            }
        }
    )
    file = tmp_path / "mcp.json"
    file.write_text(text.replace("notes", "files"))
    configs = (parse_mcp_json(text, source="--mcp-config"),)
    policy = _load(workspace, environment, command_line_mcp=[("--mcp-config", configs[0])])
    assert [(name, source) for name, _, source in policy.mcp_servers] == [("notes", "--mcp-config")]
    assert [(u.name, u.why) for u in policy.unsupported_servers] == [("host", "transport 'sdk'")]
    session = load_session_policy(
        workspace, floor_proven=True, mcp_configs=(str(file), text)
    ).effective
    # The JSON text the Claude Agent SDK passes takes its own `sdk` server (reached over the
    # control channel); a file keeps it unsupported.
    assert {(name, source) for name, _, source in session.mcp_servers} == {
        ("files", str(file)),
        ("notes", "--mcp-config"),
        ("host", "--mcp-config"),
    }
    assert [u.name for u in session.unsupported_servers] == ["host"]
    with pytest.raises(ConfigError, match="no such file"):
        load_session_policy(workspace, floor_proven=True, mcp_configs=(str(tmp_path / "none"),))
