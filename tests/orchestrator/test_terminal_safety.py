"""Terminal safety: model-controlled text cannot drive the user's terminal, and a hostile tool
input (nested too deep, too large) is an error result for the model, never a crash.

The approval prompt itself is attacked at a real pty in test_terminal_asker.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.claude_code.output import ProgressPrinter
from orchestrator.events import (
    PermissionDecided,
    RetryScheduled,
    TextStreamed,
    ToolFinished,
    ToolStarted,
)
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.text import escape_controls
from orchestrator.tools.registry import ToolRegistry
from tests.kit.fake_api import (
    FakeMessagesAPI,
    FakeResponse,
    MalformedToolJson,
    Reply,
    model_for,
)
from tests.orchestrator.probe_tools import ProbeLog, ProbeTool

ATTACK = "x\x1b[2J\x1b]0;pwned\x07\rY\x08\u202eZ\u2066\x9b\x00"

DANGEROUS = {
    *map(chr, range(0x20)),
    "\x7f",
    *map(chr, range(0x80, 0xA0)),
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
    "\u200b",
    "\u200e",
    "\u200f",
    "\u061c",
    "\u2028",
    "\u2029",
    "\ufeff",
}


def _unsafe(text: str, *, lines_ok: bool = False) -> set[str]:
    allowed = {"\n", "\t"} if lines_ok else set()
    return {c for c in text if c in DANGEROUS and c not in allowed}


@given(st.text())
@example(ATTACK)
@example("a\\x1b b")
def test_escaped_text_has_no_terminal_control(text: str) -> None:
    assert not _unsafe(escape_controls(text))
    assert not _unsafe(escape_controls(text, keep_lines=True), lines_ok=True)


def test_plain_text_is_unchanged() -> None:
    text = "grep -rn 'a\\|b' src/ | wc -l  # ünïcödé 漢字"
    assert escape_controls(text) == text


@pytest.mark.parametrize(
    "event",
    [
        ToolStarted("t1", "Bash", f"Bash({ATTACK})"),
        ToolFinished("t1", f"Bash{ATTACK}", f"exit 0: {ATTACK}", False, 0.1),
        PermissionDecided("t1", "Bash", {}, "deny", None, "policy", f"{ATTACK}\nmore"),
        RetryScheduled(2, 1.0, f"server said {ATTACK}", 529),
        TextStreamed(f"answer {ATTACK}\nline two"),
    ],
)
def test_progress_lines_escape_model_text(event: Any) -> None:
    out = io.StringIO()
    ProgressPrinter(out, show_text=True)(event)
    printed = out.getvalue()
    assert printed and not _unsafe(printed, lines_ok=True)
    assert "\\x1b" in printed


def _nested(depth: int) -> str:
    return '{"label": "x", "deep": ' + "[" * depth + "]" * depth + "}"


async def test_deep_and_huge_tool_inputs_are_error_results(tmp_path: Path) -> None:
    """Through the loop over the real SDK: each hostile input gets its `is_error` result and
    the run goes on to complete. (Inputs over 10 MiB take minutes to stream through the fake
    server here; tests/orchestrator/model/test_convert.py covers them at the decoder, where
    they arrive.)"""
    ws = tmp_path / "ws"
    ws.mkdir()
    dirs = WarrenDirs(state=tmp_path / "state", config=tmp_path / "config")
    replies: list[FakeResponse] = [
        MalformedToolJson(name="Probe", raw_json=_nested(100_000)),
        MalformedToolJson(name="Probe", raw_json=_nested(65)),
        Reply.text("survived"),
    ]
    log = ProbeLog()
    with FakeMessagesAPI(replies) as api:
        parts = SessionParts(
            dirs=dirs,
            stdout=io.StringIO(),
            tools=lambda: ToolRegistry([ProbeTool(log)]),
            model=model_for(api, read_timeout_s=120),
        )
        async with open_session(SessionConfig(cwd=ws, sandbox="off"), parts) as session:
            result = await session.run("go")
        requests = api.requests
    assert result.reason == "completed" and result.result == "survived"
    results = [r.messages[-1]["content"][0] for r in requests[1:]]
    assert [r["is_error"] for r in results] == [True, True]
    for result in results:
        assert "nested deeper than 64" in json.dumps(result["content"])
    assert log.started() == []  # no hostile input reached the tool
