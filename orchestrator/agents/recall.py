"""The subagents of a session's earlier processes, read back from their sidechain transcripts
(`<sessions>/<session id>.agents/<agent id>.jsonl`), so that `SendMessage` can continue them
after `--resume`.

When the session first looks its agents up, each file's first line is read (its `subagent`
record: type, description, name, write scope); the conversation is read when a message is
sent to it (`conversation`): every `message` record, in order, which for an agent continued
before holds each prompt, its turns and their results. An agent whose type this session does
not define any more, a fork (its history began with its parent's, which its file does not
hold) and an unreadable file are not offered.

Each is an `AgentRecord`, as the session's own agents are (`DispatchAgentTool` keeps those):
one value for an agent however it became known.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pydantic

from orchestrator.agents.types import AgentType, ForkBase
from orchestrator.messages import Message

__all__ = ["AgentRecord", "conversation", "stored_agents"]

_HEAD_BYTES = 64 * 1024
"""The most of a file's first line read (its first record)."""


@dataclass
class AgentRecord:
    """A subagent of this session as `SendMessage` finds it: what it was, and its whole
    conversation once it has ended."""

    agent_id: str
    agent_type: AgentType
    """Its type as it ran (the dispatch's `model` applied)."""
    description: str
    name: str | None
    write_paths: list[str] | None
    """The write scope it was given (as given: checked and hashed again at each run)."""
    background: bool
    running: bool = True
    messages: list[Message] = field(default_factory=list)
    """Its conversation: the prompts, its turns and their tool results (a fork's starts with
    the main agent's)."""
    fork: ForkBase | None = None
    """A fork's requests, sent as the main agent's (orchestrator/agents/fork.py)."""
    system: list[str] | None = None
    """A fork's system prompt: the main agent's."""
    stored: Path | None = None
    """Its transcript, for an agent of an earlier process of the session: its conversation is
    read from there when it is continued (`stored_agents`, `conversation`)."""


def stored_agents(directory: Path, types: Mapping[str, AgentType]) -> list[AgentRecord]:
    """The agents whose transcripts are in `directory` (none when it does not exist), oldest
    first, with the types of `types` (as each ran: its model override kept)."""
    try:
        names = sorted(
            (entry for entry in os.scandir(directory) if entry.name.endswith(".jsonl")),
            key=lambda entry: entry.stat(follow_symlinks=False).st_mtime,
        )
    except OSError:
        return []
    found = []
    for entry in names:
        if not entry.is_file(follow_symlinks=False):
            continue
        agent = _head(Path(entry.path), types)
        if agent is not None:
            found.append(agent)
    return found


def _head(path: Path, types: Mapping[str, AgentType]) -> AgentRecord | None:
    try:
        with path.open("rb") as f:
            first = f.readline(_HEAD_BYTES)
        record = json.loads(first)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("type") != "subagent" or record.get("fork"):
        return None
    agent_type = types.get(str(record.get("agent_type")))
    agent_id = record.get("agent_id")
    if agent_type is None or not isinstance(agent_id, str) or path.stem != agent_id:
        return None
    model = record.get("model")
    if isinstance(model, str) and model != agent_type.model:
        agent_type = agent_type.model_copy(update={"model": model})
    paths = record.get("write_paths")
    name = record.get("name")
    return AgentRecord(
        agent_id,
        agent_type,
        str(record.get("description") or ""),
        name if isinstance(name, str) else None,
        [str(p) for p in paths] if isinstance(paths, list) else None,
        record.get("background") is True,
        running=False,
        stored=path,
    )


def conversation(path: Path) -> list[Message]:
    """Every message of the transcript at `path`, in order (lines that do not read are
    skipped: a torn last line after a crash).

    **Errors:** `OSError` when it cannot be read.
    """
    messages: list[Message] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
                if isinstance(record, dict) and record.get("type") == "message":
                    messages.append(Message.model_validate(record["message"]))
            except (ValueError, KeyError, pydantic.ValidationError):
                continue
    return messages
