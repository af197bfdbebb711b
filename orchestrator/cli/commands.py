"""The names of `warren`'s subcommands with their summaries: what the launcher needs to tell
a subcommand from a prompt before anything else is imported (standard library only, like
`orchestrator.cli.client`)."""

from __future__ import annotations

__all__ = ["COMMANDS", "is_command"]

COMMANDS: dict[str, str] = {
    "demo": "run the offline demo: a scripted multi-agent refactor on a sample repository",
    "doctor": "prove the sandbox floor on this machine, or say how to fix it",
    "sandbox": "run one command under Warren's sandbox floor",
    "policy": "explain and tune the permission policy (check, show, test, init, trust, import)",
    "trust": "let a repository's policy allow things",
    "untrust": "stop trusting a repository's policy",
    "hooks": "the hooks in force: list them with their files, run them against a sample "
    "event (list, test)",
    "mcp": "MCP servers: list, get, add, remove the servers in force; serve Warren's tools",
    "sessions": "past sessions of this directory, newest first: id, start, turns, cost, "
    "first prompt",
    "undo": "put back the files the last writing turn of a session changed (the newest "
    "session of this directory by default)",
    "workflow": "workflows: run a saved one, resume a stopped run, list the runs (run, resume, "
    "list)",
    "server": "the warm per-user server that starts sessions fast (start, stop, status, run)",
}
"""Every subcommand with its one-line summary (`warren --help` lists them)."""


def is_command(argv: list[str]) -> bool:
    """`argv` names a subcommand (or asks for help or the version), not a run."""
    return bool(set(argv[:1]) & {*COMMANDS, "-h", "--help", "-v", "--version"})
