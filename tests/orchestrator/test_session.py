"""Sessions: output formats, transcripts, resume after a crash, audit lines, a second prompt
in the same conversation."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from orchestrator.conversation.loop import RunResult
from orchestrator.conversation.repair import INTERRUPTED_BY_USER, is_valid_for_api
from orchestrator.errors import ConfigError
from orchestrator.events import Event, ToolStarted
from orchestrator.limits import Limits
from orchestrator.messages import Message, ToolUseBlock
from orchestrator.model.scripted import ScriptedModel, ScriptedTurn
from orchestrator.paths import WarrenDirs
from orchestrator.records.transcripts import SessionStore
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.session.session import Session
from orchestrator.tools.base import DEFAULT_TOOL_TIMEOUT_S
from orchestrator.tools.registry import ToolRegistry
from tests.orchestrator.probe_tools import ProbeLog, ProbeTool


def write_script(path: Path, turns: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted:{path}"


def probe_call(label: str, **kw: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": "Probe", "input": {"label": label, **kw}}


@pytest.fixture
def dirs(tmp_path: Path) -> WarrenDirs:
    return WarrenDirs(state=tmp_path / "state", config=tmp_path / "config")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "WARREN.md").write_text("Always run `make check`.")
    return ws


@dataclass
class Report:
    result: RunResult
    session_id: str
    transcript: Path


async def headless(
    config: SessionConfig,
    dirs: WarrenDirs,
    model: ScriptedModel | None = None,
    *,
    prompt: str = "go",
) -> tuple[Report, str]:
    out = io.StringIO()
    parts = SessionParts(
        dirs=dirs,
        stdout=out,
        tools=lambda: ToolRegistry([ProbeTool(ProbeLog())]),
        model=model,
    )
    async with open_session(config.model_copy(update={"sandbox": "off"}), parts) as session:
        result = await session.run(prompt)
    return Report(result, session.session_id, session.transcript.path), out.getvalue()


async def test_stream_json_shape(tmp_path: Path, dirs: WarrenDirs, workspace: Path) -> None:
    model = write_script(
        tmp_path / "s.json",
        [
            {"content": [{"type": "text", "text": "looking"}, probe_call("a"), probe_call("b")]},
            {"content": [{"type": "text", "text": "all done"}]},
        ],
    )
    options = SessionConfig(cwd=workspace, model=model, output_format="stream-json")
    report, out = await headless(options, dirs)
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = [(r["type"], r.get("subtype")) for r in lines]
    assert kinds == [
        ("system", "init"),
        ("assistant", None),
        ("user", None),
        ("assistant", None),
        ("result", "success"),
    ]
    init = lines[0]
    assert init["session_id"] == report.session_id
    assert init["tools"] == ["Probe"]
    assert init["transcript_path"] == str(report.transcript)
    assert [c["type"] for c in lines[1]["message"]["content"]] == ["text", "tool_use", "tool_use"]
    results = lines[2]["message"]["content"]
    assert [r["content"] for r in results] == ["done a", "done b"]
    final = lines[-1]
    assert final["result"] == "all done"
    assert final["num_turns"] == 2
    assert final["is_error"] is False
    assert set(final) >= {"duration_ms", "usage", "total_cost_usd", "session_id", "modelUsage"}
    assert final["modelUsage"]["scripted:s.json"]["requests"] == 2


async def test_system_prompt_carries_context_and_memory(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    model = ScriptedModel(
        [ScriptedTurn.model_validate({"content": [{"type": "text", "text": "hi"}]})]
    )
    await headless(SessionConfig(cwd=workspace), dirs, model)
    system = "\n".join(model.requests[0].system)
    assert f"Working directory: {workspace}" in system
    assert "Always run `make check`." in system
    assert "WARREN.md" in system


async def test_json_output_and_transcript(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    model = write_script(
        tmp_path / "s.json",
        [{"content": [probe_call("a")]}, {"content": [{"type": "text", "text": "ok"}]}],
    )
    options = SessionConfig(cwd=workspace, model=model, output_format="json")
    report, out = await headless(options, dirs)
    record = json.loads(out)
    assert record["type"] == "result" and record["result"] == "ok"
    lines = [json.loads(x) for x in report.transcript.read_text().splitlines()]
    assert lines[0]["type"] == "session"
    roles = [x["message"]["role"] for x in lines if x["type"] == "message"]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert lines[-1]["type"] == "result"
    audit = report.transcript.with_suffix(".audit.jsonl").read_text().splitlines()
    decision = json.loads(audit[0])
    assert decision["tool"] == "Probe" and decision["decision"] == "allow"
    assert decision["rule"] == "read-only [built-in]"


async def test_resume_after_crash_mid_turn(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    """A transcript cut after a tool_use (process killed) resumes without a protocol error."""
    store = SessionStore(dirs.sessions)
    transcript = store.create(cwd=workspace, model="scripted")
    transcript.message(Message.user_text("first"))
    transcript.message(
        Message(
            role="assistant",
            content=[ToolUseBlock(id="toolu_dangling", name="Probe", input={"label": "x"})],
        )
    )
    transcript.close()
    with transcript.path.open("a") as f:
        f.write('{"type":"message","message":{"role":"us')  # half-written line

    model = ScriptedModel(
        [ScriptedTurn.model_validate({"content": [{"type": "text", "text": "resumed"}]})]
    )
    report, _ = await headless(
        SessionConfig(cwd=workspace, resume=transcript.session_id), dirs, model, prompt="go on"
    )
    assert report.result.reason == "completed"
    sent = model.requests[0].messages
    assert is_valid_for_api(sent)
    assert sent[2].tool_results()[0].content == INTERRUPTED_BY_USER
    assert sent[-1].content[-1].text == "go on"
    assert report.session_id == transcript.session_id


async def test_continue_picks_latest_session(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    model = write_script(tmp_path / "s.json", [{"content": [{"type": "text", "text": "one"}]}])
    first, _ = await headless(SessionConfig(cwd=workspace, model=model), dirs, prompt="a")
    model2 = write_script(tmp_path / "s2.json", [{"content": [{"type": "text", "text": "two"}]}])
    second, _ = await headless(
        SessionConfig(cwd=workspace, model=model2, continue_last=True), dirs, prompt="b"
    )
    assert second.session_id == first.session_id
    assert [m.role for m in second.result.messages] == ["user", "assistant", "user", "assistant"]


def test_contradictory_options_are_rejected(workspace: Path) -> None:
    with pytest.raises(ValueError, match="--resume and --continue"):
        SessionConfig(cwd=workspace, resume="abc", continue_last=True)
    with pytest.raises(ValueError, match="both --allowed-tools and --disallowed-tools"):
        SessionConfig(
            cwd=workspace,
            allowed_tools=frozenset({"Bash"}),
            disallowed_tools=frozenset({"Bash"}),
        )


async def test_a_second_prompt_continues_the_conversation(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    model = ScriptedModel(
        [
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "one"}]}),
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "two"}]}),
        ]
    )
    out = io.StringIO()
    parts = SessionParts(dirs=dirs, stdout=out, model=model)
    async with open_session(SessionConfig(cwd=workspace, sandbox="off"), parts) as session:
        first = await session.run("a")
        second = await session.run("b")
    assert (first.result, second.result) == ("one", "two")
    sent = model.requests[1].messages
    assert [(m.role, m.text()) for m in sent] == [
        ("user", "a"),
        ("assistant", "one"),
        ("user", "b"),
    ]
    assert out.getvalue() == "one\ntwo\n"
    results = [
        json.loads(line)
        for line in session.transcript.path.read_text().splitlines()
        if '"type":"result"' in line
    ]
    assert [r["reason"] for r in results] == ["completed", "completed"]


async def test_interrupt_ends_the_current_run_and_the_next_one_runs(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    """`interrupt()` while a tool runs: the run ends `interrupted`; the same session then
    answers the next prompt with a valid conversation."""
    model = ScriptedModel(
        [
            ScriptedTurn.model_validate({"content": [probe_call("slow", fail="hang")]}),
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "fine"}]}),
        ]
    )
    sessions: list[Session] = []

    def interrupt_when_the_tool_starts(event: Event) -> None:
        if isinstance(event, ToolStarted):
            sessions[0].interrupt()

    parts = SessionParts(
        dirs=dirs,
        stdout=io.StringIO(),
        model=model,
        tools=lambda: ToolRegistry([ProbeTool(ProbeLog())]),
        extra_sinks=(interrupt_when_the_tool_starts,),
    )
    async with open_session(SessionConfig(cwd=workspace, sandbox="off"), parts) as session:
        sessions.append(session)
        with trio.fail_after(30):
            first = await session.run("go")
        second = await session.run("again")
    assert first.reason == "interrupted"
    assert second.reason == "completed" and second.result == "fine"
    assert is_valid_for_api(model.requests[1].messages)


@pytest.mark.parametrize(
    ("policy", "flags", "expected"),
    [
        ({}, {}, Limits()),
        ({"max_turns": 7}, {}, Limits(max_turns=7)),
        ({"max_turns": 7}, {"max_turns": 3}, Limits(max_turns=3)),
        ({"max_turns": 7}, {"max_turns": None}, Limits(max_turns=7)),
        ({"max_budget_usd": 2.0}, {"max_budget_usd": 0.5}, Limits(max_budget_usd=0.5)),
        ({"max_output_tokens_total": 10}, {}, Limits(max_output_tokens_total=10)),
        (
            {"tool_timeout_s": 5.0, "max_subagents": 0},
            {},
            Limits(tool_timeout_s=5.0, max_subagents=0),
        ),
    ],
)
def test_limits_command_line_over_policy_over_defaults(
    policy: dict[str, float], flags: dict[str, float | None], expected: Limits
) -> None:
    assert Limits.build(policy, flags) == expected


def test_limits_defaults_are_written_once() -> None:
    limits = Limits()
    assert (limits.max_turns, limits.max_concurrency, limits.max_subagents) == (100, 10, 10)
    assert limits.tool_timeout_s == DEFAULT_TOOL_TIMEOUT_S
    assert limits.max_budget_usd is None and limits.max_output_tokens_total is None


def test_the_built_in_policy_states_the_same_limits_as_the_defaults() -> None:
    """policies/defaults.toml shows the limits to `warren policy show` (policies/ cannot
    import orchestrator/): each value must be `Limits`' default, so the two cannot drift."""
    import tomllib
    from importlib import resources

    text = resources.files("policies").joinpath("defaults.toml").read_text(encoding="utf-8")
    stated = tomllib.loads(text)["limits"]
    assert stated and Limits.build(stated) == Limits()


