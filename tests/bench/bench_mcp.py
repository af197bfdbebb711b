"""What MCP costs (issue 14), measured in one run.

    uv run python tests/bench/bench_mcp.py [--rounds 5]

a) per call: an `echo` tool of a local stdio server written with the official SDK, called
   (1) directly with the SDK's own client over stdio (the server unsandboxed), and
   (2) through Warren: the pipeline (schema check against the server's JSON schema, policy
   decision, output cap) -> `McpServers` -> the same server started inside bubblewrap.
   Interleaved, medians per call; the goal is (2) - (1) <= 5 ms.
b) launch -> first model request of the real `warren -p` against the fake Messages API, with
   two stdio servers configured in the user's policy vs none, interleaved rounds, medians.
   Servers start only once the first response begins (orchestrator/mcp/deferred.py): no SDK
   import, no spawn, no server start-up before it, so the goal is the same time (ratio ~1.0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.calls.permissions import Allow, PermissionResult, headless_asker  # noqa: E402
from orchestrator.calls.pipeline import ToolPipeline  # noqa: E402
from orchestrator.calls.plan import CallPlan  # noqa: E402
from orchestrator.mcp.servers import ServerProcess, open_mcp_servers  # noqa: E402
from orchestrator.mcp.tool import McpTools  # noqa: E402
from orchestrator.messages import ToolUseBlock  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.registry import ToolRegistry  # noqa: E402
from policies.mcp import McpServer  # noqa: E402
from sandbox.run import open_sandboxed_process  # noqa: E402
from sandbox.spec import SandboxSpec, WorkspaceRoot  # noqa: E402
from tests.kit.fake_api import FakeMessagesAPI, Reply  # noqa: E402

CALLS = 200
ECHO = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")

@server.tool()
def echo(text: str) -> str:
    """Returns its input."""
    return text

server.run()
'''


async def allow(plan: CallPlan, ctx: ToolContext) -> PermissionResult:
    return Allow(rule="bench")


async def direct(script: Path, calls: int) -> list[float]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=[str(script)], env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    times = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        await client.list_tools()
        for _ in range(calls):
            started = time.perf_counter()
            await client.call_tool("echo", {"text": "x"})
            times.append(time.perf_counter() - started)
    return times


async def through_warren(script: Path, ws: Path, calls: int) -> list[float]:
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=ws, mode="ro"),),
        env=SandboxSpec().env.model_copy(update={"values": {"PYTHONPATH": str(ROOT)}}),
    )

    @asynccontextmanager
    async def launch(name: str, server: McpServer) -> AsyncIterator[ServerProcess]:
        assert server.command is not None
        async with open_sandboxed_process(spec, [server.command, *server.args], cwd=ws) as proc:
            yield proc  # type: ignore[misc]

    config = McpServer(command=sys.executable, args=(str(script),))
    times = []
    async with open_mcp_servers({"echo": (config, "bench")}, launch) as servers:
        await servers.wait_started()
        pipe = ToolPipeline(
            tools=ToolRegistry([], [McpTools(servers)]),
            ctx=ToolContext(workspace=ws, cwd=ws),
            permission=allow,
            asker=headless_asker,
            emit=lambda event: None,
        )
        block = ToolUseBlock(id="toolu_1", name="mcp__echo__echo", input={"text": "x"})
        for _ in range(calls):
            started = time.perf_counter()
            result = await pipe.execute(pipe.prepare(block))
            times.append(time.perf_counter() - started)
            assert not result.is_error, result
    return times


def first_request(ws: Path, config: Path, state: Path) -> float:
    with FakeMessagesAPI([Reply.text("done")]) as api:
        env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(config),
            "XDG_STATE_HOME": str(state),
            "ANTHROPIC_API_KEY": "sk-bench",
            "ANTHROPIC_BASE_URL": api.base_url,
            "PYTHONPATH": str(ROOT),
        }
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "-p", "hi", "--cwd", str(ws)],
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
        )
        return api.requests[0].started_at - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="warren-bench-mcp-", dir="/var/tmp"))
    try:
        ws = tmp / "ws"
        ws.mkdir()
        script = tmp / "echo.py"
        script.write_text(ECHO)
        plain, warren = [], []
        for _ in range(args.rounds):
            plain += trio.run(direct, script, CALLS // args.rounds)
            warren += trio.run(through_warren, script, ws, CALLS // args.rounds)
        a, b = statistics.median(plain), statistics.median(warren)
        print(
            f"a) MCP call: SDK client direct {a * 1e3:.2f} ms, through Warren (pipeline, "
            f"sandboxed server) {b * 1e3:.2f} ms median: +{(b - a) * 1e3:.2f} ms (goal <= 5 ms)"
        )

        none, two = tmp / "config-none", tmp / "config-two"
        (two / "warren").mkdir(parents=True)
        none.mkdir()
        (two / "warren" / "policy.toml").write_text(
            "".join(
                f'[mcp.servers.s{i}]\ncommand = "{sys.executable}"\nargs = ["{script}"]\n'
                f'env = {{ PYTHONPATH = "{ROOT}" }}\n'
                for i in range(2)
            )
        )
        without, with_servers = [], []
        for i in range(args.rounds):
            without.append(first_request(ws, none, tmp / f"state-a{i}"))
            with_servers.append(first_request(ws, two, tmp / f"state-b{i}"))
        c, d = statistics.median(without), statistics.median(with_servers)
        print(
            f"b) launch -> first request: {c * 1e3:.0f} ms without MCP servers, "
            f"{d * 1e3:.0f} ms with two configured: ratio {d / c:.2f} (goal ~1.0)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
