"""Long sessions end to end (issue 11): the real `warren -p`, the real SDK over a socket, and a
fake server that enforces a 60,000-token window (tests/kit/long_session.py).

The session reads eighty 20 KB files, one per turn. Without compaction it is refused at about
turn 10 (exit 4). Warren learns the window from that one refusal, summarises once, and from
then on clears old tool results before the window is reached, so the run completes with fewer
requests than Claude Code needed for the same script (153), and every file is read once, in
order: the model never lost its place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.kit.fake_api import FakeMessagesAPI
from tests.kit.long_session import LongSession, make_files
from tests.orchestrator.test_cli_e2e import run_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


def _run(
    session: LongSession, workspace: Path, env: dict[str, str], *extra: str
) -> tuple[dict[str, object], list[dict[str, object]], int, str]:
    args = ["-p", "read every file in order", "--cwd", str(workspace)]
    args += ["--output-format", "stream-json", *extra]
    with FakeMessagesAPI(route=session) as api:
        done = run_cli(args, {**env, "ANTHROPIC_BASE_URL": api.base_url}, timeout=600)
        sent = len(api.requests)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    return lines[-1], lines, sent, done.stderr


def test_an_80_turn_session_over_a_60k_window_completes(
    workspace: Path, env: dict[str, str]
) -> None:
    session = LongSession(make_files(workspace, 80, 20_000), window=60_000)
    result, lines, sent, stderr = _run(session, workspace, env)
    assert result["terminal_reason"] == "completed", (result, stderr[-2000:])
    assert result["result"] == "All files read."
    print(f"requests {sent}, refused {session.refusals}, summaries {session.summaries}")
    assert session.refusals <= 1
    assert sent < 153, f"{sent} requests"
    assert session.reads == list(range(80)), "a file was skipped or read twice"
    context = result["context"]
    assert isinstance(context, dict)
    assert context["window_tokens"] == 60_000  # learnt from the refusal
    assert 0 < context["used_tokens"] <= 60_000
    boundaries = [r for r in lines if r.get("subtype") == "compact_boundary"]
    assert len(boundaries) == session.summaries == context["compactions"]


def test_a_session_that_must_summarise_keeps_its_place_and_resumes_compacted(
    workspace: Path, env: dict[str, str]
) -> None:
    """Each turn also writes 4 KB of text, which clearing tool results cannot shrink: the
    run summarises several times, proactively (one refusal at most, to learn the window), and
    `--resume` continues from the compacted history, not the full one."""
    session = LongSession(
        make_files(workspace, 40, 4_000), window=30_000, text_per_turn="Noted. " * 600
    )
    result, lines, _, stderr = _run(session, workspace, env)
    assert result["terminal_reason"] == "completed", (result, stderr[-2000:])
    assert session.reads == list(range(40))
    assert session.refusals <= 1
    assert session.summaries >= 2
    boundaries = [r for r in lines if r.get("subtype") == "compact_boundary"]
    assert len(boundaries) == session.summaries
    assert {b["compact_metadata"]["trigger"] for b in boundaries} <= {"auto", "reactive"}
    assert any(b["compact_metadata"]["trigger"] == "auto" for b in boundaries)

    session_id = str(result["session_id"])
    follow = LongSession(session.files, window=30_000)
    with FakeMessagesAPI(route=follow) as api:
        done = run_cli(
            ["-p", "anything left?", "--cwd", str(workspace), "--resume", session_id,
             "--output-format", "json"],
            {**env, "ANTHROPIC_BASE_URL": api.base_url},
        )  # fmt: skip
        first = api.requests[0]
    assert done.returncode == 0, done.stderr
    sent_text = json.dumps(first.messages)
    assert "continues from an earlier part of the conversation" in sent_text
    assert "MARKER-000" not in sent_text, "the full history was sent, not the compacted one"
    assert "read every file in order" not in sent_text
