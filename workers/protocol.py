"""The wire protocol between the coordinator and its sandboxed workers.

Newline-delimited JSON over the worker's stdin (coordinator -> worker) and stdout (worker ->
coordinator); the worker's stderr carries its logs. Each line is one message, a frozen pydantic
model with a `type` discriminator; both directions use the same models, so one `decode_line`
serves both ends. The worker speaks first: `Ready` carries `PROTOCOL_VERSION`, and a coordinator
that sees another version stops the worker instead of guessing.

    coordinator                              worker (tool host)
        |  <------------------------------------ Ready{version, pid, role, ...}
        |  ValidateTool{id, tool, input} ------>
        |  <------------------------------------ Validated{id, refusal | error}
        |  RunTool{id, tool, input} ----------->
        |  <------------------------------------ ToolProgress{id, text}   (any number)
        |  Cancel{id} ------------------------->                          (optional)
        |  <------------------------------------ ToolResult{id, outcome, ...}  (exactly one)
        |  RunHook{id, command, stdin, ...} --->                          (a hook: Cancel too)
        |  <------------------------------------ HookResult{id, exit_code, stdout, ...}
        |  Shutdown --------------------------->                          (or stdin EOF)

Read-before-write state travels with the calls: `ValidateTool`/`RunTool` carry the changes of
the coordinator's `ReadLedger` since the worker last saw it, and `Validated`/`ToolResult` carry
what the call recorded or forgot (`LedgerDelta`).

Malformed and oversized lines never crash either side: `decode_line` returns a `ProtocolError`
value (with the call id when one can be recovered, so that call can be failed), the receiver
logs it and, in the worker, answers with `Malformed`. `LineReader` caps the bytes buffered per
line at `MAX_LINE_BYTES` and skips the rest of a longer line.

A pool worker (`workers.agent_worker`) runs one subagent at a time and borrows the
coordinator's model and permission function for it, so neither the API key nor the user's
policy ever enters its sandbox:

    coordinator                              worker (agent worker)
        |  <------------------------------------ Ready{version, pid, role, ...}
        |  Confine{id, write_paths} ----------->                          (a scoped writer)
        |  <------------------------------------ Confined{id, abi | error}
        |  RunAgent{id, prompt, system, tools, max_turns, ...} ---->
        |  <------------------------------------ ModelRequest{id, agent, keep, messages, ...}
        |  ModelEvent{id, block | retry} ------>                          (any number)
        |  ModelDone{id, message} ------------->                          (or ModelFailed)
        |  <------------------------------------ PermissionAsk{id, agent, tool, input}
        |  PermissionReply{id, allow, ...} ---->
        |  <------------------------------------ HookAsk{id, agent, event, ...}  (hooks only)
        |  HookReply{id, deny, ...} ----------->
        |  <------------------------------------ McpCall{id, agent, tool, input}  (MCP only)
        |  McpResult{id, content, is_error} --->
        |  <------------------------------------ AgentEvent{id, turn | tool_results | ...}
        |  Cancel{id: the agent's} ------------>                          (optional)
        |  <------------------------------------ AgentResult{id, reason, result, usage, ...}
        |  (the next RunAgent, or Shutdown)

`Confine` comes first, to a fresh writable worker only, when a scoped writer runs under
Landlock (workers/pool.py): the worker restricts itself to writing beneath `write_paths`
(`sandbox.landlock.restrict_writes`) before it runs anything the model controls, and answers
`Confined`; the pool sends `RunAgent` only after a `Confined` without an error.

Hooks stay with the coordinator too: `RunAgent.hook_events` names the events it has hooks
for (PreToolUse, PostToolUse, SubagentStop), and only for those does the worker send a
`HookAsk`, which the coordinator answers by running its hooks (a session without hooks sends
none). The coordinator also applies a PreToolUse hook's allow/ask to the call's
`PermissionAsk` itself, and refuses a call whose PreToolUse hooks were never asked for.

MCP servers stay with the coordinator as well (they are never started per worker):
`RunAgent.mcp_tools` holds the specs of the MCP tools the agent type may use, as the
coordinator lists them; the worker offers them to its model and runs each call through its own
pipeline (hooks and permission asked upward as for any tool), then sends `McpCall`, which the
coordinator runs only when its permission answer allowed exactly that call
(`orchestrator/agents/mcp.py`). The same two messages carry `StructuredOutput`, the tool the
coordinator serves a dispatch with an output schema (`orchestrator/agents/structured.py`): its
spec in `mcp_tools`, each call an `McpCall` named `StructuredOutput`, validated there.

A `ModelRequest` carries only what is new since the agent's previous request (`keep` says how
many of the previous request's messages come first), so a long subagent run does not send its
whole history over the pipe every turn.

Adding a message is one more model in `Message` and one more case in each receiver's `match`;
`PROTOCOL_VERSION` goes up when an existing message changes incompatibly. A tool host's
messages, `encode`, `LineReader` and the decoding live in `workers.host_protocol` (a host
imports that alone, and decodes only its own messages: `decode_host_line`); this module
offers every one of them too.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from orchestrator.errors import ModelFailureReason
from orchestrator.events import (
    AssistantTurn,
    Event,
    PermissionDecided,
    RetryScheduled,
    ToolFinished,
    ToolResultsMessage,
    ToolStarted,
)
from orchestrator.messages import (
    AssistantMessage,
    ContentBlock,
    ToolResultContent,
    ToolUseBlock,
    Usage,
)
from orchestrator.messages import Message as ChatMessage
from orchestrator.model.base import BlockComplete, Retry, ToolSpec
from orchestrator.outcome import TerminalReason
from workers.host_protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Cancel,
    HookResult,
    HostMessage,
    HostRole,
    LedgerDelta,
    LineReader,
    Malformed,
    Oversized,
    ProtocolError,
    Ready,
    RunHook,
    RunTool,
    ShellState,
    Shutdown,
    ToolOutcome,
    ToolProgress,
    ToolResult,
    Validated,
    ValidateTool,
    WireModel,
    decode_with,
    encode,
    oversized_id,
)

__all__ = [
    "MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "AgentEvent",
    "AgentResult",
    "Cancel",
    "Confine",
    "Confined",
    "HookAsk",
    "HookEventName",
    "HookReply",
    "HookResult",
    "HostRole",
    "LedgerDelta",
    "LineReader",
    "Malformed",
    "McpCall",
    "McpResult",
    "Message",
    "ModelDone",
    "ModelEvent",
    "ModelFailed",
    "ModelRequest",
    "Oversized",
    "PermissionAsk",
    "PermissionReply",
    "ProtocolError",
    "Ready",
    "RunAgent",
    "RunHook",
    "RunTool",
    "ShellState",
    "Shutdown",
    "ToolOutcome",
    "ToolProgress",
    "ToolResult",
    "ValidateTool",
    "Validated",
    "decode_line",
    "encode",
    "oversized_id",
]


HookEventName = Literal["PreToolUse", "PostToolUse", "SubagentStop"]
"""The hook events a subagent fires (through the coordinator)."""


class Confine(WireModel):
    """Restrict the worker, irreversibly, to writing beneath `write_paths` (and its private
    scratch directories) before its one run; answered by one `Confined`."""

    type: Literal["confine"] = "confine"
    id: str
    write_paths: list[str] = Field(min_length=1)
    """Absolute directories without symlinks (orchestrator/calls/scopes.py)."""


class Confined(WireModel):
    """The worker's answer to `Confine`: the Landlock ABI it used, or why it could not."""

    type: Literal["confined"] = "confined"
    id: str
    abi: int = 0
    error: str | None = None


