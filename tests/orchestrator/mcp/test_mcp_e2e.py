"""MCP servers end to end: the real `warren` CLI against the fake Messages API, real
third-party servers from PyPI (`mcp-server-time`, `mcp-server-git`) and a hostile one
(tests/kit/hostile_mcp_server.py, standard library only, so its many starts stay cheap), each
started by Warren inside bubblewrap.

Every test checks the host afterwards: the servers ran in other namespaces, they are gone
when the run ends, and what the hostile server tried did not happen.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from policies.trust import TrustStore
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
BIN = Path(sys.executable).parent


pytestmark = needs_sandbox

HOSTILE = Path(__file__).resolve().parents[2] / "kit" / "hostile_mcp_server.py"


@pytest.fixture
def home() -> Iterator[Path]:
    """A fake HOME outside /tmp (every sandbox has a private /tmp) holding a secret."""
    path = Path(tempfile.mkdtemp(prefix="warren-mcp-home-", dir="/var/tmp"))
    (path / ".ssh").mkdir()
    (path / ".ssh" / "id_rsa").write_text("SECRET-KEY-MATERIAL\n")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hostile() -> Iterator[Path]:
    """The hostile server's script, outside /tmp (the sandbox's /tmp is its own)."""
    path = Path(tempfile.mkdtemp(prefix="warren-mcp-server-", dir="/var/tmp"))
    shutil.copy(HOSTILE, path / "hostile.py")
    try:
        yield path / "hostile.py"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="warren-mcp-outside-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hi\n")
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *args], cwd=ws, check=True)
    return ws


def _user_policy(config: Path, text: str) -> None:
    (config / "warren").mkdir(parents=True, exist_ok=True)
    (config / "warren" / "policy.toml").write_text(text)


def _run(
    ws: Path,
    tmp_path: Path,
    api: FakeMessagesAPI,
    home: Path | None = None,
    prompt: str = "go",
    mode: str = "bypass",
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-mcp",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        **extra,
    }
    if home is not None:
        env["HOME"] = str(home)
    args = ["-p", prompt, "--cwd", str(ws), "--output-format", "stream-json"]
    return subprocess.run(
        [*WARREN, *args, "--permission-mode", mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _results(stdout: str) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in stdout.splitlines()]
    return [
        block
        for event in events
        if event["type"] == "user"
        for block in event["message"]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def _servers_named(word: str, workspace: Path | None = None) -> list[psutil.Process]:
    """Processes whose command line has `word`; with a `workspace`, only those of sandboxes
    that mount it (another test may run the same server at the same time, and a run may go
    through a warm server, so they are not our children)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or ()
        if not any(word in part for part in cmdline):
            continue
        if workspace is not None and not _in_sandbox_of(proc, str(workspace)):
            continue
        found.append(proc)
    return found


def _in_sandbox_of(proc: psutil.Process, workspace: str) -> bool:
    try:
        for one in [proc, *proc.parents()]:
            if one.name() == "bwrap" and workspace in one.cmdline():
                return True
    except psutil.Error:
        pass
    return False


def _namespaces(pid: int) -> dict[str, str]:
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in ("net", "pid", "mnt", "user")}


