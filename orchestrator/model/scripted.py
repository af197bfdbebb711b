"""A model that replays a JSON script of assistant turns: offline demos and tests.

Users run it with `--model scripted:PATH`. The script is a list of turns (or an object with a
`turns` list); each turn is:

    {"latency_ms": 50,                       # optional: wait before the turn streams
     "content": [{"type": "text", "text": "..."},
                 {"type": "tool_use", "name": "Read", "input": {...}, "id": "optional"}],
     "block_latency_ms": 0,                  # optional: wait between blocks
     "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}}

The text `{{workspace}}` in any string is replaced by the run's workspace, so one script works
wherever the demo repository is copied.

Subagents dispatched with `dispatch_agent` ask the same model concurrently, so their turns
are scripted apart, keyed by text their prompt contains:

    {"turns": [...the main agent's turns...],
     "agents": [{"match": "[survey:billing]", "turns": [...]}, ...]}

A request whose first user message contains an agent's `match` takes that agent's next turn;
every other request takes the next main turn.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import ConfigError, ModelError
from orchestrator.messages import (
    AssistantMessage,
    ContentBlock,
    Message,
    StopReason,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from orchestrator.model.base import (
    BlockComplete,
    MessageComplete,
    ModelEvent,
    ModelRequest,
    TextDelta,
)

__all__ = ["AgentScript", "Script", "ScriptedModel", "ScriptedTurn", "load_script"]


class _ScriptedText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class _ScriptedToolUse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["tool_use"]
    name: str
    input: dict[str, Any]
    id: str | None = None


class ScriptedTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    content: list[Annotated[_ScriptedText | _ScriptedToolUse, Field(discriminator="type")]]
    latency_ms: float = 0.0
    """Wait before the turn starts streaming, in milliseconds."""
    block_latency_ms: float = 0.0
    """Wait between content blocks, in milliseconds."""
    stop_reason: StopReason | None = None
    usage: Usage | None = None


class AgentScript(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str = Field(min_length=1)
    """Text a subagent's prompt contains."""
    turns: list[ScriptedTurn]


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: list[ScriptedTurn]
    agents: list[AgentScript] = []


def load_script(path: Path) -> Script:
    """Read and check a script file; errors name the file and the offending turn."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the script: {exc.strerror}", source=str(path)) from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}", source=str(path)
        ) from exc
    try:
        return Script.model_validate({"turns": raw} if isinstance(raw, list) else raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{where}: {first['msg']}", source=str(path)) from exc


def _substitute(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, replacement in variables.items():
            value = value.replace("{{" + key + "}}", replacement)
        return value
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    return value


class ScriptedModel:
    """Replays `turns` in order, one per request (subagents' from `agents`, by prompt);
    running out is a `model_error`."""

    def __init__(
        self,
        turns: list[ScriptedTurn],
        *,
        agents: list[AgentScript] | None = None,
        name: str = "scripted",
        variables: dict[str, str] | None = None,
    ) -> None:
        self._variables = variables or {}
        self._queues: list[tuple[str | None, list[ScriptedTurn]]] = [
            (self._sub(agent.match), list(agent.turns)) for agent in agents or []
        ]
        self._queues.append((None, list(turns)))
        self._name = name
        self.requests: list[ModelRequest] = []
        """Every request received, for tests and demos."""

    @classmethod
    def from_file(cls, path: Path, *, variables: dict[str, str] | None = None) -> ScriptedModel:
        script = load_script(path)
        return cls(
            script.turns, agents=script.agents, name=f"scripted:{path.name}", variables=variables
        )

    def _sub(self, text: str) -> str:
        result: str = _substitute(text, self._variables)
        return result

    def _queue_for(self, request: ModelRequest) -> tuple[str, list[ScriptedTurn]]:
        first = request.messages[0].text() if request.messages else ""
        for match, queue in self._queues:
            if match is None or match in first:
                return match or "main agent", queue
        raise AssertionError("the main queue always matches")

    @property
    def model(self) -> str:
        return self._name

    async def aclose(self) -> None:
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        who, queue = self._queue_for(request)
        if not queue:
            raise ModelError(f"The scripted model has no turn left for the {who}.")
        turn = queue.pop(0)
        index = len(self.requests)
        if turn.latency_ms:
            await trio.sleep(turn.latency_ms / 1000)
        blocks: list[ContentBlock] = []
        for i, item in enumerate(turn.content):
            if i and turn.block_latency_ms:
                await trio.sleep(turn.block_latency_ms / 1000)
            block: ContentBlock
            if isinstance(item, _ScriptedText):
                block = TextBlock(text=_substitute(item.text, self._variables))
                yield TextDelta(i, block.text)
            else:
                block = ToolUseBlock(
                    id=item.id or f"toolu_script_{index:03d}_{i:02d}",
                    name=item.name,
                    input=_substitute(item.input, self._variables),
                )
            blocks.append(block)
            yield BlockComplete(i, block)
        has_tools = any(b.type == "tool_use" for b in blocks)
        message = AssistantMessage(
            message=Message(role="assistant", content=blocks),
            model=self._name,
            stop_reason=turn.stop_reason or ("tool_use" if has_tools else "end_turn"),
            usage=turn.usage or Usage(),
        )
        yield MessageComplete(message)
