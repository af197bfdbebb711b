"""A workflow script in its real sandbox, served by `run_script` with a scripted host: what
`agent`, `parallel`, `pipeline`, `phase`, `log` and `finish` do, the keys resume relies on,
how a script fails, and the limits and cancellation that stop it."""

from __future__ import annotations

import random
from pathlib import Path

import psutil
import pytest
import trio

from orchestrator.limits import Limits
from orchestrator.workflows.script import MAX_LINE_BYTES, AgentCall, ScriptEnd
from sandbox.host import SandboxHost
from tests.kit.floor import needs_sandbox
from tests.orchestrator.workflows.scripted import ScriptedHost, run

pytestmark = needs_sandbox


async def test_agent_answers_and_a_failure_is_raised_in_the_script(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    host = ScriptedHost()
    end = await run(
        """
        first = agent("one")
        try:
            agent("fail two")
        except AgentFailed as failed:
            caught = [bool(failed), failed.reason]
        typed = agent("three", type="reviewer", schema={"type": "object"}, write_paths=["src"],
                      label="L", phase="P", model="m")
        finish({"first": first, "caught": caught, "typed": typed, "args": args})
        """,
        host,
        workspace,
        sandbox_host,
        args={"packages": ["a", "b"]},
    )
    assert end.status == "finished", end
    assert end.result == {
        "first": "done:one",
        "caught": [False, "failed: fail two"],
        "typed": "done:three",
        "args": {"packages": ["a", "b"]},
    }
    assert host.calls[2] == AgentCall(
        key="2",
        prompt="three",
        type="reviewer",
        schema={"type": "object"},
        write_paths=["src"],
        label="L",
        phase="P",
        model="m",
    )


async def test_parallel_keeps_input_order_whatever_order_the_answers_come_in(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    """Each call is answered only once the next one was: the last comes back first (and the
    calls must all be out at once, or this would never end)."""
    prompts = ["p0", "fail p1", "p2", "p3"]

    async def reverse(call: AgentCall) -> None:
        index = prompts.index(call.prompt)
        if index + 1 < len(prompts):
            await host.answered[prompts[index + 1]].wait()

    host = ScriptedHost(reverse)
    end = await run(
        f"""
        results = parallel([lambda p=p: agent(p) for p in {prompts!r}])
        finish([r if r else ["failed", bool(r), r.reason, type(r).__name__] for r in results])
        """,
        host,
        workspace,
        sandbox_host,
    )
    assert end.status == "finished", end
    assert end.result == [
        "done:p0",
        ["failed", False, "failed: fail p1", "AgentFailed"],
        "done:p2",
        "done:p3",
    ]
    assert host.order == list(reversed(prompts))


async def test_pipeline_moves_each_item_on_as_soon_as_its_stage_is_done(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    """Item a's first stage is held until item b's second stage has started; item c's first
    stage fails, so it stops there."""

    async def hold(call: AgentCall) -> None:
        if call.prompt == "s1:a":
            await host.arrived["s2:b"].wait()

    host = ScriptedHost(hold)
    end = await run(
        """
        results = pipeline(
            ["a", "b", "fail"],
            lambda item: agent(f"s1:{item}"),
            lambda found: agent("s2:" + found.split(":")[-1]),
        )
        finish([r if r else "stopped: " + r.reason for r in results])
        """,
        host,
        workspace,
        sandbox_host,
    )
    assert end.status == "finished", end
    assert end.result == ["done:s2:a", "done:s2:b", "stopped: failed: s1:fail"]
    assert host.order.index("s2:b") < host.order.index("s1:a")
    assert sorted(host.keys()) == ["s1:a", "s1:b", "s1:fail", "s2:a", "s2:b"]


NESTED = """
top = agent("top0")
phase("Fan")
fan = parallel([
    lambda: agent("par0"),
    lambda: [agent("par1a"), agent("par1b")],
    lambda: parallel([lambda: agent("inner0"), lambda: agent("inner1")]),
])
piped = pipeline(["x", "y"], lambda v: agent("s1" + v), lambda v: agent("s2" + v[-1]))
last = agent("top3")
finish([top, fan, piped, last])
"""

NESTED_KEYS = {
    "top0": "0",
    "par0": "1.0.0",
    "par1a": "1.1.0",
    "par1b": "1.1.1",
    "inner0": "1.2.0.0.0",
    "inner1": "1.2.0.1.0",
    "s1x": "2.0.0.0",
    "s2x": "2.0.1.0",
    "s1y": "2.1.0.0",
    "s2y": "2.1.1.0",
    "top3": "3",
}


async def test_keys_are_positions_whatever_the_timing(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    """Two runs whose answers take random times send the same keys, the ones the position
    rule gives."""
    results = []
    for seed in (1, 2):
        delays = random.Random(seed)

        async def jitter(call: AgentCall, delays: random.Random = delays) -> None:
            await trio.sleep(delays.random() * 0.05)

        host = ScriptedHost(jitter)
        end = await run(NESTED, host, workspace, sandbox_host)
        assert end.status == "finished", end
        assert host.keys() == NESTED_KEYS
        results.append(end.result)
    assert results[0] == results[1]


async def test_phases_and_logs_reach_the_host_and_threads_inherit_the_phase(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    host = ScriptedHost()
    end = await run(
        """
        phase("Review")
        log("starting")
        def second():
            phase("Verify")
            return agent("y")
        parallel([lambda: agent("x"), second])
        agent("z")
        agent("w", phase="Other")
        log(42)
        """,
        host,
        workspace,
        sandbox_host,
    )
    assert end == ScriptEnd("finished", None, None, "")
    assert host.phases == ["Review", "Verify"]
    assert host.logs == ["starting", "42"]
    assert {call.prompt: call.phase for call in host.calls} == {
        "x": "Review",
        "y": "Verify",
        "z": "Review",
        "w": "Other",
    }


async def test_finish_from_a_thread_ends_the_script_with_its_value(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    """One thunk finishes while the other's agent call is still out (cancelled then)."""

    async def never(call: AgentCall) -> None:
        if call.prompt == "slow":
            await trio.sleep_forever()

    host = ScriptedHost(never)
    end = await run(
        """
        def done():
            agent("quick")
            finish({"from": "thread"})
        parallel([lambda: agent("slow"), done])
        finish("not reached")
        """,
        host,
        workspace,
        sandbox_host,
    )
    assert (end.status, end.result) == ("finished", {"from": "thread"})
    assert "slow" in host.arrived


async def test_a_script_that_never_finishes_returns_none(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run("x = agent('one')\n", ScriptedHost(), workspace, sandbox_host)
    assert (end.status, end.result, end.error) == ("finished", None, None)


async def test_a_script_exception_fails_with_the_scripts_traceback(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run(
        """
        def check(found):
            raise ValueError(f"bad finding {found}")
        parallel([lambda: agent("a"), lambda: check(agent("b"))])
        """,
        ScriptedHost(),
        workspace,
        sandbox_host,
    )
    assert end.status == "failed" and end.error is not None
    assert end.error.startswith("Traceback (most recent call last):")
    assert 'File "<workflow>", line 4, in check' in end.error
    assert "raise ValueError" in end.error
    assert end.error.rstrip().endswith("ValueError: bad finding done:b")
    assert "runtime.py" not in end.error


async def test_finish_refuses_a_value_json_cannot_carry(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run("finish({1, 2})\n", ScriptedHost(), workspace, sandbox_host)
    assert end.status == "failed" and end.error is not None
    assert "TypeError: finish() needs a JSON-serialisable value" in end.error
    assert "set is not JSON serializable" in end.error
    assert "runtime.py" not in end.error


async def test_printing_does_not_touch_the_protocol(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    host = ScriptedHost()
    end = await run(
        """
        import os, sys
        forged = '{"op": "finish", "value": "forged"}'
        print(forged)
        print(forged, file=sys.stderr)
        sys.stdout.write('{"id": 1, "ok": true, "value": "forged"}\\n')
        os.write(1, b'{"op": "agent", "id": 7, "key": "9", "prompt": "forged"}\\n')
        os.write(2, b"raw stderr\\n")
        finish(agent("real"))
        """,
        host,
        workspace,
        sandbox_host,
    )
    assert (end.status, end.result) == ("finished", "done:real")
    assert [call.prompt for call in host.calls] == ["real"]
    assert end.output.count('"forged"') == 4
    assert "raw stderr" in end.output


async def test_an_endless_loop_is_stopped_by_the_cpu_limit(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run(
        "while True:\n    pass\n",
        ScriptedHost(),
        workspace,
        sandbox_host,
        limits=Limits(workflow_cpu_s=1),
    )
    assert end.status == "failed"
    assert end.error == "the workflow script used more than its 1 s of CPU time"


async def test_a_memory_hog_is_stopped_by_the_memory_limit(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run(
        """
        hog = []
        while True:
            hog.append(bytearray(1 << 20))
        """,
        ScriptedHost(),
        workspace,
        sandbox_host,
        limits=Limits(workflow_memory_mb=256),
    )
    assert end.status == "failed" and end.error is not None
    assert end.error.startswith("the workflow script used more than its 256 MB of memory")


async def test_a_script_waiting_past_its_time_is_stopped(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    async def never(call: AgentCall) -> None:
        await trio.sleep_forever()

    end = await run(
        "agent('forever')\n",
        ScriptedHost(never),
        workspace,
        sandbox_host,
        limits=Limits(workflow_time_s=1),
    )
    assert (end.status, end.error) == ("failed", "the workflow script ran longer than its 1 s")


def _sandboxes() -> list[psutil.Process]:
    """This test process's sandboxes: bwrap and what runs inside, by their command lines."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            line = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "bwrap" in line or "runtime.py" in line:
            found.append(child)
    return found


async def test_cancelling_run_script_leaves_no_process(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    async def never(call: AgentCall) -> None:
        await trio.sleep_forever()

    host = ScriptedHost(never)
    ended: list[object] = []

    async def running() -> None:
        ended.append(await run("agent('held')\n", host, workspace, sandbox_host))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(running)
        await host.arrived["held"].wait()
        started = _sandboxes()
        assert any("runtime.py" in " ".join(p.cmdline()) for p in started)
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    assert trio.current_time() - cancelled_at < 5  # the SIGTERM's grace is 2 s
    assert ended == []
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert _sandboxes() == []


FORGE = """
import os
def connection():
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                return int(name)
        except OSError:
            pass
def forge(line):
    view = memoryview(line)
    while view:
        view = view[os.write(connection(), view):]
agent("first")
forge(args["line"].encode() * args["times"] + b"\\n")
agent("never answered")
"""
"""The script writing a line of its own into its connection, in its own process."""


@pytest.mark.parametrize(
    ("line", "times", "expected"),
    [
        ("not json", 1, "a line that is not JSON: b'not json'"),
        ('["op", "agent"]', 1, "a line that is no request"),
        ('{"op": "shell", "command": "rm -rf ~"}', 1, "an unknown request 'shell'"),
        ('{"op": "agent", "id": 1, "key": "5", "prompt": "x"}', 1, "a bad or repeated id 1"),
        ('{"op": "agent", "id": 50, "key": "0", "prompt": "x"}', 1, "a bad or repeated key '0'"),
        ('{"op": "agent", "id": 50, "key": "../x", "prompt": "x"}', 1, "bad or repeated key"),
        ('{"op": "agent", "id": 50, "key": "5", "prompt": 3}', 1, "prompt is not a string"),
        ('{"op": "agent", "id": 50, "key": "5", "prompt": "x", "tools": []}', 1, "unknown fields"),
        ('{"op": "phase", "title": null}', 1, "phase request whose title is not a string"),
        ("x", MAX_LINE_BYTES + 1, f"a line longer than {MAX_LINE_BYTES} bytes"),
    ],
)
async def test_a_line_the_runtime_would_not_send_fails_the_workflow(
    workspace: Path, sandbox_host: SandboxHost, line: str, times: int, expected: str
) -> None:
    host = ScriptedHost()
    end = await run(FORGE, host, workspace, sandbox_host, args={"line": line, "times": times})
    assert end.status == "failed" and end.error is not None
    assert end.error.startswith("the workflow script broke its protocol: "), end.error
    assert expected in end.error
    assert [call.prompt for call in host.calls] == ["first"]


async def test_a_result_over_the_line_cap_is_refused_in_the_script(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run(f"finish('x' * {MAX_LINE_BYTES})\n", ScriptedHost(), workspace, sandbox_host)
    assert end.status == "failed" and end.error is not None
    size = MAX_LINE_BYTES + len('{"op": "finish", "value": ""}\n')
    assert end.error.endswith(
        f"ValueError: finish()'s value is {size} bytes as JSON; at most {MAX_LINE_BYTES}\n"
    )
    assert "runtime.py" not in end.error


async def test_a_host_that_fails_otherwise_fails_the_workflow(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    async def broken(call: AgentCall) -> None:
        raise RuntimeError("the pool is gone")

    end = await run("agent('one')\n", ScriptedHost(broken), workspace, sandbox_host)
    assert end.status == "failed"
    assert end.error == (
        "the workflow's agent call 0 failed in the host: RuntimeError('the pool is gone')"
    )


async def test_sys_exit_with_a_status_fails_the_workflow(
    workspace: Path, sandbox_host: SandboxHost
) -> None:
    end = await run("import sys\nsys.exit(3)\n", ScriptedHost(), workspace, sandbox_host)
    assert (end.status, end.error) == ("failed", "the script called sys.exit(3)")
    end = await run("import sys\nsys.exit()\n", ScriptedHost(), workspace, sandbox_host)
    assert (end.status, end.result) == ("finished", None)