async def test_manual_compaction_with_instructions_then_the_next_run_continues_from_it(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    """`Session.compact(instructions)` (the REPL's `/compact`): one summary request whose last
    user message asks for the summary with the focus; the history becomes the boundary, the
    transcript records it, and the next run sends the compacted history."""
    model = ScriptedModel(
        [
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "one"}]}),
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "SUMMARY-1"}]}),
            ScriptedTurn.model_validate({"content": [{"type": "text", "text": "two"}]}),
        ]
    )
    parts = SessionParts(dirs=dirs, stdout=io.StringIO(), model=model)
    async with open_session(SessionConfig(cwd=workspace, sandbox="off"), parts) as session:
        await session.run("first task")
        compaction = await session.compact("the parser changes")
        second = await session.run("b")
        store = SessionStore(dirs.sessions)
    assert compaction.trigger == "manual" and compaction.summary is not None
    ask = model.requests[1].messages[-1].text()
    assert "summary" in ask.lower() and "Focus the summary on: the parser changes" in ask
    assert second.result == "two"
    sent = model.requests[2].messages
    assert "SUMMARY-1" in sent[0].text() and "first task" not in json.dumps(
        [m.to_api() for m in sent]
    )
    records = [json.loads(line) for line in session.transcript.path.read_text().splitlines()]
    assert [r["trigger"] for r in records if r["type"] == "compact_boundary"] == ["manual"]
    loaded = store.load(session.session_id).messages
    assert "SUMMARY-1" in loaded[0].text() and loaded[-1].text() == "two"


