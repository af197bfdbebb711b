"""MCP server configuration (issue 14): `[mcp.servers.NAME]` in policy files and Claude Code's
`.mcp.json`, merged by level; a repository's servers only once it is trusted, never outside the
floor, never read through a link.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from policies.commands import CommandEnvironment, show
from policies.files import (
    EffectivePolicy,
    PolicyError,
    PolicyPaths,
    load_effective_policy,
    parse_policy_text,
)
from policies.trust import TrustStore


class Workspace:
    def __init__(self, root: Path) -> None:
        self.repo = root / "repo"
        (self.repo / ".warren").mkdir(parents=True)
        self.config = root / "config"
        (self.config / "warren").mkdir(parents=True)
        self.env = {
            "HOME": str(root / "home"),
            "XDG_CONFIG_HOME": str(self.config),
            "XDG_STATE_HOME": str(root / "state"),
        }
        self.store = TrustStore.from_env(self.env)
        self.paths = PolicyPaths.for_workspace(self.repo, env=self.env, managed=None)

    def user(self, text: str) -> None:
        (self.config / "warren" / "policy.toml").write_text(text)

    def project(self, text: str) -> None:
        (self.repo / ".warren" / "policy.toml").write_text(text)

    def mcp_json(self, servers: dict[str, object]) -> None:
        (self.repo / ".mcp.json").write_text(json.dumps({"mcpServers": servers}))

    def load(self) -> EffectivePolicy:
        return load_effective_policy(
            self.repo, paths=self.paths, trust_store=self.store, env=self.env
        )


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def _names(policy: EffectivePolicy) -> dict[str, tuple[str, str]]:
    return {
        name: (server.command or server.url or "", Path(source).name)
        for name, server, source in policy.mcp_servers
    }


def test_servers_of_every_level_merge_by_name_higher_wins(ws: Workspace) -> None:
    ws.user('[mcp.servers.time]\ncommand = "user-time"\n[mcp.servers.docs]\nurl = "https://d"\n')
    ws.mcp_json({"time": {"command": "json-time"}, "git": {"command": "json-git"}})
    ws.project('[mcp.servers.git]\ncommand = "project-git"\nargs = ["-r", "."]\n')
    ws.store.trust(ws.repo)
    assert _names(ws.load()) == {
        "time": ("json-time", ".mcp.json"),
        "docs": ("https://d", "policy.toml"),
        "git": ("project-git", "policy.toml"),
    }


def test_an_untrusted_repository_starts_no_server_and_says_so_once(ws: Workspace) -> None:
    ws.mcp_json({"a": {"command": "x"}, "b": {"type": "sse", "url": "http://x"}})
    ws.project('[mcp.servers.c]\ncommand = "y"\n')
    policy = ws.load()
    assert policy.mcp_servers == ()
    notice = policy.untrusted_servers_notice()
    assert notice is not None
    assert "2 in .mcp.json" in notice and "1 in .warren/policy.toml" in notice
    assert "warren trust" in notice


def test_a_repository_server_never_leaves_the_floor(ws: Workspace) -> None:
    ws.project('[mcp.servers.x]\ncommand = "y"\nsandbox = false\n')
    ws.store.trust(ws.repo)
    with pytest.raises(PolicyError) as caught:
        ws.load()
    assert caught.value.key == "mcp.servers.x.sandbox"
    ws.project("")
    ws.user('[mcp.servers.x]\ncommand = "y"\nsandbox = false\n')
    [(name, server, _)] = ws.load().mcp_servers
    assert name == "x" and not server.sandbox


def test_a_trusted_repository_may_grant_its_server_the_network_and_it_shows(
    ws: Workspace,
) -> None:
    """`network = true` is a widening a trusted repository may make, never silently: `warren
    policy show` names the server and its file; untrusted, the server does not start."""
    ws.project('[mcp.servers.fetch]\ncommand = "mcp-fetch"\nnetwork = true\n')
    assert ws.load().mcp_servers == ()
    ws.store.trust(ws.repo)
    [(_, server, _)] = ws.load().mcp_servers
    assert server.network and server.sandbox
    environment = CommandEnvironment(env=ws.env, managed=None, probe=lambda: True)
    shown = show(ws.repo, environment=environment)
    assert shown.exit_code == 0, shown.text
    [line] = [line for line in shown.text.splitlines() if "mcp-fetch" in line]
    assert "sandboxed, workspace read-only, HOST NETWORK" in line
    assert str(ws.repo / ".warren" / "policy.toml") in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[mcp.servers.x]\nargs = ["a"]\n', "either `command`"),
        ('[mcp.servers.x]\ncommand = "a"\nurl = "http://b"\n', "either `command`"),
        ('[mcp.servers.x]\nurl = "ftp://b"\n', "http:// or https://"),
        ('[mcp.servers."a__b"]\ncommand = "a"\n', "no `__`"),
        ('[mcp.servers.x]\ncommand = "a"\ntimeout_s = 0\n', "greater than 0"),
        ('[mcp.servers.x]\ncommand = "a"\nflavour = 1\n', "flavour"),
    ],
)
def test_a_broken_server_entry_is_one_located_error(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy_text(text, file="/p.toml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_mcp_json_read_as_claude_code_writes_it(ws: Workspace) -> None:
    ws.mcp_json(
        {
            "stdio": {"command": "srv", "args": ["--x"], "env": {"K": "V"}},
            "web": {"type": "http", "url": "https://mcp.example", "headers": {"A": "b"}},
            "old": {"type": "sse", "url": "https://sse.example"},
        }
    )
    ws.store.trust(ws.repo)
    policy = ws.load()
    servers = {name: server for name, server, _ in policy.mcp_servers}
    assert servers["stdio"].args == ("--x",) and servers["stdio"].env == {"K": "V"}
    assert servers["web"].url == "https://mcp.example" and servers["web"].headers == {"A": "b"}
    assert [(u.name, u.why) for u in policy.unsupported_servers] == [("old", "transport 'sse'")]


def test_mcp_json_through_a_link_or_as_a_fifo_is_refused_not_read(
    ws: Workspace, tmp_path: Path
) -> None:
    secret = tmp_path / "elsewhere.json"
    secret.write_text(json.dumps({"mcpServers": {"evil": {"command": "x"}}}))
    (ws.repo / ".mcp.json").symlink_to(secret)
    ws.store.trust(ws.repo)
    with pytest.raises(PolicyError, match="link"):
        ws.load()
    (ws.repo / ".mcp.json").unlink()
    os.mkfifo(ws.repo / ".mcp.json")
    ws.store.trust(ws.repo)
    with pytest.raises(PolicyError, match="not a regular file"):
        ws.load()  # returns at once: a FIFO is never opened for reading


def test_a_broken_mcp_json_names_the_file(ws: Workspace) -> None:
    (ws.repo / ".mcp.json").write_text("{not json")
    ws.store.trust(ws.repo)
    with pytest.raises(PolicyError) as caught:
        ws.load()
    assert caught.value.file == str(ws.repo / ".mcp.json") and "not valid JSON" in str(caught.value)


def test_a_change_to_mcp_json_needs_trust_again(ws: Workspace) -> None:
    ws.mcp_json({"a": {"command": "x"}})
    ws.store.trust(ws.repo)
    assert _names(ws.load()) == {"a": ("x", ".mcp.json")}
    ws.mcp_json({"a": {"command": "/bin/evil"}})
    policy = ws.load()
    assert policy.trust == "changed" and policy.mcp_servers == ()


def test_a_repository_with_only_an_mcp_json_is_untrusted_until_trusted(ws: Workspace) -> None:
    (ws.repo / ".warren").rmdir()
    ws.mcp_json({"a": {"command": "x"}})
    policy = ws.load()
    assert policy.trust == "untrusted" and policy.mcp_servers == ()
    assert policy.untrusted_servers_notice() is not None
