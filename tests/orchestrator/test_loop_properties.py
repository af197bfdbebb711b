"""Hypothesis: over random turns of safe/unsafe calls, failures and interrupts, the loop
contract holds — one result per tool_use, in order; no unsafe call overlaps another call; at
most `max_concurrency` safe calls overlap."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.conversation.loop import LoopConfig, RunControl
from orchestrator.conversation.repair import is_valid_for_api, normalize_for_api
from tests.orchestrator.probe_tools import ProbeLog
from tests.orchestrator.test_loop import run, turn

calls = st.fixed_dictionaries(
    {
        "ms": st.integers(0, 400),
        "safe": st.booleans(),
        "fail": st.sampled_from([None, None, None, "raise", "tool_error", "hang"]),
    }
)
turns = st.lists(st.lists(calls, min_size=0, max_size=8), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(
    script=turns,
    limit=st.integers(1, 4),
    interrupt_at=st.one_of(st.none(), st.integers(0, 3000)),
    block_latency=st.sampled_from([0, 50]),
)
def test_loop_contract(
    script: list[list[dict[str, Any]]], limit: int, interrupt_at: int | None, block_latency: int
) -> None:
    log = ProbeLog()
    scripted = []
    for t, specs in enumerate(script):
        content = [
            {
                "type": "tool_use",
                "name": "Probe",
                "id": f"toolu_{t}_{i}",
                "input": {"label": f"{t}_{i}", **{k: v for k, v in spec.items() if v is not None}},
            }
            for i, spec in enumerate(specs)
        ]
        scripted.append(turn(*content, block_latency_ms=block_latency))
    scripted.append(turn({"type": "text", "text": "end"}))

    async def main() -> Any:
        control = RunControl()
        async with trio.open_nursery() as nursery:
            if interrupt_at is not None:

                async def interrupt() -> None:
                    await trio.sleep(interrupt_at / 1000)
                    control.interrupt()

                nursery.start_soon(interrupt)
            with tempfile.TemporaryDirectory() as tmp:
                result = await run(
                    scripted,
                    Path(tmp),
                    log=log,
                    config=LoopConfig(max_concurrency=limit),
                    control=control,
                    tool_timeout_s=2.0,
                )
            nursery.cancel_scope.cancel()
        return result

    result = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    # 1. Every tool_use has exactly one tool_result in the next message, in order; the stored
    #    transcript normalises to one the API accepts.
    messages = result.messages
    assert is_valid_for_api(normalize_for_api(messages))
    for prev, nxt in itertools.pairwise(messages):
        if prev.role == "assistant":
            assert [r.tool_use_id for r in nxt.tool_results()] == [b.id for b in prev.tool_uses()]
    assert result.reason in ("completed", "interrupted")
    if interrupt_at is None:
        assert result.reason == "completed"

    # 2. Overlaps: unsafe calls overlap nothing; safe calls never exceed the limit.
    spans = log.spans()
    safe_by_label = {
        f"{t}_{i}": spec["safe"] for t, specs in enumerate(script) for i, spec in enumerate(specs)
    }
    running: set[str] = set()
    for label, kind, _ in log.events:  # appended in the order things happened
        if kind == "end":
            running.remove(label)
            continue
        running.add(label)
        if not safe_by_label[label]:
            assert running == {label}, f"unsafe {label} overlapped {running}"
        assert len(running) <= limit
        assert all(safe_by_label[x] for x in running) or len(running) == 1
    assert set(spans) <= set(safe_by_label)
