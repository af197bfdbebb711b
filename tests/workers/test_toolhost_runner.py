"""SandboxedToolRunner against real tool hosts under real bwrap.

Security tests assert on the host afterwards (the file is absent, the process is gone).
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog
import structlog.testing
import trio

from orchestrator.aio import closing_iter
from orchestrator.calls.permissions import default_permission, headless_asker
from orchestrator.calls.pipeline import ToolPipeline
from orchestrator.calls.plan import CallPlan, plan_call, tool_assessor
from orchestrator.errors import ToolError
from orchestrator.messages import ToolUseBlock
from orchestrator.tools.base import (
    Checked,
    Tool,
    ToolContext,
    ToolInput,
    ToolOutput,
    ToolProgress,
)
from orchestrator.tools.bash import BashTool
from orchestrator.tools.registry import ToolRegistry
from orchestrator.tools.think import ThinkTool
from policies.facts import ToolFacts
from tests.kit.floor import needs_sandbox
from tests.workers.host_tools import FACTORY, tools
from workers import protocol as wire
from workers.toolhost_runner import (
    HostLaunch,
    HostProcess,
    SandboxedToolRunner,
    ToolHostError,
    _Host,
    host_environment,
    open_tool_runner,
    unsandboxed_spawner,
)

pytestmark = needs_sandbox


def failing_spawner(launch: HostLaunch) -> AbstractAsyncContextManager[HostProcess]:
    """A "host" that exits at once, before Ready."""
    return unsandboxed_spawner(dataclasses.replace(launch, argv=("/bin/false",)))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\nbeta\n")
    (ws / "sub").mkdir()
    return ws.resolve()


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, cwd=workspace)


@pytest.fixture
async def runner() -> AsyncIterator[SandboxedToolRunner]:
    async with open_tool_runner(tools=FACTORY, cancel_wait_s=10, stop_grace_s=2) as runner:
        yield runner


REGISTRY = tools("read_write")


def tool(name: str) -> Tool[Any]:
    found = REGISTRY.get(name)
    assert found is not None
    return found


def plan(tool: Tool[Any], input: ToolInput) -> CallPlan:
    """The plan the pipeline would make with the tool's own read-only check."""
    block = ToolUseBlock(id="t", name=tool.name, input=input.model_dump(mode="json"))
    return plan_call(block, tool, input, tool_assessor)


async def call(
    runner: SandboxedToolRunner,
    tool: Tool[Any],
    ctx: ToolContext,
    progress: Callable[[str], None] | None = None,
    **input: Any,
) -> ToolOutput:
    outputs = []
    async with closing_iter(runner.call(plan(tool, tool.parse_input(input)), ctx)) as events:
        async for event in events:
            if isinstance(event, ToolProgress):
                if progress is not None:
                    progress(event.text)
            else:
                outputs.append(event)
    assert len(outputs) == 1
    return outputs[0]


def descendants() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def command_lines() -> list[str]:
    """The command lines of our live descendants. A process may exit (and be a zombie until
    its parent reaps it) between listing and reading it: it has no command line then."""
    lines = []
    for proc in descendants():
        try:
            lines.append(" ".join(proc.cmdline()))
        except psutil.Error:
            continue
    return lines


def host_python(runner: SandboxedToolRunner, role: str) -> psutil.Process:
    """The host's Python process (inside bwrap, a descendant of the pid we spawned)."""
    spawned = psutil.Process(runner.host_pids()[role])  # type: ignore[index]
    for proc in [spawned, *spawned.children(recursive=True)]:
        if "workers.toolhost" in proc.cmdline() and "bwrap" not in proc.name():
            return proc
    raise AssertionError("no host python process found")


async def test_read_in_read_only_host_counts_for_edit_in_read_write_host(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path
) -> None:
    path = str(workspace / "a.txt")
    edit = tool("Edit")
    edit_input = edit.parse_input({"file_path": path, "old_string": "beta", "new_string": "gamma"})

    # Validation runs where the call would: in the read-write host.
    refusal = await runner.validate(plan(edit, edit_input), ctx)
    assert refusal is not None and "has not been read" in refusal
    assert set(runner.host_pids()) == {"read_write"}

    read = await call(runner, tool("Read"), ctx, file_path=path)
    assert "alpha" in str(read.content) and not read.is_error
    assert set(ctx.read_ledger.entries()) == {workspace / "a.txt"}

    assert await runner.validate(plan(edit, edit_input), ctx) is None
    edited = await call(runner, edit, ctx, **edit_input.model_dump())
    assert not edited.is_error, edited.content
    assert (workspace / "a.txt").read_text() == "alpha\ngamma\n"
    assert set(runner.host_pids()) == {"read_only", "read_write"}
    # The edit recorded the new mtime: a second edit needs no new read.
    assert ctx.read_ledger.entries()[workspace / "a.txt"] == os.stat(path).st_mtime_ns


