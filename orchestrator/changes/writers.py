"""Who wrote in a turn, as `warren undo` names it (orchestrator/changes/recorder.py records
them): a call of the model (a tool, a subagent), a hook, a command the user typed.

Kept apart from the recorder, which knows the call's way (`CallPlan`, `ToolRunner`), so that
the hooks, which that way runs, can say who they are without importing it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.changes.tree_state import Key

__all__ = ["WriteRecorder", "Writer"]


@dataclass(frozen=True)
class Writer:
    """Something that wrote in a turn, as `warren undo` names it: a call of the model (a tool,
    a subagent), a hook, a command the user typed."""

    id: str
    """The call's tool_use_id, or the hook's or command's own."""
    kind: str
    """The tool's name (`Edit`, `Bash`, `dispatch_agent`, an MCP tool), or `hook`."""
    label: str = ""
    """What the user knows it by: a subagent's description, a command, a file."""
    scope: tuple[str, ...] | None = None
    """A scoped writer's directories (absolute): what it changed there is its own."""
    paths: tuple[str, ...] = ()
    """In a turn's record: the paths (relative to their root) this writer changed."""
    files: tuple[str, ...] | None = field(default=None, compare=False)
    """The only files (absolute) it can change, when its input says (an Edit's `file_path`):
    what else changes while it runs is a background writer's. Not recorded."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "kind": self.kind, "label": self.label}
        if self.scope is not None:
            data["scope"] = list(self.scope)
        data["paths"] = list(self.paths)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Writer:
        scope = data.get("scope")
        return cls(
            str(data["id"]),
            str(data.get("kind", "")),
            str(data.get("label", "")),
            None if scope is None else tuple(str(s) for s in scope),
            tuple(str(p) for p in data.get("paths", ())),
        )

    def holds(self, key: Key) -> bool:
        """Whether the path `key` names lies in this writer's scope."""
        if self.scope is None:
            return False
        path = os.path.join(key[0], key[1])
        return any(path == s or path.startswith(s.rstrip("/") + "/") for s in self.scope)

    def may_write(self, key: Key) -> bool:
        """Whether this writer can have changed the path `key` names (any, unless `files`)."""
        if self.files is None:
            return True
        return os.path.join(key[0], key[1]) in self.files

    def describe(self) -> str:
        """`dispatch_agent "rename billing"`, `hook "echo ... > x"`, `Bash "make"`."""
        return f'{self.kind} "{self.label}"' if self.label else self.kind


class WriteRecorder(Protocol):
    """What a writer outside the call's way (a hook) tells the session's change recorder:
    `before_call` ahead of what may write, `after_call` once it is done."""

    async def before_call(self, tool_use_id: str, writer: Writer | None = None) -> None: ...

    async def after_call(self, tool_use_id: str | None = None) -> None: ...