class RunAgent(WireModel):
    """Run one subagent to its end in the worker; answered by one `AgentResult`."""

    type: Literal["run_agent"] = "run_agent"
    id: str
    """The agent's id: it tags every message of this run."""
    prompt: str
    history: list[ChatMessage] = Field(default_factory=list)
    """The agent's earlier conversation, which `prompt` continues (`SendMessage`); empty: a
    new agent."""
    system: list[str]
    """System prompt blocks, most stable first."""
    tools: list[str]
    """Names of the tools the agent may use (the worker has at least these)."""
    model: str
    """The model the coordinator will answer this agent's requests with (for its transcript)."""
    max_turns: int = Field(ge=1)
    max_tokens: int = Field(default=16_384, ge=1)
    """Output tokens per model response."""
    thinking_budget: int | None = Field(default=None, ge=1)
    """Extended thinking's budget per response (the session's `max_thinking_tokens`); None:
    no thinking."""
    hook_events: list[HookEventName] = Field(default_factory=list)
    """The events the coordinator has hooks for: the worker sends a `HookAsk` for these
    only."""
    max_stop_hook_blocks: int = Field(default=5, ge=0)
    """Times SubagentStop hooks may keep the agent going (the session's `[limits]`)."""
    mcp_tools: list[ToolSpec] = Field(default_factory=list)
    """The tools the coordinator serves the agent (its MCP tools, StructuredOutput), as the
    coordinator describes them: each call goes back to the coordinator as an `McpCall`."""


