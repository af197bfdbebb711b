"""The wire protocol: round trips, malformed and oversized lines, line splitting, and a host
process spoken to line by line (unsandboxed: this tests the protocol, not the floor)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.messages import ImageBlock, ImageSource, TextBlock
from workers import protocol as wire

MESSAGES: list[wire.Message] = [
    wire.Ready(
        version=wire.PROTOCOL_VERSION, pid=7, role="read_only", workspace="/repo", tools=["Bash"]
    ),
    wire.ValidateTool(id="c1", tool="Edit", input={"file_path": "/repo/a", "n": [1, None]}),
    wire.Validated(id="c1", refusal="Read it first."),
    wire.Validated(id="c1", error="no such tool", ledger=wire.LedgerDelta(forgotten=["/repo/a"])),
    wire.RunTool(
        id="c2",
        tool="Bash",
        input={"command": "ls\n"},
        ledger=wire.LedgerDelta(recorded={"/repo/a": 1_700_000_000_123_456_789}),
        shell=wire.ShellState(cwd="/repo/src", snapshot="export X=1\n"),
    ),
    wire.ToolProgress(id="c2", text="50% \u2713"),
    wire.ToolResult(id="c2", outcome="output", content="line\nline", summary="2 lines"),
    wire.ToolResult(
        id="c3",
        outcome="output",
        content=[
            TextBlock(text="an image"),
            ImageBlock(source=ImageSource(media_type="image/png", data="aGk=")),
        ],
    ),
    wire.ToolResult(id="c4", outcome="tool_error", content="refused", is_error=True),
    wire.ToolResult(id="c5", outcome="cancelled"),
    wire.RunHook(
        id="c6",
        command="jq -e .tool_name >/dev/null",
        stdin='{"tool_name": "Bash"}',
        env={"CLAUDE_PROJECT_DIR": "/repo"},
        cwd="/repo",
        timeout_s=60.0,
        output_bytes=1 << 20,
    ),
    wire.HookResult(id="c6", exit_code=2, stderr="no pushing\n"),
    wire.HookResult(id="c7", exit_code=None, problem="timed out after 1 s and was stopped"),
    wire.Cancel(id="c2"),
    wire.Shutdown(),
    wire.Malformed(detail="bad", id=None),
    wire.HookAsk(
        id="h1",
        agent="agent-1",
        event="PreToolUse",
        tool="Bash",
        input={"command": "git push"},
        tool_use_id="toolu_1",
    ),
    wire.HookAsk(id="h2", agent="agent-1", event="SubagentStop", stop_hook_active=True),
    wire.HookReply(id="h1", deny=True, reasons=["[exit 2]: no pushing"], rule="hook [x]"),
    wire.HookReply(id="h2", blocked=True, reasons=["not yet"], context=["more"]),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_as_one_line(message: wire.Message) -> None:
    line = wire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert wire.decode_line(line) == message
    assert wire.decode_line(line.rstrip(b"\n")) == message


@pytest.mark.parametrize(
    ("line", "detail", "call_id"),
    [
        (b"not json", "invalid message", None),
        (b"[1, 2]", "invalid message", None),
        (b'{"type": "launch_missiles", "id": "c9"}', "does not match any of the expected", "c9"),
        (b'{"type": "cancel"}', "id: Field required", None),
        (b'{"type": "cancel", "id": "c3", "extra": 1}', "extra: Extra inputs", "c3"),
        (b'{"type": "run_tool", "id": "c4", "tool": 5, "input": {}}', "tool: Input should", "c4"),
        (b'{"type": "cancel", "id": "\xff\xfe"}', "invalid", None),
        (b"", "invalid message", None),
    ],
)
def test_malformed_lines_are_reported_not_raised(
    line: bytes, detail: str, call_id: str | None
) -> None:
    result = wire.decode_line(line)
    assert isinstance(result, wire.ProtocolError)
    assert detail in result.detail
    assert result.call_id == call_id


def test_a_line_over_the_cap_is_refused_before_parsing() -> None:
    line = wire.encode(wire.ToolProgress(id="c1", text="x" * 100))
    result = wire.decode_line(line, max_bytes=50)
    assert isinstance(result, wire.ProtocolError)
    assert "exceeds the 50-byte cap" in result.detail


async def _read_all(chunks: list[bytes], max_bytes: int) -> list[bytes | wire.Oversized]:
    send, receive = trio.testing.memory_stream_pair()
    reader = wire.LineReader(receive, max_bytes=max_bytes)
    out: list[bytes | wire.Oversized] = []
    async with trio.open_nursery() as nursery:

        async def feed() -> None:
            for chunk in chunks:
                await send.send_all(chunk)
            await send.aclose()

        nursery.start_soon(feed)
        while (item := await reader.next()) is not None:
            out.append(item)
    return out


async def test_line_reader_skips_an_oversized_line_and_keeps_its_id() -> None:
    huge = wire.encode(wire.ToolResult(id="c42", outcome="output", content="x" * 5000))
    chunks = [b"first\n", huge[:1000], huge[1000:3000], huge[3000:] + b"after\n", b"last"]
    items = await _read_all(chunks, max_bytes=1024)
    assert items[0] == b"first"
    oversized = items[1]
    assert isinstance(oversized, wire.Oversized)
    assert oversized.size == len(huge) - 1
    assert wire.oversized_id(oversized) == "c42"
    assert items[2:] == [b"after", b"last"]


async def test_line_reader_reports_an_oversized_last_line_without_newline() -> None:
    items = await _read_all([b"a\n", b"y" * 300], max_bytes=100)
    assert items == [b"a", wire.Oversized(300, b"y" * 200)]


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_line_reader_finds_the_same_lines_however_the_stream_is_cut(
    lines: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points) if b > a]
    expected: list[bytes | wire.Oversized] = [
        line if len(line) <= 30 else wire.Oversized(len(line), line[:200]) for line in lines
    ]
    assert trio.run(_read_all, chunks, 30) == expected


# --- a real host process, unsandboxed -----------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "f.txt").write_text("hello\n")
    return tmp_path.resolve()


async def test_host_speaks_the_protocol_unsandboxed(ws: Path) -> None:
    """Spoken to line by line: Ready first, answers by id, garbage reported, clean exit."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-I", "-m", "workers.toolhost", "--role=read_only", f"--workspace={ws}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    reader = wire.LineReader(proc.stdout)

    async def receive() -> wire.Message | wire.ProtocolError:
        line = await reader.next()
        assert isinstance(line, bytes)
        return wire.decode_line(line)

    try:
        with trio.fail_after(20):
            ready = await receive()
            assert isinstance(ready, wire.Ready)
            expected = (wire.PROTOCOL_VERSION, "read_only", proc.pid)
            assert (ready.version, ready.role, ready.pid) == expected
            assert ready.workspace == str(ws)
            assert "Read" in ready.tools

            await proc.stdin.send_all(b"{not json\n" + b'{"type": "cancel", "id": "c0"}\n')
            bad = await receive()
            assert isinstance(bad, wire.Malformed) and "invalid message" in bad.detail

            run = wire.RunTool(id="c1", tool="Read", input={"file_path": str(ws / "f.txt")})
            await proc.stdin.send_all(wire.encode(run))
            result = await receive()
            assert isinstance(result, wire.ToolResult)
            assert (result.id, result.outcome) == ("c1", "output")
            assert "hello" in str(result.content)
            real = str(ws / "f.txt")
            assert result.ledger.recorded == {real: os.stat(real).st_mtime_ns}

            unknown = wire.ValidateTool(id="c2", tool="Nope", input={})
            await proc.stdin.send_all(wire.encode(unknown))
            validated = await receive()
            assert isinstance(validated, wire.Validated)
            assert validated.error is not None and "no tool named Nope" in validated.error

            await proc.stdin.send_all(wire.encode(wire.Shutdown()))
            assert await reader.next() is None
            assert await proc.wait() == 0
    finally:
        proc.kill()
        await proc.wait()