async def test_a_call_sent_with_its_validation_takes_one_trip_and_a_refusal_runs_nothing(
    runner: SandboxedToolRunner,
    ctx: ToolContext,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []
    original = _Host.send

    async def spy(self: _Host, message: Any) -> None:
        sent.append(message.type)
        await original(self, message)

    monkeypatch.setattr(_Host, "send", spy)
    path = workspace / "a.txt"
    edit = tool("Edit")
    input = {"file_path": str(path), "old_string": "beta", "new_string": "gamma"}

    async def checked_call() -> list[Any]:
        events = []
        planned = plan(edit, edit.parse_input(input))
        async with closing_iter(runner.call(planned, ctx, validate=True)) as items:
            async for item in items:
                events.append(item)
        return events

    # Not read yet: refused by the validation, in the host; nothing ran, no result follows.
    refused = await checked_call()
    assert len(refused) == 1 and isinstance(refused[0], Checked)
    assert refused[0].refusal is not None and "has not been read" in refused[0].refusal
    assert path.read_text() == "alpha\nbeta\n"
    assert sent == ["run_tool"]

    await call(runner, tool("Read"), ctx, file_path=str(path))
    sent.clear()
    done = await checked_call()
    assert [type(event) for event in done] == [Checked, ToolOutput]
    assert done[0].refusal is None and not done[1].is_error, done[1].content
    assert path.read_text() == "alpha\ngamma\n"
    assert sent == ["run_tool"]  # one trip: validation and call
    # The host answered every message: it still serves calls, nothing is pending.
    again = await call(runner, tool("Read"), ctx, file_path=str(path))
    assert "gamma" in str(again.content)


async def test_the_pipeline_validates_with_the_call_only_where_nobody_is_asked(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path
) -> None:
    """An allowed call is validated in the host in the same trip as the call; a call that
    would be asked about is validated first, so nobody is asked about an invalid call; a
    refused call reports no decision and no start, whichever way it went."""
    events: list[Any] = []
    asked: list[str] = []

    async def asker(tool: Tool[Any], input: ToolInput, ask: Any) -> Any:
        asked.append(tool.name)
        return await headless_asker(tool, input, ask)

    validations: list[str] = []
    validate = runner.validate

    async def counting_validate(plan: CallPlan, ctx: ToolContext) -> str | None:
        validations.append(plan.block.name)
        return await validate(plan, ctx)

    runner.validate = counting_validate  # type: ignore[method-assign]
    path = str(workspace / "a.txt")
    edit = {"file_path": path, "old_string": "beta", "new_string": "gamma"}

    def pipeline(mode: Any) -> ToolPipeline:
        return ToolPipeline(
            tools=REGISTRY,
            ctx=ctx,
            permission=default_permission(mode),
            asker=asker,
            runner=runner,
            emit=events.append,
        )

    def kinds(tool_use_id: str) -> list[str]:
        return [
            type(event).__name__
            for event in events
            if getattr(event, "tool_use_id", None) == tool_use_id
        ]

    allowing, asking = pipeline("bypass"), pipeline("default")
    unread = await allowing.execute(
        allowing.prepare(ToolUseBlock(id="e1", name="Edit", input=edit))
    )
    assert unread.is_error and "has not been read" in unread.text()
    assert unread.text().startswith("<tool_use_error>")
    assert kinds("e1") == ["ToolFinished"]  # as when validation runs on its own

    unread = await asking.execute(asking.prepare(ToolUseBlock(id="e2", name="Edit", input=edit)))
    assert unread.is_error and "has not been read" in unread.text()
    assert asked == [] and validations == ["Edit"]  # validated first, never asked
    assert kinds("e2") == ["ToolFinished"]

    read = await allowing.execute(
        allowing.prepare(ToolUseBlock(id="r1", name="Read", input={"file_path": path}))
    )
    assert not read.is_error
    done = await allowing.execute(allowing.prepare(ToolUseBlock(id="e3", name="Edit", input=edit)))
    assert not done.is_error, done.text()
    assert (workspace / "a.txt").read_text() == "alpha\ngamma\n"
    assert kinds("e3") == ["PermissionDecided", "ToolStarted", "ToolFinished"]
    assert validations == ["Edit"]  # the allowed calls went in one trip each

    asked_edit = {"file_path": path, "old_string": "gamma", "new_string": "delta"}
    denied = await asking.execute(
        asking.prepare(ToolUseBlock(id="e4", name="Edit", input=asked_edit))
    )
    assert denied.is_error and asked == ["Edit"] and validations == ["Edit", "Edit"]
    assert (workspace / "a.txt").read_text() == "alpha\ngamma\n"


async def test_pipeline_runs_through_the_hosts(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path
) -> None:
    pipeline = ToolPipeline(
        tools=REGISTRY,
        ctx=ctx,
        permission=default_permission("bypass"),
        asker=headless_asker,
        runner=runner,
        emit=lambda event: None,
    )
    path = str(workspace / "a.txt")
    blocks = [
        ToolUseBlock(id="t1", name="Read", input={"file_path": path}),
        ToolUseBlock(id="t2", name="Write", input={"file_path": path, "content": "new\n"}),
        ToolUseBlock(id="t3", name="Fail", input={"how": "tool_error"}),
        ToolUseBlock(id="t4", name="Fail", input={"how": "exception"}),
        ToolUseBlock(id="t5", name="Fail", input={"how": "nothing"}),
    ]
    results = [await pipeline.execute(pipeline.prepare(b)) for b in blocks]
    assert [r.is_error for r in results] == [False, False, True, True, True]
    assert (workspace / "a.txt").read_text() == "new\n"
    assert results[2].content == "refused, for the model"
    assert "Fail failed unexpectedly: RuntimeError: boom" in results[3].text()
    assert "returned no result" in results[4].text()


async def test_tool_error_is_raised_like_in_process(
    runner: SandboxedToolRunner, ctx: ToolContext
) -> None:
    with pytest.raises(ToolError, match="refused, for the model"):
        await call(runner, tool("Fail"), ctx, how="tool_error")


async def test_stray_stdout_of_tools_does_not_corrupt_the_protocol(
    runner: SandboxedToolRunner, ctx: ToolContext
) -> None:
    """What tools print lands in the host's log (stderr), never on the protocol's stdout."""
    with structlog.testing.capture_logs() as logs:
        out = await call(runner, tool("Noisy"), ctx)
        assert out.content == "quiet now"

        def forwarded() -> set[str]:
            return {e.get("line", "") for e in logs if e["event"] == "host output"}

        with trio.fail_after(10):  # the logs travel on their own pipe: wait for them
            while len(forwarded()) < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert forwarded() == {"stray print from a tool", "stray output of a child"}
    assert not [e for e in logs if "malformed" in e["event"]]


async def test_an_output_over_the_line_cap_becomes_an_error_result(
    runner: SandboxedToolRunner, ctx: ToolContext
) -> None:
    out = await call(runner, tool("Noisy"), ctx, size=wire.MAX_LINE_BYTES + 1)
    assert out.is_error
    assert "too large to return" in str(out.content)
    again = await call(runner, tool("Think"), ctx, thought="still in sync")
    assert not again.is_error


async def test_misclassified_bash_cannot_write_in_the_read_only_host(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path, tmp_path: Path
) -> None:
    lying_bash = BashTool(classifier=lambda command: True)
    target = workspace / "pwned.txt"
    outside = tmp_path / "outside.txt"
    out = await call(
        runner,
        lying_bash,
        ctx,
        command=f"echo x > {target}; echo y > {outside}; rm -f {workspace / 'a.txt'}; echo done",
    )
    assert set(runner.host_pids()) == {"read_only"}
    assert "Read-only file system" in str(out.content)
    assert not target.exists()
    assert not outside.exists()
    assert (workspace / "a.txt").exists()


async def test_nothing_a_read_only_call_starts_outlives_it_in_the_host(
    runner: SandboxedToolRunner, ctx: ToolContext
) -> None:
    """The read-only host adopts its one-shots' orphans (sandbox.process.orphans): what a call
    left running with `setsid`, a double fork or `nohup` is gone when it returns, looked up on
    the host by a marker; the host keeps no zombie of them."""
    import secrets

    marker = f"1000.{secrets.randbelow(10**9):09d}"
    command = (
        f"setsid sleep {marker}1 >/dev/null 2>&1 &\n"
        f"( sleep {marker}2 >/dev/null 2>&1 & )\n"
        f"( setsid sleep {marker}3 >/dev/null 2>&1 & )\n"
        f"nohup sleep {marker}4 >/dev/null 2>&1 &\n"
        "echo started"
    )
    out = await call(runner, BashTool(classifier=lambda command: True), ctx, command=command)
    assert str(out.content).strip() == "started"
    assert set(runner.host_pids()) == {"read_only"}
    assert [line for line in command_lines() if marker in line] == []
    host = host_python(runner, "read_only")
    assert [p.pid for p in host.children() if p.status() == psutil.STATUS_ZOMBIE] == []


async def test_misclassified_tool_cannot_write_in_the_read_only_host(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path
) -> None:
    target = workspace / "pwned.txt"
    out = await call(runner, tool("WriteAnyway"), ctx, file_path=str(target))
    assert out.is_error
    assert "Read-only file system" in str(out.content)
    assert not target.exists()


async def test_read_write_host_writes_and_nothing_escapes_the_workspace(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path, tmp_path: Path
) -> None:
    in_tmp = tmp_path / "outside.txt"  # /tmp is a private tmpfs in the sandbox
    beside_tests = Path(__file__).with_name(f"outside-{os.getpid()}.txt")  # read-only there
    try:
        out = await call(
            runner,
            tool("Bash"),
            ctx,
            command=f"echo in > made.txt; echo out > {in_tmp}; echo out > {beside_tests}",
        )
        assert (workspace / "made.txt").read_text() == "in\n"
        assert not in_tmp.exists()
        assert not beside_tests.exists()
        assert "Read-only file system" in str(out.content)
    finally:
        beside_tests.unlink(missing_ok=True)


async def test_read_only_bash_starts_from_the_persistent_shell_state(
    runner: SandboxedToolRunner, ctx: ToolContext, workspace: Path
) -> None:
    bash = BashTool(classifier=lambda command: command.startswith(("pwd", "echo")))
    await call(runner, bash, ctx, command="cd sub && export GREETING=hi")
    out = await call(runner, bash, ctx, command="pwd; echo $GREETING")
    assert set(runner.host_pids()) == {"read_only", "read_write"}
    assert str(out.content).split() == [str(workspace / "sub"), "hi"]


async def test_concurrent_read_only_calls_overlap_in_one_host(
    runner: SandboxedToolRunner, ctx: ToolContext
) -> None:
    answers: list[str] = []

    async def meet() -> None:
        out = await call(runner, tool("Rendezvous"), ctx, key="k", count=4)
        answers.append(str(out.content))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(meet)
    assert answers == ["met"] * 4
    assert set(runner.host_pids()) == {"read_only"}


@pytest.mark.parametrize("victim", ["python", "bwrap"])
async def test_host_killed_mid_call_fails_the_call_and_a_fresh_host_takes_over(
    runner: SandboxedToolRunner, ctx: ToolContext, victim: str
) -> None:
    started = trio.Event()
    outputs: list[ToolOutput] = []

    async def hang() -> None:
        outputs.append(await call(runner, tool("Hang"), ctx, lambda _: started.set()))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            nursery.start_soon(hang)
            await started.wait()
            first_pid = runner.host_pids()["read_write"]
            doomed = host_python(runner, "read_write") if victim == "python" else None
            os.kill(doomed.pid if doomed else first_pid, signal.SIGKILL)
    assert len(outputs) == 2
    for out in outputs:
        assert out.is_error
        assert "tool host running this call died" in str(out.content)
        assert "may or may not have taken effect" in str(out.content)

    again = await call(runner, tool("Bash"), ctx, command="echo alive")
    assert str(again.content) == "alive"
    assert runner.host_pids()["read_write"] != first_pid
    assert not psutil.pid_exists(first_pid) or psutil.Process(first_pid).status() == "zombie"


async def test_cancelled_call_stops_in_the_host_and_leaves_no_process(
    ctx: ToolContext,
) -> None:
    marker = "sleep 312.5"
    async with open_tool_runner(tools=FACTORY) as runner:
        with trio.move_on_after(30) as scope:  # the bound of a broken test, not a timing
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    await call(runner, tool("Bash"), ctx, command=marker)

                nursery.start_soon(run)
                # Another process's state has no event to wait on: poll it.
                while not any(marker in line for line in command_lines()):  # noqa: ASYNC110
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        # Cancel was answered: the command is gone while the host lives on.
        assert not any(marker in line for line in command_lines())
        host = psutil.Process(runner.host_pids()["read_write"])
        assert host.is_running()
        out = await call(runner, tool("Bash"), ctx, command="echo still here")
        assert str(out.content) == "still here"
    assert descendants() == []


async def test_runner_exit_leaves_no_process_behind(ctx: ToolContext) -> None:
    async with open_tool_runner(tools=FACTORY, prestart=ctx) as runner:
        await call(runner, tool("Bash"), ctx, command="sleep 1000 & echo started")
        await runner.start(ctx)  # waits for the prestarted read-only host
        assert len(runner.host_pids()) == 2
    assert descendants() == []


async def test_hosts_are_out_of_the_terminals_process_group(ctx: ToolContext) -> None:
    async with open_tool_runner(tools=FACTORY) as runner:
        await runner.start(ctx)
        for pid in runner.host_pids().values():
            assert os.getpgid(pid) != os.getpgid(0)


async def test_a_host_that_cannot_start_is_an_error_result(ctx: ToolContext) -> None:
    async with open_tool_runner(spawner=failing_spawner) as runner:
        out = await call(runner, tool("Think"), ctx, thought="x")
        assert out.is_error
        assert "exited before it was ready (exit status 1)" in str(out.content)
        with pytest.raises(ToolHostError, match="exited before it was ready"):
            await runner.start(ctx)
        with pytest.raises(ToolHostError, match="exited before it was ready"):
            edit = tool("Edit")
            await runner.validate(
                plan(
                    edit,
                    edit.parse_input({"file_path": "/x", "old_string": "a", "new_string": "b"}),
                ),
                ctx,
            )


class _CoordinatorThink(ThinkTool):
    """A tool that declares it runs in the coordinator (as dispatch_agent does)."""

    facts = ToolFacts(family="meta", runs_in_coordinator=True)


async def test_tools_that_declare_it_run_in_the_coordinator(ctx: ToolContext) -> None:
    async with open_tool_runner(spawner=failing_spawner) as runner:
        local = _CoordinatorThink()
        out = await call(runner, local, ctx, thought="x")
        assert not out.is_error
        assert await runner.validate(plan(local, local.parse_input({"thought": "y"})), ctx) is None
        assert runner.host_pids() == {}


def test_registry_of_test_tools_is_a_superset_of_the_builtins() -> None:
    assert {"Read", "Edit", "Bash", "Think"} <= set(ToolRegistry(REGISTRY).names())


@pytest.mark.parametrize("made_by", ["the agent", "someone else"])
async def test_a_denied_file_created_after_the_hosts_started_is_hidden_from_bash(
    ctx: ToolContext, workspace: Path, made_by: str
) -> None:
    """Read deny rules become masks when a sandbox starts. A file they cover that appears
    later (written by a writable call, or by anyone while the hosts run) makes the runner
    replace the hosts before the next read, so `cat` and `grep -r` in the read-only host
    cannot read it; the model is told the shell started afresh."""
    from workers.toolhost_runner import SandboxedSpawner

    def denied(path: str) -> bool:
        return path.endswith("/.env")

    secret = "TOKEN-" + os.urandom(6).hex()
    async with open_tool_runner(
        tools=FACTORY, spawner=SandboxedSpawner(read_denied=denied), stop_grace_s=2
    ) as runner:
        await runner.start(ctx)
        if made_by == "the agent":
            wrote = await call(runner, tool("Bash"), ctx, command=f"echo {secret} > .env")
            assert not wrote.is_error
            assert "restarted the tool sandboxes" in str(wrote.content)
        else:
            (workspace / ".env").write_text(secret)
        reader = BashTool(classifier=lambda command: True)
        out = await call(runner, reader, ctx, command="cat .env; grep -r TOKEN- . ; echo done")
        assert secret not in str(out.content)
        assert "done" in str(out.content)
        if made_by == "someone else":
            assert "restarted the tool sandboxes" in str(out.content)
        # Still hidden on later calls, from both hosts.
        again = await call(runner, tool("Bash"), ctx, command="cat .env; echo done")
        assert secret not in str(again.content)
    assert (workspace / ".env").read_text().strip() == secret  # the user's file is untouched


def test_an_unsandboxed_host_gets_no_credentials() -> None:
    """A `sandbox = false` MCP server or hook host runs outside the floor with a short
    allowlist of the coordinator's environment: no API key, no Ray cluster credentials."""
    coordinator = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "ANTHROPIC_API_KEY": "sk-ant",
        "RAY_AUTH_TOKEN": "ray-token",
        "RAY_AUTH_MODE": "token",
        "RAY_ADDRESS": "10.0.0.5:6379",
    }
    assert host_environment(coordinator) == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
