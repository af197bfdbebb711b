"""`warren mcp serve` driven by the official SDK's client over stdio and streamable HTTP (issue
14, item 5): the tools are listed, Grep runs in the sandbox, an Edit the policy does not allow is
denied and the file is unchanged, dispatch_agent runs a subagent against the fake Messages API
when a key is set (and is not offered without one), and over HTTP the bearer token is required.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest
import trio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox

ROOT = Path(__file__).resolve().parents[3]


pytestmark = needs_sandbox


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="warren-serve-", dir="/var/tmp"))
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("def needle():\n    return 42\n")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _text(result: mcp_types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))


async def _session(ws: Path, state: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "orchestrator.cli", "mcp", "serve", "--cwd", str(ws), *extra],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "XDG_STATE_HOME": str(state / "state"),
            "XDG_CONFIG_HOME": str(state / "config"),
            **(env or {}),
        },
    )
    return stdio_client(params)


def test_an_sdk_client_lists_greps_is_denied_an_edit_and_dispatches_an_agent(
    ws: Path, tmp_path: Path
) -> None:
    api_env = {"ANTHROPIC_API_KEY": "sk-test-serve"}

    async def main(api: FakeMessagesAPI) -> None:
        api_env["ANTHROPIC_BASE_URL"] = api.base_url
        async with (
            await _session(ws, tmp_path, "--permission-mode", "plan", env=api_env) as (
                read,
                write,
            ),
            ClientSession(read, write) as client,
        ):
            with trio.fail_after(120):
                await client.initialize()
                listing = await client.list_tools()
                names = {tool.name for tool in listing.tools}
                assert {"Read", "Grep", "Glob", "Edit", "Bash", "dispatch_agent"} <= names
                grep = next(t for t in listing.tools if t.name == "Grep")
                assert grep.annotations is not None and grep.annotations.read_only_hint
                assert "pattern" in grep.input_schema["properties"]

                found = await client.call_tool(
                    "Grep", {"pattern": "needle", "output_mode": "files_with_matches"}
                )
                assert not found.is_error and "src/app.py" in _text(found)

                read = await client.call_tool("Read", {"file_path": str(ws / "src/app.py")})
                assert not read.is_error and "return 42" in _text(read)
                edit = await client.call_tool(
                    "Edit",
                    {
                        "file_path": str(ws / "src/app.py"),
                        "old_string": "42",
                        "new_string": "43",
                    },
                )
                assert edit.is_error, _text(edit)
                assert "plan" in _text(edit).lower() or "denied" in _text(edit).lower()

                bad = await client.call_tool("Grep", {"pattern": 5})
                assert bad.is_error and "InputValidationError" in _text(bad)

                task = {"description": "look", "prompt": "find the needle"}
                agent = await client.call_tool("dispatch_agent", task)
                assert not agent.is_error and "REPORT-42" in _text(agent), _text(agent)

    with FakeMessagesAPI([Reply.text("the needle returns REPORT-42")]) as api:
        trio.run(main, api)
        [request] = api.requests
    assert "find the needle" in json.dumps(request.messages)
    assert (ws / "src" / "app.py").read_text() == "def needle():\n    return 42\n"


# The SDK's streamable HTTP client leaves its httpx2 response streams to the garbage collector
# when a session closes under trio; trio reports each as unraisable. Only those are ignored.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object "
    "(PoolByteStream|Response|EventSource):pytest.PytestUnraisableExceptionWarning"
)
def test_over_http_a_bearer_token_is_required_and_the_sdk_client_is_served(
    ws: Path, tmp_path: Path
) -> None:
    """`--http 0 --token-file F`: the SDK's streamable HTTP client with the token lists the
    tools, runs Grep and is denied an Edit (plan mode); a request without the token, or
    with another, gets 401."""
    import subprocess

    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    token = "t0ken-" + "x" * 32
    (tmp_path / "token").write_text(token + "\n")
    server = subprocess.Popen(
        [
            sys.executable, "-m", "orchestrator.cli", "mcp", "serve", "--cwd", str(ws),
            "--http", "0", "--token-file", str(tmp_path / "token"), "--permission-mode", "plan",
        ],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
            "PYTHONPATH": str(ROOT),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        while line and "listening on" not in line:
            line = server.stderr.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].strip()

        async def main() -> None:
            async with httpx2.AsyncClient(timeout=60.0) as plain:
                hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
                for headers in ({}, {"Authorization": "Bearer wrong-token-xxxxxxxxxx"}):
                    refused = await plain.post(url, json=hello, headers=headers)
                    assert refused.status_code == 401
            auth = {"Authorization": f"Bearer {token}"}
            async with (
                httpx2.AsyncClient(headers=auth, timeout=120.0) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as client,
            ):
                with trio.fail_after(120):
                    await client.initialize()
                    names = {tool.name for tool in (await client.list_tools()).tools}
                    assert {"Read", "Grep", "Edit", "Bash"} <= names
                    assert "dispatch_agent" not in names  # no API key: no model to run it
                    found = await client.call_tool(
                        "Grep", {"pattern": "needle", "output_mode": "files_with_matches"}
                    )
                    assert not found.is_error and "src/app.py" in _text(found)
                    edit = await client.call_tool(
                        "Edit",
                        {"file_path": str(ws / "src/app.py"), "old_string": "4", "new_string": "5"},
                    )
                    assert edit.is_error, _text(edit)

        trio.run(main)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert (ws / "src" / "app.py").read_text() == "def needle():\n    return 42\n"
