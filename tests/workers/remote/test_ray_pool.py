"""The Ray pool end to end: subagents as actors on a real two-node cluster (127.0.0.1), their
workers under each node's floor, served by the coordinator's broker over the real SDK and the
fake Messages API."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from orchestrator.paths import WarrenDirs
from orchestrator.session import SessionConfig, SessionParts, open_session
from orchestrator.subagents import SubagentUpdate
from orchestrator.tools.registry import ToolRegistry
from sandbox.spec import SandboxSpec
from tests.kit.fake_api import TEST_MODEL, FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.ray_cluster import LocalRayCluster, free_port
from tests.workers.agent_kit import FACTORY, SECRET, allow_all, descendants, workspace_at
from tests.workers.agent_kit import request as subagent_request
from tests.workers.remote.conftest import live_actors
from tests.workers.test_dispatch_e2e import (
    PROBE,
    TOKENS,
    RecordingRunner,
    dispatch_tool,
    dispatches,
    first_text,
    is_subagent,
    sandboxed_runner,
)
from workers.broker import ModelBroker
from workers.pool import PoolOptions
from workers.remote.backend import RaySubagents, open_ray_subagents

pytestmark = needs_sandbox
on_the_cluster = pytest.mark.xdist_group(name="ray")
"""Every test using the cluster runs in the one test process that started it."""


def environ_of(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


@on_the_cluster
async def test_three_read_only_subagents_run_as_actors_on_the_cluster(
    ray_cluster: LocalRayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    dirs = WarrenDirs(state=tmp_path / "state", config=tmp_path / "config")
    workspace = workspace_at(tmp_path)
    seen: dict[str, Any] = {}

    def route(request: RecordedRequest) -> FakeResponse:
        if is_subagent(request):
            token = first_text(request).split()[-1]
            if len(request.messages) == 1:
                return Reply.tool_use("Probe", {"label": token}, hold_before_stop=True)
            return Reply.text(f"report {token}")
        if len(request.messages) == 1:
            return dispatches(3, "probe", "Survey your part and report the token")
        return Reply.text("All three parts are surveyed.")

    async def inspect_when_in_flight(api: FakeMessagesAPI, backend: RaySubagents) -> None:
        # The server runs in another thread and has no event to wait on: poll it.
        while sum(1 for r in api.requests if is_subagent(r) and r.ended_at is None) < 3:  # noqa: ASYNC110
            await trio.sleep(0.02)
        processes = list(backend.spawner.processes)
        seen["placements"] = [p.placement for p in processes]
        seen["actor_env"] = [environ_of(p.placement.actor_pid) for p in processes]
        seen["worker_env"] = [member.environ() for p in processes for member in tree(p.pid)]
        seen["cluster"] = ray_cluster.members()
        seen["ours"] = {p.pid for p in descendants()} - seen["cluster"]
        api.release(3)

    updates: list[SubagentUpdate] = []
    with FakeMessagesAPI(route=route) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, base_url=api.base_url))
        async with open_ray_subagents(
            address=ray_cluster.address,
            broker=broker,
            workspace=workspace,
            spec=SandboxSpec(),
            tools=FACTORY,
            remote_options=PoolOptions(max_workers=3),
        ) as backend:
            runner = RecordingRunner(backend)  # type: ignore[arg-type]
            dispatch = dispatch_tool(runner, {"probe": PROBE}, dirs.sessions, updates)
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(inspect_when_in_flight, api, backend)
                    parts = SessionParts(
                        dirs=dirs,
                        stdout=io.StringIO(),
                        tools=lambda: ToolRegistry([dispatch]),
                        model=broker,
                        runner=sandboxed_runner,
                    )
                    async with open_session(SessionConfig(cwd=workspace), parts) as session:
                        result = await session.run("Survey the repository.")
        requests = api.requests
    await broker.aclose()

    assert result.reason == "completed"
    outcomes = runner.outcomes
    assert [o.reason for o in outcomes] == ["completed"] * 3
    # Each read the same snapshot of the workspace.
    assert len({o.snapshot for o in outcomes}) == 1 and outcomes[0].snapshot
    # Three actors, on the cluster's nodes, not processes of the coordinator.
    placements = seen["placements"]
    assert len({p.actor_id for p in placements}) == 3
    assert all(o.worker_node and o.worker_node.startswith("node ") for o in outcomes)
    actors = {p.actor_pid for p in placements}
    assert actors <= seen["cluster"] and not actors & (seen["ours"] | {os.getpid()})
    workers = {o.worker_pid for o in outcomes}
    assert workers <= seen["cluster"] and not workers & seen["ours"]
    # Nothing of this machine was shipped with the job (no working_dir, no packages).
    assert all(p.runtime_env == {} for p in placements)
    # No key in an actor or a sandboxed worker; not the cluster's token in a worker either.
    assert all("ANTHROPIC_API_KEY" not in env for env in seen["actor_env"])
    assert seen["worker_env"] and all(
        not {"ANTHROPIC_API_KEY", "RAY_AUTH_TOKEN"} & set(env) for env in seen["worker_env"]
    )
    # None could write the workspace, none saw the key; the reports reached the main agent.
    seconds = sorted(
        r.messages[-1]["content"][0]["content"]
        for r in requests
        if is_subagent(r) and len(r.messages) == 3
    )
    assert seconds == [
        f"label={t} write failed: Read-only file system key_seen=False" for t in TOKENS
    ]
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]
    final = [r for r in requests if not is_subagent(r)][-1]
    texts = [str(b["content"]) for b in final.messages[-1]["content"]]
    assert [f"report {t}" in text for t, text in zip(TOKENS, texts, strict=True)] == [True] * 3
    # Nothing left running on the cluster, nothing here.
    assert live_actors() == []
    assert [p for p in descendants() if p.pid not in ray_cluster.members()] == []


@on_the_cluster
async def test_a_worker_lost_mid_run_is_run_again_on_the_other_node(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """Its actor is killed (as when its node dies) while its model request is out: the run
    ends on the other node with the retried result; the lost actor is not reused."""
    workspace = workspace_at(tmp_path)
    replies: list[FakeResponse] = [
        Reply.tool_use("Probe", {"label": "first"}, hold_before_stop=True),
        Reply.tool_use("Probe", {"label": "again"}),
        Reply.text("report from the retry"),
    ]
    notices: list[str] = []
    with FakeMessagesAPI(replies) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, api_key="sk-test", base_url=api.base_url))
        async with open_ray_subagents(
            address=ray_cluster.address,
            broker=broker,
            workspace=workspace,
            spec=SandboxSpec(),
            tools=FACTORY,
            remote_options=PoolOptions(max_workers=2),
            notice=notices.append,
        ) as backend:
            lost: list[str] = []

            async def kill_when_in_flight() -> None:
                while not api.requests:  # noqa: ASYNC110
                    await trio.sleep(0.02)
                [process] = backend.spawner.processes
                lost.append(process.where)
                os.kill(process.placement.actor_pid, signal.SIGKILL)
                api.release(1)

            with trio.fail_after(90):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(kill_when_in_flight)
                    outcome = await backend.run(
                        subagent_request(PROBE, "Survey"),
                        on_event=lambda e: None,
                        permission=allow_all,
                    )
        await broker.aclose()
    assert (outcome.reason, outcome.result) == ("completed", "report from the retry")
    assert outcome.worker_node is not None and outcome.worker_node != lost[0]
    assert len(notices) == 1 and "runs again on another node" in notices[0]
    assert live_actors() == []


async def test_an_unreachable_cluster_falls_back_to_the_local_pool_with_one_line(
    tmp_path: Path,
) -> None:
    workspace = workspace_at(tmp_path)
    notices: list[str] = []
    with FakeMessagesAPI([Reply.text("local report")] * 2) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, api_key="sk-test", base_url=api.base_url))
        async with open_ray_subagents(
            address=f"127.0.0.1:{free_port()}",
            broker=broker,
            workspace=workspace,
            spec=SandboxSpec(),
            tools=FACTORY,
            notice=notices.append,
        ) as backend:
            with trio.fail_after(60):
                outcomes = [
                    await backend.run(
                        subagent_request(PROBE, "Survey"),
                        on_event=lambda e: None,
                        permission=allow_all,
                    )
                    for _ in range(2)
                ]
        await broker.aclose()
    assert [(o.reason, o.result, o.worker_node) for o in outcomes] == [
        ("completed", "local report", None)
    ] * 2
    assert len(notices) == 1
    assert "unreachable; subagents run in the local pool" in notices[0]
