"""A long scripted session for `FakeMessagesAPI(route=...)`: a server that enforces a context
window the way the real API does, and a model that follows its work by markers, so it keeps
going however the client compacts its history.

The shape of `../shared/peers/fake_anthropic.py`'s `marker_route` (which Claude Code was
measured against): each file holds `MARKER-NNN`; the model's turn is 1 + the highest marker
anywhere in the request, and turn i reads file i. A request whose last user message asks for a
summary (summar/compact/condens) gets a summary naming the highest marker. A request larger
than the window (JSON bytes / 4, like the peer server) is refused with a 400 "prompt is too
long: N tokens > M maximum"; answered requests report that estimate as their input tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kit.fake_api import FakeResponse, HttpError, RecordedRequest, Reply

__all__ = ["LongSession", "estimate_tokens", "make_files"]

MARKER = re.compile(r"MARKER-(\d+)")
SUMMARY_ASK = re.compile(r"summar|compact|condens", re.I)


def estimate_tokens(body: Mapping[str, Any]) -> int:
    """The peer server's estimate: compact JSON of system, messages and tools, / 4."""
    part = {k: body.get(k) for k in ("system", "messages", "tools")}
    return max(1, len(json.dumps(part, separators=(",", ":"))) // 4)


def make_files(root: Path, count: int, size: int) -> list[Path]:
    """`count` files of about `size` bytes, file i starting with its marker."""
    paths = []
    line = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor\n"
    for i in range(count):
        path = root / f"file_{i:03d}.txt"
        path.write_text(f"MARKER-{i:03d}\n" + line * (size // len(line)))
        paths.append(path)
    return paths


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    if not messages or messages[-1].get("role") != "user":
        return ""
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") for b in content or [] if b.get("type") == "text")


@dataclass
class LongSession:
    """The route: `FakeMessagesAPI(route=session)`. `turns[i]` answers turn i."""

    files: list[Path]
    window: int = 60_000
    final_text: str = "All files read."
    text_per_turn: str = ""
    """Text the model writes before each tool call (not clearable: forces summaries)."""
    refusals: int = 0
    summaries: int = 0
    answered: int = 0
    reads: list[int] = field(default_factory=list)
    """The file index each answered (non-summary) turn asked for, in order."""

    def __call__(self, request: RecordedRequest) -> FakeResponse | None:
        used = estimate_tokens(request.body)
        if used > self.window:
            self.refusals += 1
            return HttpError(
                400,
                error_type="invalid_request_error",
                message=f"prompt is too long: {used} tokens > {self.window} maximum",
            )
        self.answered += 1
        usage = {"input_tokens": used, "output_tokens": 50}
        text = json.dumps(request.body.get("messages")) + json.dumps(request.body.get("system"))
        highest = max((int(n) for n in MARKER.findall(text)), default=-1)
        if SUMMARY_ASK.search(_last_user_text(request.messages)):
            self.summaries += 1
            return Reply.text(
                f"Summary of the work so far: every file up to MARKER-{highest:03d} has been "
                "read in order; continue with the next file.",
                usage=usage,
            )
        turn = highest + 1
        if turn >= len(self.files):
            return Reply.text(self.final_text, usage=usage)
        self.reads.append(turn)
        content: list[dict[str, Any]] = []
        if self.text_per_turn:
            content.append({"type": "text", "text": self.text_per_turn})
        content.append(
            {"type": "tool_use", "name": "Read", "input": {"file_path": str(self.files[turn])}}
        )
        return Reply(content=content, usage=usage)