async def test_session_id_and_fork_session(
    tmp_path: Path, dirs: WarrenDirs, workspace: Path
) -> None:
    """Claude Code's `--session-id` names the new session; `--fork-session` continues a
    resumed conversation in a new one and leaves the old transcript as it was."""
    chosen = "0b5f3a3e-6a43-4a8e-9d55-1c2b3d4e5f60"
    model = write_script(tmp_path / "s.json", [{"content": [{"type": "text", "text": "one"}]}])
    first, _ = await headless(
        SessionConfig(cwd=workspace, model=model, session_id=chosen), dirs, prompt="a"
    )
    assert first.session_id == chosen
    with pytest.raises(ConfigError, match="already in use"):
        await headless(SessionConfig(cwd=workspace, model=model, session_id=chosen), dirs)
    old = first.transcript.read_text()
    model2 = write_script(tmp_path / "s2.json", [{"content": [{"type": "text", "text": "two"}]}])
    forked, _ = await headless(
        SessionConfig(cwd=workspace, model=model2, resume=chosen, fork_session=True),
        dirs,
        prompt="b",
    )
    assert forked.session_id != chosen
    assert [m.role for m in forked.result.messages] == ["user", "assistant", "user", "assistant"]
    assert first.transcript.read_text() == old
    loaded = SessionStore(dirs.sessions).load(forked.session_id)
    assert len(loaded.messages) == 4


def test_claude_code_session_options_are_checked(workspace: Path) -> None:
    with pytest.raises(ValueError, match="--fork-session needs --resume or --continue"):
        SessionConfig(cwd=workspace, fork_session=True)
    with pytest.raises(ValueError, match="is not a UUID"):
        SessionConfig(cwd=workspace, session_id="../../etc")
    with pytest.raises(ValueError, match="needs --fork-session"):
        SessionConfig(cwd=workspace, continue_last=True, session_id=str(uuid.uuid4()))
