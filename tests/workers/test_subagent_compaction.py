"""Subagents compact too (issue 11): a read-only subagent in a real worker process, its
requests through the broker and the real SDK to a server enforcing a 20,000-token window
(tests/kit/long_session.py). It is refused once, learns the window, summarises, and reads
every file in order to the end.
"""

from __future__ import annotations

from pathlib import Path

import trio

from orchestrator.model.anthropic import AnthropicModel
from tests.kit.fake_api import TEST_MODEL, FakeMessagesAPI
from tests.kit.long_session import LongSession, make_files
from tests.workers.agent_kit import FACTORY, Collected, agent, allow_all, request, workspace_at
from workers.broker import ModelBroker
from workers.pool import PoolOptions, open_worker_pool


async def test_a_subagent_finishes_a_session_longer_than_its_window(tmp_path: Path) -> None:
    workspace = workspace_at(tmp_path)
    session = LongSession(make_files(workspace, 24, 6_000), window=20_000)
    with FakeMessagesAPI(route=session) as api:
        model = AnthropicModel(TEST_MODEL, base_url=api.base_url, api_key="k")
        try:
            async with open_worker_pool(
                broker=ModelBroker(model),
                workspace=workspace,
                tools=FACTORY,
                options=PoolOptions(max_workers=1),
            ) as pool:
                with trio.fail_after(240):
                    out = await pool.run(
                        request(agent("reader", tools=("Read",), max_turns=60), "read all"),
                        on_event=Collected(),
                        permission=allow_all,
                    )
        finally:
            await model.aclose()
    assert out.reason == "completed", out
    assert out.result == "All files read."
    assert session.reads == list(range(24))
    assert session.refusals == 1
    assert session.summaries >= 1