class AgentEvent(WireModel):
    """Progress of a running agent, for the coordinator's transcript, output and audit log.

    Exactly one field besides `id` is set; `event()` gives it back as the loop's own event.
    Text deltas are not sent: the complete turn follows soon enough for every consumer.
    """

    type: Literal["agent_event"] = "agent_event"
    id: str
    turn: AssistantMessage | None = None
    tool_results: ChatMessage | None = None
    tool_started: ToolStarted | None = None
    tool_finished: ToolFinished | None = None
    permission: PermissionDecided | None = None
    retry: RetryScheduled | None = None

    @classmethod
    def of(cls, agent_id: str, event: Event) -> AgentEvent | None:
        """The wire form of a loop event, or None for the events that are not sent."""
        match event:
            case AssistantTurn(turn=turn):
                return cls(id=agent_id, turn=turn)
            case ToolResultsMessage(message=message):
                return cls(id=agent_id, tool_results=message)
            case ToolStarted():
                return cls(id=agent_id, tool_started=event)
            case ToolFinished():
                return cls(id=agent_id, tool_finished=event)
            case PermissionDecided():
                return cls(id=agent_id, permission=event)
            case RetryScheduled():
                return cls(id=agent_id, retry=event)
            case _:
                return None

    def event(self) -> Event | None:
        if self.turn is not None:
            return AssistantTurn(self.turn)
        if self.tool_results is not None:
            return ToolResultsMessage(self.tool_results)
        return self.tool_started or self.tool_finished or self.permission or self.retry


class AgentResult(WireModel):
    """How an agent's run ended (the loop's `RunResult`, without the conversation)."""

    type: Literal["agent_result"] = "agent_result"
    id: str
    reason: TerminalReason
    result: str
    """The final assistant text, or the sentence saying why the run failed."""
    num_turns: int
    usage: Usage = Usage()
    cost_usd: float = 0.0
    duration_s: float = 0.0
    leftover: str | None = None
    """What the run left in a read-only worker that the worker could not remove (its private
    /tmp or /dev/shm not emptied: `sandbox.scratch`), and why: the pool then replaces the
    worker instead of reusing it. None: nothing (or a writable worker, never reused)."""


class ModelRequest(WireModel):
    """A model request of agent `agent`; answered by `ModelEvent`s and one `ModelDone` or
    `ModelFailed` with the same `id`."""

    type: Literal["model_request"] = "model_request"
    id: str
    agent: str
    keep: int = Field(default=0, ge=0)
    """How many messages of this agent's previous request come before `messages`."""
    messages: list[ChatMessage]
    system: list[str]
    tools: list[ToolSpec]
    max_tokens: int = Field(ge=1)
    thinking_budget: int | None = Field(default=None, ge=1)


class ModelEvent(WireModel):
    """One event of a streaming response: a complete content block, or a retry (everything
    streamed since the previous retry is void). Exactly one of the two is set."""

    type: Literal["model_event"] = "model_event"
    id: str
    block: BlockComplete | None = None
    retry: Retry | None = None
    parse_error: str | None = None
    """The block's `ToolUseBlock.parse_error`, which its JSON form leaves out."""

    @classmethod
    def of(cls, request_id: str, event: BlockComplete | Retry) -> ModelEvent:
        if isinstance(event, Retry):
            return cls(id=request_id, retry=event)
        return cls(id=request_id, block=event, parse_error=_parse_error(event.block))

    def event(self) -> BlockComplete | Retry | None:
        if self.block is not None and self.parse_error is not None:
            block = self.block.block.model_copy(update={"parse_error": self.parse_error})
            return BlockComplete(self.block.index, block)
        return self.block or self.retry


class ModelDone(WireModel):
    """The complete response: the last message for a `ModelRequest`."""

    type: Literal["model_done"] = "model_done"
    id: str
    message: AssistantMessage
    parse_errors: dict[int, str] = Field(default_factory=dict)
    """`ToolUseBlock.parse_error` by content index (the JSON form leaves them out)."""

    @classmethod
    def of(cls, request_id: str, message: AssistantMessage) -> ModelDone:
        content = message.message.content
        errors = {i: e for i, b in enumerate(content) if (e := _parse_error(b)) is not None}
        return cls(id=request_id, message=message, parse_errors=errors)

    def assistant_message(self) -> AssistantMessage:
        if not self.parse_errors:
            return self.message
        content = [
            b.model_copy(update={"parse_error": self.parse_errors[i]})
            if i in self.parse_errors
            else b
            for i, b in enumerate(self.message.message.content)
        ]
        # A new Message, not model_copy: that would carry over a cached `to_api()` form.
        message = ChatMessage(role="assistant", content=content)
        return self.message.model_copy(update={"message": message})


