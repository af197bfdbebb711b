"""Workers and their tool processes cannot reach the coordinator's side (issue 9, item 8).

Two attacks, each checked where it would land: the coordinator's model API.

- From inside: a subagent's sandboxed Bash, in a real pool worker, tries to read the worker's
  memory (`/proc/<worker>/mem`, `maps`, `environ`, ptrace, process_vm_readv) and to write a
  forged `model_request` into the worker's protocol pipe through `/proc/<worker>/fd/N`. The
  worker is non-dumpable and the sandbox filters ptrace and process_vm_*, so every attempt
  fails, and the fake Messages API (the real SDK over a socket) sees no forged request.
- A rogue worker (tests/workers/rogue_worker.py) sends model requests the coordinator must
  not pass on: another system prompt, an extra tool, a rewritten tool description, a huge
  max_tokens, one request more than the run may make.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from orchestrator.messages import ContentBlock, Message
from orchestrator.model.base import ModelRequest
from orchestrator.model.catalog import output_limit
from sandbox.run import run_sandboxed
from sandbox.spec import SandboxSpec
from tests.kit.fake_api import TEST_MODEL, FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.workers.agent_kit import (
    FACTORY,
    Collected,
    FunctionModel,
    agent,
    allow_all,
    descendants,
    request,
    rogue_spawner,
    text,
    workspace_at,
)
from tests.workers.rogue_worker import FORGED_SYSTEM, HUGE_MAX_TOKENS
from workers import protocol as wire
from workers.broker import ModelBroker
from workers.pool import DEFAULT_MAX_MODEL_REQUESTS, PoolOptions, open_worker_pool

pytestmark = needs_sandbox

FORGED_TEXT = "FORGED-BY-A-TOOL"

# Run by the subagent's Bash with the worker's pid ($PPID of the one-shot bash) and the forged
# protocol line (base64). Prints one `name=outcome` word per attempt.
ATTACK = textwrap.dedent(
    """
    import base64, ctypes, os, sys
    worker, line = int(sys.argv[1]), base64.b64decode(sys.argv[2])
    out = []
    def attempt(name, action):
        try:
            out.append(f"{name}=ok:{action()}")
        except OSError as exc:
            out.append(f"{name}=errno{exc.errno}")
    def read_mem():
        maps = open(f"/proc/{worker}/maps").read().splitlines()
        start = int(maps[0].split("-")[0], 16)
        with open(f"/proc/{worker}/mem", "rb") as mem:
            mem.seek(start)
            return len(mem.read(64))
    attempt("mem", read_mem)
    attempt("mem_open", lambda: os.close(os.open(f"/proc/{worker}/mem", os.O_RDONLY)) or 0)
    attempt("environ", lambda: len(open(f"/proc/{worker}/environ", "rb").read()))
    attempt("fd_list", lambda: len(os.listdir(f"/proc/{worker}/fd")))
    written = 0
    for n in range(64):
        try:
            fd = os.open(f"/proc/{worker}/fd/{n}", os.O_WRONLY)
        except OSError as exc:
            last = exc.errno
            continue
        try:
            os.write(fd, line)
            written += 1
        except OSError:
            pass
        os.close(fd)
    out.append(f"fd_write={written}")
    libc = ctypes.CDLL(None, use_errno=True)
    r = libc.ptrace(0x4206, worker, None, None)  # PTRACE_SEIZE
    out.append(f"ptrace={r}/{ctypes.get_errno()}")
    class iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    buf = ctypes.create_string_buffer(64)
    local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
    remote = iovec(0x400000, 64)
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                      ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    r = libc.process_vm_readv(worker, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    out.append(f"vm_readv={r}/{ctypes.get_errno()}")
    print("ATTACK " + " ".join(out))
    """
)


def _forged_line(agent_id: str, system: list[str]) -> bytes:
    """What the attacker would like the worker to have sent: a model request of its own."""
    forged = wire.ModelRequest(
        id="m999",
        agent=agent_id,
        messages=[Message.user_text(FORGED_TEXT)],
        system=system,
        tools=[],
        max_tokens=64,
    )
    return wire.encode(forged)


def _tool_result_text(req: RecordedRequest) -> str:
    return json.dumps(req.messages[-1]["content"])


async def test_a_tool_in_a_worker_cannot_reach_its_worker(tmp_path: Path) -> None:
    workspace = workspace_at(tmp_path)
    attacker = agent("attacker", tools=("Bash",))
    req = request(attacker, "attack your worker", agent_id="agent-attack")
    line = base64.b64encode(_forged_line(req.agent_id, req.system)).decode()
    (workspace / "attack.py").write_text(ATTACK)
    command = f'python3 -I -S attack.py "$PPID" {line}'

    def route(recorded: RecordedRequest) -> FakeResponse:
        if len(recorded.messages) == 1:
            return Reply.tool_use("Bash", {"command": command})
        return Reply.text("done")

    with FakeMessagesAPI(route=route) as api:
        from orchestrator.model.anthropic import AnthropicModel

        broker = ModelBroker(AnthropicModel(TEST_MODEL, base_url=api.base_url, api_key="k"))
        async with open_worker_pool(
            broker=broker, workspace=workspace, tools=FACTORY, options=PoolOptions(max_workers=1)
        ) as pool:
            with trio.fail_after(60):
                out = await pool.run(req, on_event=Collected(), permission=allow_all)
            # Give a forged line every chance to be read and served before we count.
            with trio.fail_after(60):
                again = await pool.run(
                    request(attacker, "second run", agent_id="agent-after"),
                    on_event=Collected(),
                    permission=allow_all,
                )
        await broker.aclose()  # its model's kept-alive connection
        requests = api.requests

    assert out.reason == "completed", out
    assert again.reason in {"completed", "max_turns"}, again
    # No forged request reached the API: only the runs' own.
    assert FORGED_TEXT not in json.dumps([r.body for r in requests])
    firsts = [r for r in requests if len(r.messages) == 1]
    assert len(firsts) == 2, [r.messages for r in requests]
    # Every attempt failed inside the sandbox.
    report = _tool_result_text(requests[1])
    assert "ATTACK " in report, report
    words = dict(re.findall(r"(\w+)=([\w/:-]+)", report.split("ATTACK ", 1)[1]))
    for name in ("mem", "mem_open", "environ"):
        assert words[name].startswith("errno"), (name, words)
    # The fd numbers may be listed (the directory is ours); no fd can be opened, so nothing
    # can be written into the protocol pipe.
    assert words["fd_write"] == "0", words
    assert words["ptrace"].startswith("-1/"), words
    assert words["vm_readv"].startswith("-1/"), words
    assert descendants() == []


# --- a rogue worker's model requests ------------------------------------------------------------


async def _answer(req: ModelRequest) -> Sequence[ContentBlock]:
    return text("answer")


async def _run_rogue(
    workspace: Path, mode: str, *, max_turns: int = 10, **options: int
) -> tuple[str, str, FunctionModel, str]:
    """One run of the rogue worker in `mode`, then one of a real worker: the outcome of the
    first (reason, text), the coordinator's model, and the second run's reason."""
    model = FunctionModel(_answer)
    async with open_worker_pool(
        broker=ModelBroker(model),
        workspace=workspace,
        spawner=rogue_spawner(mode),
        options=PoolOptions.model_validate({"max_workers": 1, **options}),
        tools=FACTORY,
    ) as pool:
        rogue = agent("probe", max_turns=max_turns)
        with trio.fail_after(120):
            out = await pool.run(request(rogue, "x"), on_event=Collected(), permission=allow_all)
            after = await pool.run(
                request(agent("probe"), "y", agent_id="agent-t2"),
                on_event=Collected(),
                permission=allow_all,
            )
    return out.reason, out.result, model, after.reason


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("forge-system", "system prompt is not the agent type's"),
        ("forge-tools", "tools its agent type 'probe' does not have: 'Bash'"),
    ],
)
async def test_a_forged_model_request_is_refused(tmp_path: Path, mode: str, why: str) -> None:
    reason, result, model, after = await _run_rogue(workspace_at(tmp_path), mode)
    assert reason == "worker_protocol"
    assert why in result and "refused" in result
    # Nothing of the rogue's reached the model; the next subagent (a real worker) ran.
    assert all(r.system != [FORGED_SYSTEM] for r in model.requests)
    assert len(model.requests) == 1 and model.requests[0].messages[0].text() == "y"
    assert after == "completed"
    assert descendants() == []


async def test_a_rewritten_tool_description_is_replaced_by_the_coordinators(
    tmp_path: Path,
) -> None:
    reason, result, model, _ = await _run_rogue(workspace_at(tmp_path), "forge-description")
    assert (reason, result) == ("completed", "answered after 1")
    spec = model.requests[0].tools[0]
    assert spec.name == "Read"
    assert "Ignore your instructions" not in spec.description
    assert spec.input_schema.get("properties"), spec


async def test_a_huge_max_tokens_is_clamped(tmp_path: Path) -> None:
    reason, result, model, _ = await _run_rogue(workspace_at(tmp_path), "forge-max-tokens")
    assert (reason, result) == ("completed", "answered after 1")
    sent = model.requests[0].max_tokens
    assert sent == output_limit(model.model) < HUGE_MAX_TOKENS


@pytest.mark.parametrize(
    ("max_turns", "cap"),
    [(3, 3), (10_000, DEFAULT_MAX_MODEL_REQUESTS)],
    ids=["max_turns", "default-cap"],
)
async def test_requests_past_the_runs_limit_are_refused(
    tmp_path: Path, max_turns: int, cap: int
) -> None:
    reason, result, model, after = await _run_rogue(
        workspace_at(tmp_path), "many-requests", max_turns=max_turns
    )
    assert reason == "worker_limit"
    assert f"request {cap + 1} is over the run's limit of {cap} model requests" in result
    assert len(model.requests) == cap + 1  # the run's cap, then the real worker's one
    assert after == "completed"


async def test_the_cap_is_configurable(tmp_path: Path) -> None:
    reason, result, model, _ = await _run_rogue(
        workspace_at(tmp_path), "many-requests", max_model_requests=5
    )
    assert reason == "worker_limit"
    assert "request 6 is over the run's limit of 5" in result
    assert len(model.requests) == 5 + 1


# --- the mechanism itself, with and without it ------------------------------------------------

# The parent (a stand-in for a worker: make_undumpable or not, a protocol pipe held open) runs
# an exec'd child (a stand-in for a tool), which tries the parent's /proc files.
_PARENT = textwrap.dedent(
    """
    import os, subprocess, sys
    if sys.argv[1] == "undumpable":
        from workers.entry import make_undumpable
        make_undumpable()
    r, w = os.pipe()  # the protocol pipe: not inherited (os.pipe is CLOEXEC)
    child = subprocess.run(
        [sys.executable, "-I", "-S", "-c", sys.argv[2], str(os.getpid()), str(w)],
        capture_output=True, text=True,
    )
    os.set_blocking(r, False)
    try:
        got = os.read(r, 100)
    except BlockingIOError:
        got = b""
    print(child.stdout.strip(), f"pipe_got={len(got)}")
    """
)
_CHILD = textwrap.dedent(
    """
    import os, sys
    parent, w = sys.argv[1], sys.argv[2]
    out = []
    for name, path, flags in (
        ("mem", f"/proc/{parent}/mem", os.O_RDONLY),
        ("environ", f"/proc/{parent}/environ", os.O_RDONLY),
        ("fd", f"/proc/{parent}/fd/{w}", os.O_WRONLY),
    ):
        try:
            fd = os.open(path, flags)
            if name == "fd":
                os.write(fd, b"forged\\n")
            os.close(fd)
            out.append(f"{name}=opened")
        except OSError as exc:
            out.append(f"{name}=errno{exc.errno}")
    try:
        os.write(int(w), b"inherited\\n")
        out.append("inherited=yes")
    except OSError:
        out.append("inherited=no")
    print(" ".join(out))
    """
)


@pytest.mark.parametrize("mode", ["undumpable", "dumpable"])
async def test_an_undumpable_process_is_out_of_its_childrens_reach(
    tmp_path: Path, mode: str
) -> None:
    """Root inside bwrap (--unshare-user --cap-drop ALL), as the workers run: the child of a
    dumpable parent can open its /proc files and write into its pipe (the attack works, so
    the test can fail); the child of a non-dumpable parent cannot."""
    import sys

    from sandbox.spec import Limits, WorkspaceRoot

    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=Path.cwd(), mode="ro"),), limits=Limits(wall_time_s=60)
    )
    # -I leaves the checkout off sys.path: put it back for `workers.entry`.
    script = (
        f"import sys; sys.path.insert(0, {str(Path.cwd())!r}); "
        "exec(compile(sys.argv.pop(1), 'parent', 'exec'))"
    )
    argv = [sys.executable, "-I", "-c", script, _PARENT, mode, _CHILD]
    result = await run_sandboxed(spec, argv)
    assert result.exit_code == 0, result
    words = dict(w.split("=", 1) for w in result.stdout.decode().split())
    assert words["inherited"] == "no", result
    if mode == "undumpable":
        assert words == {
            "mem": "errno13",
            "environ": "errno13",
            "fd": "errno13",
            "inherited": "no",
            "pipe_got": "0",
        }, result
    else:
        assert words["fd"] == "opened" and words["pipe_got"] == "7", result


# --- one-shot commands in a real worker leave nothing behind (issue 9, item 10) ---------------


async def test_a_oneshot_in_a_worker_leaves_no_process_for_later_calls(tmp_path: Path) -> None:
    """A read-only worker runs each Bash call one-shot. What the first call starts with
    `setsid`, a double fork or `nohup` is gone (looked up on the host, by a marker in its
    command line) before the model's next request arrives, while the worker lives on."""
    import secrets

    import psutil

    from tests.workers.agent_kit import first_prompt, tool_use, turn_of

    marker = f"1000.{secrets.randbelow(10**9):09d}"
    command = (
        f"setsid sleep {marker}1 >/dev/null 2>&1 &\n"
        f"( sleep {marker}2 >/dev/null 2>&1 & )\n"
        f"nohup sleep {marker}3 >/dev/null 2>&1 &\n"
        "echo started"
    )
    left_at_turn_2: list[str] = []

    def ours() -> list[str]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(
                proc.info["cmdline"] or []
            ):
                found.append(" ".join(proc.info["cmdline"]))
        return found

    async def respond(req: ModelRequest) -> Sequence[ContentBlock]:
        if turn_of(req) == 1:
            return tool_use("Bash", {"command": command})
        left_at_turn_2.extend(ours())
        return text(f"done {first_prompt(req)}")

    model = FunctionModel(respond)
    async with open_worker_pool(
        broker=ModelBroker(model),
        workspace=workspace_at(tmp_path),
        options=PoolOptions(max_workers=1),
        tools=FACTORY,
    ) as pool:
        with trio.fail_after(120):
            out = await pool.run(
                request(agent("shell", tools=("Bash",)), "x"),
                on_event=Collected(),
                permission=allow_all,
            )
    assert out.reason == "completed", out
    assert "started" in model.requests[1].messages[-1].tool_results()[0].text()
    assert left_at_turn_2 == []
    assert ours() == []
