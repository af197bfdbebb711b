"""Message normalisation: turn any stored conversation into one the API accepts.

A transcript can end anywhere (a killed process, an interrupt mid-stream). Before every request
and on resume, the conversation is made valid: every tool_use is answered by a tool_result in
the next user message, in order; results without a tool_use are dropped; consecutive messages
of one role are merged; an empty assistant message gets a placeholder. Messages that need no
change are returned as the same objects, so their cached API form is reused.
"""

from __future__ import annotations

from orchestrator.messages import ContentBlock, Message, TextBlock, ToolResultBlock

__all__ = ["INTERRUPTED_BY_USER", "NO_CONTENT", "is_valid_for_api", "normalize_for_api"]

INTERRUPTED_BY_USER = "[Request interrupted by user]"
NO_CONTENT = "(no content)"


def normalize_for_api(messages: list[Message]) -> list[Message]:
    """Return a conversation the Messages API accepts (see module docstring)."""
    if is_valid_for_api(messages):
        return messages
    merged: list[Message] = []
    for message in messages:
        if merged and merged[-1].role == message.role:
            merged[-1] = Message(role=message.role, content=[*merged[-1].content, *message.content])
        else:
            merged.append(message)
    out: list[Message] = []
    for i, message in enumerate(merged):
        if message.role == "assistant":
            content = message.content or [TextBlock(text=NO_CONTENT)]
            out.append(
                message
                if content is message.content
                else Message(role="assistant", content=content)
            )
            continue
        previous = merged[i - 1] if i > 0 and merged[i - 1].role == "assistant" else None
        wanted = [b.id for b in previous.tool_uses()] if previous else []
        out.append(_answer(message, wanted))
    # A conversation whose last assistant turn asked for tools needs its results too.
    if out and out[-1].role == "assistant" and out[-1].tool_uses():
        out.append(_answer(Message(role="user", content=[]), [b.id for b in out[-1].tool_uses()]))
    return out


def _answer(message: Message, wanted: list[str]) -> Message:
    """`message` with exactly one result per wanted id, in order, results first."""
    results = {b.tool_use_id: b for b in message.tool_results()}
    others: list[ContentBlock] = [b for b in message.content if not isinstance(b, ToolResultBlock)]
    answered: list[ContentBlock] = [
        results.get(i) or ToolResultBlock(tool_use_id=i, content=INTERRUPTED_BY_USER, is_error=True)
        for i in wanted
    ]
    content = answered + others
    if content == message.content:
        return message
    return Message(role="user", content=content or [TextBlock(text=INTERRUPTED_BY_USER)])


def is_valid_for_api(messages: list[Message]) -> bool:
    previous: Message | None = None
    for message in messages:
        if previous is not None and previous.role == message.role:
            return False
        if message.role == "assistant":
            if not message.content:
                return False
        else:
            wanted = [b.id for b in previous.tool_uses()] if previous is not None else []
            got = [b.tool_use_id for b in message.tool_results()]
            leading = [
                b.tool_use_id
                for b in message.content[: len(wanted)]
                if isinstance(b, ToolResultBlock)
            ]
            if got != wanted or leading != wanted:
                return False
        previous = message
    return previous is None or previous.role == "user" or not previous.tool_uses()
