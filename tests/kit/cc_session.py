"""One scripted session that Claude Code and Warren both run against the fake Messages API,
so their stream-json can be compared shape for shape (issue 16, item 8).

The main agent's first request fails once with a 500 (a retry), then it delegates to a
subagent (Claude Code's `Agent`/`Task` tool, Warren's `dispatch_agent`), whose one turn reads a
file and answers; then the main agent asks to `Write` a file, which a headless run in the
default mode denies (a permission denial); then it answers.

Requests are routed by their first user message (the main agent's prompt or the subagent's),
never by arrival order, and by how many assistant turns they already hold: side requests a
client makes of its own (titles, summaries) get a plain text answer.

`shapes` turns stream-json lines into the shape files the goldens hold: per kind of line
(`system/init`, `assistant`, `assistant (subagent)`, `result`, ...) each field's path and the
JSON types seen there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.kit.fake_api import FakeResponse, HttpError, RecordedRequest, Reply

__all__ = ["MAIN_PROMPT", "SUB_PROMPT", "kind_of", "route_session", "shapes"]

MAIN_PROMPT = "GOLDEN-MAIN: delegate a look at README.md, then write notes.txt"
SUB_PROMPT = "GOLDEN-SUB: read README.md and say what it is"
AGENT_TOOLS = ("Agent", "Task", "dispatch_agent")


def _first_user_text(request: RecordedRequest) -> str:
    for message in request.messages:
        if message.get("role") == "user":
            return json.dumps(message.get("content"))
    return ""


def route_session(workspace: Path) -> Callable[[RecordedRequest], FakeResponse | None]:
    """The route of the scripted session for a client working in `workspace`."""
    lock = threading.Lock()
    failed_once = [False]

    def route(request: RecordedRequest) -> FakeResponse | None:
        first = _first_user_text(request)
        turns = sum(1 for m in request.messages if m.get("role") == "assistant")
        names = [tool.get("name") for tool in request.tools]
        if "GOLDEN-MAIN" in first:
            if turns == 0:
                with lock:
                    if not failed_once[0]:
                        failed_once[0] = True
                        return HttpError(500)
                agent = next((n for n in AGENT_TOOLS if n in names), "Agent")
                kind = "general" if agent == "dispatch_agent" else "general-purpose"
                return Reply.tool_use(
                    agent,
                    {
                        "description": "Look at README",
                        "prompt": SUB_PROMPT,
                        "subagent_type": kind,
                    },
                )
            if turns == 1:
                return Reply.tool_use(
                    "Write", {"file_path": str(workspace / "notes.txt"), "content": "notes\n"}
                )
            return Reply.text("Done: README read, notes.txt not written.")
        if "GOLDEN-SUB" in first:
            if turns == 0:
                return Reply.tool_use("Read", {"file_path": str(workspace / "README.md")})
            return Reply.text("README.md is a one-line readme.")
        return Reply.text("ok")

    return route


def kind_of(line: Mapping[str, Any]) -> str:
    """The kind of a stream-json line: `type`, `/subtype` for system lines and results are
    kept apart by their type only, and ` (subagent)` for a subagent's messages."""
    kind = str(line.get("type"))
    if kind == "system":
        kind += "/" + str(line.get("subtype"))
    if kind in ("assistant", "user") and line.get("parent_tool_use_id") is not None:
        kind += " (subagent)"
    return kind


_MAPS = {"modelUsage"}
"""Objects keyed by data (model names), shaped as `modelUsage.*`."""


def _type(value: Any) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "boolean"
        case int() | float():
            return "number"
        case str():
            return "string"
        case list():
            return "array"
        case _:
            return "object"


def _walk(value: Any, path: str, out: dict[str, set[str]], depth: int) -> None:
    out.setdefault(path, set()).add(_type(value))
    if depth == 0:
        return
    if isinstance(value, dict):
        for key, inner in value.items():
            name = "*" if path.rsplit(".", 1)[-1] in _MAPS else key
            _walk(inner, f"{path}.{name}" if path else name, out, depth - 1)
    elif isinstance(value, list):
        for inner in value:
            if isinstance(inner, dict):
                for key, item in inner.items():
                    _walk(item, f"{path}[].{key}", out, depth - 1)


def shapes(lines: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Each kind of line's fields (dotted paths, `[]` for list items, three levels deep) and
    the JSON types seen at each."""
    found: dict[str, dict[str, set[str]]] = {}
    for line in lines:
        fields = found.setdefault(kind_of(line), {})
        for key, value in line.items():
            _walk(value, key, fields, 3)
    return {
        kind: {path: sorted(types) for path, types in sorted(fields.items())}
        for kind, fields in sorted(found.items())
    }