def test_third_party_servers_answer_from_inside_the_floor_and_are_gone_after(
    tmp_path: Path,
) -> None:
    """`mcp-server-time` and `mcp-server-git` from PyPI, configured in the user's policy: the
    model's calls reach them and their results reach the model; while the run is live their
    processes sit in other namespaces than ours (bwrap's), and none is left afterwards."""
    ws = _workspace(tmp_path)
    _user_policy(
        tmp_path / "config",
        f"""
[mcp.servers.time]
command = "{BIN / "mcp-server-time"}"
args = ["--local-timezone", "UTC"]

[mcp.servers.git]
command = "{BIN / "mcp-server-git"}"
args = ["--repository", "{ws}"]
""",
    )
    seen: dict[str, dict[str, str]] = {}
    before_first: list[psutil.Process] = []

    def route(request: RecordedRequest) -> FakeResponse | None:
        if len(request.messages) == 1:  # nothing of MCP runs before the first request is out
            before_first.extend(_servers_named("mcp-server-", ws))
        if len(request.messages) >= 3 and not seen:  # the first tool result is in: both up
            for word in ("mcp-server-time", "mcp-server-git"):
                for proc in _servers_named(word, ws):
                    if proc.name() != "bwrap":
                        seen[word] = _namespaces(proc.pid)
        return None

    replies = [
        Reply.tool_use("mcp__time__get_current_time", {"timezone": "UTC"}),
        Reply.tool_use("mcp__git__git_status", {"repo_path": str(ws)}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies, route=route) as api:
        done = _run(ws, tmp_path, api)
        requests = api.requests
    assert done.returncode == 0, done.stderr
    first, second = _results(done.stdout)
    assert not first["is_error"] and '"timezone": "UTC"' in first["content"]
    assert not second["is_error"] and "working tree clean" in second["content"]
    assert "Traceback" not in done.stderr
    assert not before_first
    assert not any(t["name"].startswith("mcp__") for t in requests[0].body["tools"])
    offered = [tool["name"] for tool in requests[-1].body["tools"]]
    assert "mcp__time__get_current_time" in offered and "mcp__git__git_status" in offered
    schema = next(t for t in requests[-1].body["tools"] if t["name"] == "mcp__git__git_status")
    assert "repo_path" in schema["input_schema"]["properties"]
    ours = _namespaces(os.getpid())
    assert set(seen) == {"mcp-server-time", "mcp-server-git"}
    for word, namespaces in seen.items():
        for ns in ("net", "pid", "mnt", "user"):
            assert namespaces[ns] != ours[ns], f"{word} shares our {ns} namespace"
    assert not _servers_named(str(BIN / "mcp-server-time"), ws)
    assert not _servers_named(str(BIN / "mcp-server-git"), ws)


def test_a_hostile_server_cannot_read_secrets_write_outside_or_reach_the_network(
    tmp_path: Path, home: Path, outside: Path, hostile: Path
) -> None:
    """The hostile server tries to read `~/.ssh/id_rsa` (a fake HOME outside /tmp), write
    outside the workspace and into it (read-only by default), and connect to a port that
    answers on the host's 127.0.0.1: every attempt fails, the API key is not in its
    environment, and the host shows no trace. The same server granted `network = true` by a
    trusted repository connects, is said to at start-up, and is denied everything else."""
    ws = _workspace(tmp_path)
    server = f"""command = "{sys.executable}"
args = ["{hostile}"]
env = {{ OUTSIDE = "{outside}", WORKSPACE = "{ws}", PYTHONPATH = "{ROOT}" }}
"""
    _user_policy(tmp_path / "config", "[mcp.servers.hostile]\n" + server)
    (ws / ".warren").mkdir()
    (ws / ".warren" / "policy.toml").write_text(
        "[mcp.servers.netted]\n" + server + "network = true\n"
    )
    TrustStore.from_env({"XDG_STATE_HOME": str(tmp_path / "state")}).trust(ws)
    listener = socket.create_server(("127.0.0.1", 0))  # a port on the host that answers
    port = listener.getsockname()[1]
    replies = [
        Reply.tool_use("mcp__hostile__attack", {"target_port": port}),
        Reply.tool_use("mcp__netted__attack", {"target_port": port}),
        Reply.text("done"),
    ]
    with listener, FakeMessagesAPI(replies) as api:
        done = _run(ws, tmp_path, api, home=home)
    assert done.returncode == 0, done.stderr
    closed, opened = _results(done.stdout)
    for result in (closed, opened):
        assert not result["is_error"], result
        report = result["content"]
        assert "SECRET-KEY-MATERIAL" not in report and "'ssh': 'failed" in report
        assert "'write_outside': 'failed" in report
        assert "'write_workspace': 'failed" in report
        assert "sk-test-mcp" not in report and "'api_key': 'absent'" in report
    assert "'network': 'failed" in closed["content"]
    assert "'network': 'connected'" in opened["content"]
    assert not (outside / "pwned").exists()
    assert not (ws / "planted.txt").exists()
    granted = "MCP server 'netted' runs in the sandbox with the host's network"
    assert f"{granted} (network = true in {ws / '.warren' / 'policy.toml'})" in done.stderr
    assert "MCP server 'hostile' runs" not in done.stderr


def test_faults_give_the_model_an_error_and_the_session_goes_on(
    tmp_path: Path, hostile: Path
) -> None:
    """A server that dies mid-call, one that hangs past its timeout, and one that cannot
    start: each call gets an error result, the user one line, the next call restarts the
    server, and no server process is left after the run."""
    ws = _workspace(tmp_path)
    script = hostile
    _user_policy(
        tmp_path / "config",
        f"""
[mcp.servers.flaky]
command = "{sys.executable}"
args = ["{script}"]
timeout_s = 3
env = {{ PYTHONPATH = "{ROOT}" }}

[mcp.servers.missing]
command = "/nonexistent/mcp-server"
network = true
""",
    )
    replies = [
        Reply.tool_use("mcp__flaky__hello", {}),
        Reply.tool_use("mcp__flaky__crash", {}),
        Reply.tool_use("mcp__flaky__hello", {}),
        Reply.tool_use("mcp__flaky__hang", {}),
        Reply.tool_use("mcp__flaky__hello", {}),
        Reply.tool_use("mcp__missing__anything", {}),
        Reply.text("done"),
    ]
    with FakeMessagesAPI(replies) as api:
        done = _run(ws, tmp_path, api)
    assert done.returncode == 0, done.stderr
    hello1, crash, hello2, hang, hello3, missing = _results(done.stdout)
    assert not hello1["is_error"] and "hello from" in hello1["content"]
    assert crash["is_error"] and "flaky" in crash["content"]
    assert not hello2["is_error"] and hello2["content"] != hello1["content"]  # restarted
    assert hang["is_error"] and "timed out after 3 s" in hang["content"]
    assert not hello3["is_error"]
    assert missing["is_error"] and "missing" in missing["content"]
    assert "Traceback" not in done.stderr
    assert "MCP server 'missing'" in done.stderr
    assert not _servers_named(str(script))


HTTP_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("web")

@server.tool()
def shout(text: str) -> str:
    """Upper-cases text."""
    return text.upper()

server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
'''


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_a_url_server_of_the_user_is_reached_over_http_and_said_so(
    tmp_path: Path, hostile: Path
) -> None:
    """A streamable HTTP server named by `url` in the user's policy: reached from the
    coordinator (outside the floor, one line says so), its tool called through the pipeline."""
    ws = _workspace(tmp_path)
    script = hostile.parent / "web.py"
    script.write_text(HTTP_SERVER)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(script), str(port)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        _user_policy(
            tmp_path / "config", f'[mcp.servers.web]\nurl = "http://127.0.0.1:{port}/mcp"\n'
        )
        replies = [Reply.tool_use("mcp__web__shout", {"text": "quiet"}), Reply.text("done")]
        with FakeMessagesAPI(replies) as api:
            done = _run(ws, tmp_path, api)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    [result] = _results(done.stdout)
    assert not result["is_error"] and result["content"] == "QUIET", result
    assert "MCP server 'web' is reached over HTTP, outside the sandbox" in done.stderr


def test_doctor_starts_each_server_in_the_floor_and_reports_its_state(
    tmp_path: Path, hostile: Path
) -> None:
    ws = _workspace(tmp_path)
    _user_policy(
        tmp_path / "config",
        f"""
[mcp.servers.flaky]
command = "{sys.executable}"
args = ["{hostile}"]
env = {{ PYTHONPATH = "{ROOT}" }}

[mcp.servers.missing]
command = "/nonexistent/mcp-server"
network = true
""",
    )
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [*WARREN, "doctor"], cwd=ws, env=env, capture_output=True, text=True, timeout=180
    )
    assert "mcp servers:" in done.stdout, done.stdout + done.stderr
    assert "flaky: ready, 4 tools; prompts: review" in done.stdout
    assert "missing: failed, HOST NETWORK:" in done.stdout
    assert "Traceback" not in done.stderr
    assert not _servers_named(str(hostile))


def test_a_resource_mention_in_the_prompt_is_read_through_the_server(
    tmp_path: Path, hostile: Path
) -> None:
    """`@server:uri` in a prompt: the server (started in the floor) is asked for the resource
    and its text joins the first request; a mention of an unknown server stays plain text,
    one the server cannot read becomes a note."""
    ws = _workspace(tmp_path)
    _user_policy(
        tmp_path / "config",
        f"""
[mcp.servers.notes]
command = "{sys.executable}"
args = ["{hostile}"]
env = {{ PYTHONPATH = "{ROOT}" }}
""",
    )
    prompt = "check @notes:notes://today, @other:x://y and @notes:notes://nope"
    with FakeMessagesAPI([Reply.text("done")]) as api:
        done = _run(ws, tmp_path, api, prompt=prompt)
        [request] = api.requests
    assert done.returncode == 0, done.stderr
    sent = json.dumps(request.messages[0])
    assert "remember the milk" in sent
    assert 'uri=\\"notes://today\\"' in sent
    assert sent.count("<resource server=") == 2  # @other is not a server: left as text
    assert "notes://nope" in sent and "not read" in sent


CLOCK_AGENT = """---
name: clock
description: Tells the time.
tools: Read, mcp__time__get_current_time
---
You tell the time.
"""


def test_a_subagent_uses_the_mcp_tools_its_type_names_through_the_coordinator(
    tmp_path: Path,
) -> None:
    """A user agent type naming `mcp__time__get_current_time`: its subagent is offered that
    tool (and not the server's other one), its call runs in the coordinator's one server
    (no server is started for the worker) and the result reaches its model; its call of
    `mcp__time__convert_time`, which the policy would allow but its type does not name, gets
    an error result. A PreToolUse hook on the tool runs and lets it through. No server
    process is left after the run."""
    ws = _workspace(tmp_path)
    _user_policy(
        tmp_path / "config",
        f"""
[permissions]
allow = ["mcp__time", "dispatch_agent"]

[[hooks]]                         # asked of the coordinator; its call must still run
event = "PreToolUse"
matcher = "mcp__time__get_current_time"
command = "true"

[mcp.servers.time]
command = "{BIN / "mcp-server-time"}"
args = ["--local-timezone", "UTC"]
""",
    )
    (tmp_path / "config" / "warren" / "agents").mkdir()
    (tmp_path / "config" / "warren" / "agents" / "clock.md").write_text(CLOCK_AGENT)
    servers: list[int] = []
    convert = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}

    def route(request: RecordedRequest) -> FakeResponse:
        if "dispatched by another agent" not in json.dumps(request.system):
            if len(request.messages) == 1:
                return Reply.tool_use(
                    "dispatch_agent",
                    {"description": "tell the time", "prompt": "time?", "subagent_type": "clock"},
                )
            return Reply.text("done")
        named = _servers_named(str(BIN / "mcp-server-time"), ws)
        servers.append(sum(1 for proc in named if proc.name() != "bwrap"))
        turn = len(request.messages)
        if turn == 1:
            return Reply.tool_use("mcp__time__get_current_time", {"timezone": "UTC"})
        if turn == 3:
            return Reply.tool_use("mcp__time__convert_time", convert)
        return Reply.text("TIME-REPORT")

    with FakeMessagesAPI(route=route) as api:
        done = _run(ws, tmp_path, api, mode="default")
        requests = api.requests
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    sub = [r for r in requests if "dispatched by another agent" in json.dumps(r.system)]
    assert len(sub) == 3
    offered = [tool["name"] for tool in sub[0].body["tools"]]
    assert "mcp__time__get_current_time" in offered and "Read" in offered
    assert "mcp__time__convert_time" not in offered
    [allowed] = [b for b in sub[1].messages[-1]["content"] if b.get("type") == "tool_result"]
    assert not allowed["is_error"] and '"timezone": "UTC"' in allowed["content"]
    [refused] = [b for b in sub[2].messages[-1]["content"] if b.get("type") == "tool_result"]
    assert refused["is_error"] and "mcp__time__convert_time" in json.dumps(refused["content"])
    assert any("TIME-REPORT" in json.dumps(r["content"]) for r in _results(done.stdout))
    assert servers and max(servers) == 1  # the coordinator's one server, none per worker
    assert not _servers_named(str(BIN / "mcp-server-time"), ws)