def _parse_error(block: ContentBlock) -> str | None:
    return block.parse_error if isinstance(block, ToolUseBlock) else None


class ModelFailed(WireModel):
    """The request failed for good (the client's `ModelError`); the last message for it."""

    type: Literal["model_failed"] = "model_failed"
    id: str
    message: str
    reason: ModelFailureReason = "model_error"
    status: int | None = None


class _AgentToolCall(WireModel):
    """A tool call of agent `agent` (`tool` with `input`) that the coordinator answers: the
    two messages about one call a subagent makes."""

    type: str
    """Each message's own literal (declared first here, so that it is sent first)."""
    id: str
    agent: str
    tool: str
    input: dict[str, Any]


class PermissionAsk(_AgentToolCall):
    """May agent `agent` make this tool call? The coordinator's policy decides, and asks the
    user (or denies, headless) when it must; answered by one `PermissionReply`."""

    type: Literal["permission_ask"] = "permission_ask"


class PermissionReply(WireModel):
    """The final answer to a `PermissionAsk`: allow (with an optional rewritten input) or deny
    (with the message the agent's model sees)."""

    type: Literal["permission_reply"] = "permission_reply"
    id: str
    allow: bool
    message: str = ""
    """Why it was denied, for the model (empty when allowed)."""
    rule: str | None = None
    updated_input: dict[str, Any] | None = None


class HookAsk(WireModel):
    """Run the coordinator's hooks of `event` for agent `agent`: before a tool call
    (`PreToolUse`), after it (`PostToolUse`, with `response`, the tool_result's content), or
    when the agent is about to finish (`SubagentStop`). Answered by one `HookReply`."""

    type: Literal["hook_ask"] = "hook_ask"
    id: str
    agent: str
    event: HookEventName
    tool: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    tool_use_id: str = ""
    response: str | ToolResultContent | None = None
    stop_hook_active: bool = False


class HookReply(WireModel):
    """What the hooks said, as far as the worker acts on it: `deny` (PreToolUse: the call is
    not run, `reasons`/`message` say why), `updated_input` (PreToolUse: another call, parsed,
    validated and decided again), `blocked` and `reasons` (PostToolUse feedback;
    SubagentStop: keep going), `context` (additionalContext), `stop` (`continue: false`)."""

    type: Literal["hook_reply"] = "hook_reply"
    id: str
    deny: bool = False
    message: str | None = None
    """A deny's reason when no hook blocked (`permissionDecisionReason`)."""
    rule: str | None = None
    """The hooks that decided, for the audit log."""
    blocked: bool = False
    reasons: list[str] = Field(default_factory=list)
    updated_input: dict[str, Any] | None = None
    context: list[str] = Field(default_factory=list)
    stop: bool = False
    stop_reason: str | None = None


class McpCall(_AgentToolCall):
    """Run MCP tool `tool` for agent `agent` in the coordinator, after its permission answer
    allowed this very input; answered by one `McpResult`."""

    type: Literal["mcp_call"] = "mcp_call"


class McpResult(WireModel):
    """The tool_result content of an `McpCall` (capped by the coordinator), or why it was not
    run (`is_error`)."""

    type: Literal["mcp_result"] = "mcp_result"
    id: str
    content: str | ToolResultContent
    is_error: bool = False


Message = Annotated[
    HostMessage
    | Confine
    | Confined
    | RunAgent
    | AgentEvent
    | AgentResult
    | ModelRequest
    | ModelEvent
    | ModelDone
    | ModelFailed
    | PermissionAsk
    | PermissionReply
    | HookAsk
    | HookReply
    | McpCall
    | McpResult,
    Field(discriminator="type"),
]


@functools.cache
def _message_adapter() -> pydantic.TypeAdapter[Message]:
    """Built on first use, not at import (start-up time of every worker counts)."""
    return pydantic.TypeAdapter(Message)


def decode_line(
    line: bytes | bytearray, *, max_bytes: int = MAX_LINE_BYTES
) -> Message | ProtocolError:
    """Parse one line (with or without its trailing newline) into a message.

    Never raises on bad input: malformed JSON, an unknown `type`, missing or extra fields, and
    lines over `max_bytes` all come back as a `ProtocolError` saying what was wrong.
    """
    return decode_with(_message_adapter(), line, max_bytes=max_bytes)
