"""Context accounting and compaction (orchestrator/conversation/compaction.py), in process: the
real loop, the real SDK over a socket to the windowed fake server (tests/kit/long_session.py), real
tools.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.calls.permissions import default_permission, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.conversation.compaction import (
    CLEAR_MIN_CHARS,
    Compactor,
    ContextAccount,
    clear_old_results,
    learn_window,
)
from orchestrator.conversation.loop import LoopConfig, RunResult, run_loop
from orchestrator.conversation.repair import is_valid_for_api
from orchestrator.events import CompactBoundary, Event
from orchestrator.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from orchestrator.model.anthropic import AnthropicModel
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import builtin_tools
from tests.kit.fake_api import TEST_MODEL, FakeMessagesAPI, HttpError
from tests.kit.long_session import LongSession, make_files


@pytest.mark.parametrize(
    ("message", "window"),
    [
        ("prompt is too long: 61234 tokens > 60000 maximum", 60_000),
        ("prompt is too long: 210,003 tokens > 200,000 maximum", 200_000),
        ("input length and `max_tokens` exceed context limit: 187254 + 20000 > 200000", 200_000),
        ("prompt is too long", None),
        ("overloaded", None),
    ],
)
def test_a_refusal_teaches_the_window_it_names(message: str, window: int | None) -> None:
    assert learn_window(message) == window


def _exchange(i: int, size: int) -> list[Message]:
    use = ToolUseBlock(id=f"t{i}", name="Read", input={"file_path": f"/w/f{i}"})
    result = ToolResultBlock(tool_use_id=f"t{i}", content="x" * size)
    return [Message(role="assistant", content=[use]), Message(role="user", content=[result])]


@given(sizes=st.lists(st.integers(min_value=0, max_value=5_000), max_size=12))
def test_clearing_keeps_the_pairs_valid_and_the_recent_results(sizes: list[int]) -> None:
    history = [Message.user_text("go")]
    for i, size in enumerate(sizes):
        history += _exchange(i, size)
    cleared, removed = clear_old_results(history, keep_recent=3)
    assert is_valid_for_api(cleared)
    assert len(cleared) == len(history)
    results = [b for m in cleared for b in m.tool_results()]
    originals = [b for m in history for b in m.tool_results()]
    for n, (new, old) in enumerate(zip(results, originals, strict=True)):
        if n >= len(originals) - 3 or len(old.text()) < CLEAR_MIN_CHARS - 2:
            assert new is old
        else:
            assert new.tool_use_id == old.tool_use_id
            assert f"Read(/w/f{n})" in new.text() and "Call the tool again" in new.text()
    assert removed >= 0
    again, removed_again = clear_old_results(cleared, keep_recent=3)
    assert removed_again == 0 and again == cleared  # notes are not cleared twice


def test_the_estimate_follows_the_reported_tokens_and_what_was_appended() -> None:
    account = ContextAccount(100_000)
    sent = [Message.user_text("a" * 4_000)]
    account.observe(sent, fixed_chars=0, usage_tokens=1_000)  # 4 characters a token here
    grown = [*sent, *_exchange(1, 40_000)]
    estimate = account.estimate(grown, fixed_chars=0)
    assert 10_900 <= estimate <= 11_200
    account.forget()  # rewritten: from characters alone, at the same ratio
    assert 10_900 <= account.estimate(grown, fixed_chars=0) <= 11_200


async def _run(
    session: LongSession,
    workspace: Path,
    compactor: Compactor,
    events: list[Event],
    ctx: ToolContext | None = None,
) -> tuple[RunResult, int, list[int]]:
    ctx = ctx or ToolContext(workspace=workspace, cwd=workspace)
    pipeline = ToolPipeline(
        tools=builtin_tools(),
        ctx=ctx,
        permission=default_permission("bypass"),
        asker=headless_asker,
        emit=events.append,
    )
    with FakeMessagesAPI(route=session) as api:
        model = AnthropicModel(TEST_MODEL, api_key="test", base_url=api.base_url)
        try:
            result = await run_loop(
                model=model,
                messages=[Message.user_text("read every file")],
                pipeline=pipeline,
                config=LoopConfig(max_turns=200, max_tokens=4_096),
                emit=events.append,
                compactor=compactor,
            )
        finally:
            await model.aclose()
            await ctx.aclose()
        return result, len(api.requests), api.token_counts


async def test_compaction_before_the_window_needs_no_refusal(tmp_path: Path) -> None:
    """A window known beforehand (configured): never refused, and files re-read after a
    summary stay readable for Edit while the rest must be read again."""
    session = LongSession(make_files(tmp_path, 30, 4_000), window=20_000, text_per_turn="ok " * 900)
    compactor = Compactor(window=20_000, threshold=0.7)
    events: list[Event] = []
    ctx = ToolContext(workspace=tmp_path, cwd=tmp_path)
    result, sent, counts = await _run(session, tmp_path, compactor, events, ctx)
    assert result.reason == "completed", result.result
    assert session.refusals == 0
    assert session.reads == list(range(30))
    boundaries = [e for e in events if isinstance(e, CompactBoundary) and e.summarised]
    assert boundaries and all(b.trigger == "auto" for b in boundaries)
    assert result.compactions == len(boundaries) == session.summaries
    assert sent == 31 + session.summaries
    assert counts and compactor.counted == len(counts)  # checked near the limit, not every turn
    assert len(counts) < sent / 2
    assert result.context_window == 20_000 and 0 < result.context_tokens <= 20_000
    head = boundaries[-1].messages[0]
    assert "re-read after the compaction" in head.text()
    # Read-before-write after the last summary: the files re-read then, the ones the kept
    # turns touched, and those read since; every earlier file must be read again.
    kept = boundaries[-1].messages
    shown = {str(f) for f in session.files if f"{f}," in head.text()}
    touched = {
        str(b.input["file_path"]) for m in kept[1:] for b in m.tool_uses() if "file_path" in b.input
    }
    last = session.files.index(Path(max(shown | touched)))
    since = {str(f) for f in session.files[last + 1 :]}
    assert shown
    assert {str(p) for p in ctx.read_ledger.entries()} == shown | touched | since


async def test_a_refusal_compacts_once_and_never_loops(tmp_path: Path) -> None:
    """A server that refuses everything as too long: one compaction attempt, then the run
    ends prompt_too_long, with a bounded number of requests."""
    (tmp_path / "a.txt").write_text("a")
    refusal = HttpError(
        400,
        error_type="invalid_request_error",
        message="prompt is too long: 5000 tokens > 4000 maximum",
    )

    def refuse(_request: object) -> HttpError:
        return refusal

    ctx = ToolContext(workspace=tmp_path, cwd=tmp_path)
    events: list[Event] = []
    pipeline = ToolPipeline(
        tools=builtin_tools(),
        ctx=ctx,
        permission=default_permission("bypass"),
        asker=headless_asker,
        emit=events.append,
    )
    with FakeMessagesAPI(route=refuse) as api:  # type: ignore[arg-type]
        model = AnthropicModel(TEST_MODEL, api_key="test", base_url=api.base_url)
        try:
            with trio.fail_after(30):
                result = await run_loop(
                    model=model,
                    messages=[Message.user_text("go")],
                    pipeline=pipeline,
                    config=LoopConfig(),
                    emit=events.append,
                )
        finally:
            await model.aclose()
            await ctx.aclose()
        sent = len(api.requests)
    assert result.reason == "prompt_too_long"
    assert sent == 2  # the request, then the summary request (refused too): no retry loop
    assert "4000 maximum" in result.result


def test_a_threshold_outside_the_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"between 0\.5 and 0\.95"):
        Compactor(window=1_000, threshold=0.99)


def test_the_note_names_the_call_to_repeat() -> None:
    history = [Message.user_text("go"), *_exchange(0, 5_000), *_exchange(1, 10), *_exchange(2, 10)]
    history += _exchange(3, 10)
    cleared, removed = clear_old_results(history, keep_recent=3)
    note = cleared[2].tool_results()[0]
    assert isinstance(note.content, list) and isinstance(note.content[0], TextBlock)
    assert "Read(/w/f0)" in note.text() and "5,000 characters" in note.text()
    assert removed > 4_000
