"""A fork: a subagent that starts from the main agent's conversation so far.

`dispatch_agent(subagent_type="fork", prompt=...)` hands a task to a copy of the main agent: it
knows everything the main agent read and said, so the prompt need not repeat it. Its
conversation is the main agent's last request (the messages as the model saw them), the main
agent's reply up to and including this call, a result for each call of that reply (its own:
"forked"; the others: not its part), and the task. Its requests are sent as the main agent's
are (the same system prompt, the same tools, the same limits) and its first one places the
cache breakpoints where the main agent's last request had them: its body starts with that
request's bytes, so the API's prompt cache serves the shared conversation
(`ForkBase`, `ModelRequest.breakpoints_at`).

It runs in a worker like any subagent: read-only, unless `write_paths` gives it a scope (then
it is a scoped writer). Of the tools it is shown, it can call only its own (the explorer's,
Bash included, in a read-only sandbox; as a writer, the file tools too); another call gets an
error result saying so.
It is available to the main agent only (`CURRENT_TURN`).
"""

from __future__ import annotations

from collections.abc import Collection

from orchestrator.agents.types import GENERAL, AgentType, ForkBase
from orchestrator.messages import ContentBlock, Message, ToolResultBlock, ToolUseBlock
from orchestrator.tools.base import TurnSoFar

__all__ = ["FORK", "FORK_DESCRIPTION", "ForkStart", "fork_start", "fork_task", "fork_type"]

FORK = "fork"

FORK_DESCRIPTION = (
    "A copy of you that starts from this conversation: it knows everything you read and "
    "said, so the prompt only says what to do. Read-only, unless write_paths gives it a "
    "scope. Use it to split off a task that needs your context (a second opinion, a check of "
    "your plan against the code, one part of a change you have worked out)."
)
_OWN_RESULT = (
    "Forked: this conversation goes on in a subagent (you, the fork). The main agent goes on "
    "by itself and sees only your final message."
)
_OTHER_RESULT = "This call runs in the main agent; its result is not part of the fork."
_WRITER_TOOLS = ("Write", "Edit", "MultiEdit", "NotebookEdit", "Bash")


def fork_type(*, writable: bool, available: Collection[str]) -> AgentType:
    """The fork's type: the read-only explorer's tools, or as a writer those and the file
    tools and Bash among `available` (the session's)."""
    tools = GENERAL.tools
    if writable:
        tools = (*tools, *(n for n in _WRITER_TOOLS if n in available and n not in tools))
    return AgentType(
        name=FORK,
        description=FORK_DESCRIPTION,
        system_prompt="",
        tools=tools,
        writable=writable,
    )


class ForkStart:
    """What a fork starts from: its history and how its requests are sent."""

    def __init__(self, history: list[Message], base: ForkBase, system: list[str]) -> None:
        self.history = history
        self.base = base
        self.system = system


def fork_start(turn: TurnSoFar, tool_use_id: str) -> ForkStart:
    """The conversation a fork of the call `tool_use_id` starts from, from the main agent's
    turn `turn`.

    **Errors:** `ValueError` when the call is not among the turn's complete blocks (it always
    is: a call starts once its block is complete).
    """
    blocks: list[ContentBlock] = []
    for _, block in sorted(turn.blocks.items()):
        blocks.append(block)
        if isinstance(block, ToolUseBlock) and block.id == tool_use_id:
            break
    else:
        raise ValueError(f"the call {tool_use_id} is not in the main agent's turn")
    results: list[ContentBlock] = [
        ToolResultBlock(
            tool_use_id=block.id,
            content=_OWN_RESULT if block.id == tool_use_id else _OTHER_RESULT,
        )
        for block in blocks
        if isinstance(block, ToolUseBlock)
    ]
    request = turn.request
    history = [
        *request.messages,
        Message(role="assistant", content=blocks),
        Message(role="user", content=results),
    ]
    base = ForkBase(
        tools=tuple(request.tools),
        max_tokens=request.max_tokens,
        thinking_budget=request.thinking_budget,
        prefix=len(request.messages),
    )
    return ForkStart(history, base, list(request.system))


def fork_task(prompt: str, agent_type: AgentType, scope_note: str | None) -> str:
    """The fork's instructions: its task, and what it can do."""
    parts = [
        "You are now a fork of the main agent: a subagent that starts from the conversation "
        "above. Do this task, then end with a final message that reports what the main agent "
        "needs (it sees nothing else of your work).",
        f"Your task:\n{prompt}",
        f"Of the tools above you can call only: {', '.join(agent_type.tools)}. "
        + (
            "You may change files."
            if agent_type.writable
            else "The workspace is read-only for you: you cannot change files."
        ),
    ]
    if scope_note:
        parts.append(scope_note)
    return "\n\n".join(parts)
