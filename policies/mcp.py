"""MCP server configuration: `[mcp.servers.NAME]` in policy files, and Claude Code's `.mcp.json`.

Both sources become the same `McpServer`, so the MCP layer (`orchestrator/mcp/`) reads one list
(`EffectivePolicy.mcp_servers`, each server with the file it came from) and never learns where
a server was written. A stdio server (`command`) runs inside the floor unless the user's own
or the managed policy says `sandbox = false`; a `url` server (streamable HTTP) reaches the
network from the coordinator, so only a user-level file or a trusted repository may name one,
and the session says so in one line at start-up. A sandboxed stdio server gets the network
only with `network = true` (the host's network: there is no allowlist yet), from the same
files (an untrusted repository's servers never start), shown by `warren policy show` and in
one line at start-up naming the file.

Claude Code's `.mcp.json` is `{"mcpServers": {NAME: {"command", "args", "env"} | {"type":
"http" | "sse", "url", "headers"}}}`; it is read only in a trusted repository, without
following links (`policies.atomic.read_regular`), like every repository file the coordinator
reads. A server it declares that Warren cannot run (an `sse` server, an unknown type) is kept
as an `UnsupportedServer`: listed, never dropped silently. An `sdk` server (one the Claude
Agent SDK's application runs itself) is taken only from `--mcp-config`, which that SDK passes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, StrictBool, StrictStr, ValidationError, model_validator

from policies.atomic import read_regular
from policies.sources import PolicyTable, Seconds

__all__ = [
    "MCP_JSON",
    "SERVER_NAME",
    "McpJson",
    "McpJsonError",
    "McpSection",
    "McpServer",
    "UnsupportedServer",
    "parse_mcp_json",
    "read_mcp_json",
]

SERVER_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A server's name: it becomes part of tool names (`mcp__NAME__tool`), so no `__` games: the
parts are split at the first `__` after `mcp__`, and a name holding `__` is refused."""

MCP_JSON: Final = Path(".mcp.json")
"""Claude Code's repository MCP file (relative to the repository root)."""

MAX_MCP_JSON_BYTES: Final = 1 << 20


class McpServer(PolicyTable):
    """One MCP server: a stdio `command` (with `args`, `env`) or a streamable HTTP `url`."""

    command: StrictStr | None = None
    """The program of a stdio server (looked up on the sandbox's PATH)."""
    args: tuple[StrictStr, ...] = ()
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    """Set in the server's environment (the floor's scrubbed environment otherwise; the API
    key is never there)."""
    url: StrictStr | None = None
    """A streamable HTTP server; it runs outside the floor (user-level or trusted files only)."""
    sdk: StrictBool = False
    """A server an SDK host runs in its own process (`"type": "sdk"` in the `--mcp-config` the
    Claude Agent SDK passes): its messages travel over the control channel (`mcp_message`,
    orchestrator/claude_code/sdk_control.py), so it needs neither the floor nor the network here."""
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    """Sent with every request to a `url` server."""
    sandbox: StrictBool = True
    """Run a stdio server inside bubblewrap (default). `false` only in the user's or the
    managed policy."""
    write: StrictBool = False
    """The workspace is writable for the server (default read-only)."""
    network: StrictBool = False
    """A sandboxed stdio server shares the host's network (default false: none at all). Until
    the floor has a network allowlist this is all of it, so it is a widening shown at start-up
    and in `warren policy show`; the rest of the floor stays."""
    timeout_s: Seconds = 60.0
    """Per call."""
    startup_timeout_s: Seconds = 30.0
    """From start to the end of the `initialize` handshake and the tool listing."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is not None) + (self.url is not None) + self.sdk != 1:
            raise ValueError("give either `command` (a stdio server) or `url` (HTTP), not both")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise ValueError("`url` must start with http:// or https://")
        return self

    @property
    def kind(self) -> str:
        return "stdio" if self.command is not None else "sdk" if self.sdk else "http"


def _server_names(servers: dict[str, McpServer]) -> dict[str, McpServer]:
    for name in servers:
        if not SERVER_NAME.fullmatch(name) or "__" in name:
            raise ValueError(
                f"server name {name!r}: use letters, digits, `-` and `_` (no `__`), "
                "at most 64 characters"
            )
    return servers


class McpSection(PolicyTable):
    """`[mcp]`: servers, and whether read-only tools may run without asking."""

    servers: Annotated[dict[StrictStr, McpServer], AfterValidator(_server_names)] = Field(
        default_factory=dict
    )
    allow_read_only_tools: StrictBool | None = None
    """A tool its server marks `readOnlyHint` counts as read-only (auto-approved like a file
    read) only when this is true and the server runs with the workspace read-only. Default
    false: the server's word alone approves nothing."""


@dataclass(frozen=True)
class UnsupportedServer:
    """A server a file declares that Warren does not run, with why (listed, never dropped)."""

    name: str
    file: str
    why: str


@dataclass(frozen=True)
class McpJson:
    """What a `.mcp.json` declares."""

    servers: dict[str, McpServer]
    unsupported: tuple[UnsupportedServer, ...] = ()


class McpJsonError(ValueError):
    """A `.mcp.json` that is not what Claude Code's format says (one line, with the file)."""


def read_mcp_json(path: Path, *, beneath: Path | None = None) -> McpJson | None:
    """The servers of Claude Code's `.mcp.json` at `path`; None when there is none.

    Read without following links when `beneath` is given (a repository's file). A file that
    is not valid JSON or holds a server of the wrong shape raises `McpJsonError`.
    """
    found = read_regular(path, limit=MAX_MCP_JSON_BYTES, beneath=beneath)
    if found.state == "missing":
        return None
    if found.state != "file":
        raise McpJsonError(f"{path}: {found.state}; Warren reads it only as a regular file")
    return parse_mcp_json(found.content, source=str(path))


def parse_mcp_json(content: bytes | str, *, source: str, sdk: bool = False) -> McpJson:
    """The servers a `.mcp.json` text declares (`--mcp-config` passes JSON text too); errors
    name `source`. `sdk`: an `sdk` server (one the SDK host runs) is taken, as in the
    `--mcp-config` the Claude Agent SDK passes; elsewhere it is unsupported.
    **Errors:** `McpJsonError`."""
    path = source
    try:
        data = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise McpJsonError(f"{path}: not valid JSON ({exc})") from None
    declared = data.get("mcpServers") if isinstance(data, dict) else None
    if declared is None:
        return McpJson({})
    if not isinstance(declared, dict):
        raise McpJsonError(f"{path}: `mcpServers` must be an object")
    servers: dict[str, McpServer] = {}
    unsupported: list[UnsupportedServer] = []
    for name, entry in declared.items():
        if not isinstance(entry, dict):
            raise McpJsonError(f"{path}: mcpServers.{name} must be an object")
        kind = entry.get("type", "stdio" if "command" in entry else "http")
        if kind == "sdk" and sdk:
            try:
                servers[name] = _server_names({name: McpServer(sdk=True)})[name]
            except ValueError as exc:
                raise McpJsonError(f"{path}: mcpServers.{name}: {exc}") from None
            continue
        if kind not in ("stdio", "http", "streamable-http"):
            unsupported.append(UnsupportedServer(name, str(path), f"transport {kind!r}"))
            continue
        fields: dict[str, Any] = {k: v for k, v in entry.items() if k != "type"}
        try:
            servers[name] = McpServer.model_validate(fields)
            _server_names({name: servers[name]})
        except (ValidationError, ValueError) as exc:
            first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise McpJsonError(f"{path}: mcpServers.{name}: {first}") from None
    return McpJson(servers, tuple(unsupported))
