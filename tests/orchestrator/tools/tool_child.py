"""Run one file tool call in a child process, for tests that kill it or limit its file size.

    python -m tests.orchestrator.tools.tool_child < SPEC_JSON

The spec comes on stdin (a big input does not fit in one argument):
{"tool": "Write"|"Edit"|"MultiEdit"|"NotebookEdit", "input": {...}, "workspace": "/abs/ws",
"fsize_limit": bytes or null, "content_file": path or null}.
With `content_file`, the Write input's `content` is read from that file (a 40 MB content does
not fit on a command line). The file is recorded in the read ledger as Read would, then the
child prints `ready` on stdout, flushes, and runs the call; at the end it prints one JSON line
`{"stage": ..., "text": ...}`. With `fsize_limit`, RLIMIT_FSIZE is set and SIGXFSZ ignored, so
a write past the limit fails with EFBIG instead of killing the process.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from orchestrator.tools.base import Tool, ToolContext
from orchestrator.tools.edit import EditTool
from orchestrator.tools.multi_edit import MultiEditTool
from orchestrator.tools.notebook_edit import NotebookEditTool
from orchestrator.tools.write import WriteTool
from tests.orchestrator.tools.conftest import run_tool

TOOLS: dict[str, Tool[Any]] = {
    "Write": WriteTool(),
    "Edit": EditTool(),
    "MultiEdit": MultiEditTool(),
    "NotebookEdit": NotebookEditTool(),
}


def _prepare(spec: dict[str, Any]) -> tuple[dict[str, Any], ToolContext]:
    ws = Path(spec["workspace"])
    ctx = ToolContext(workspace=ws, cwd=ws)
    raw: dict[str, Any] = dict(spec["input"])
    if spec.get("content_file"):
        raw["content"] = Path(spec["content_file"]).read_text()
    target = Path(raw.get("file_path") or raw["notebook_path"])
    if target.exists():
        ctx.read_ledger.record(target)
    if spec.get("fsize_limit") is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(spec["fsize_limit"]), hard))
    return raw, ctx


async def _main(tool: str, raw: dict[str, Any], ctx: ToolContext) -> None:
    print("ready", flush=True)
    outcome = await run_tool(TOOLS[tool], raw, ctx)
    print(json.dumps({"stage": outcome.stage, "text": outcome.text}), flush=True)


if __name__ == "__main__":
    spec = json.loads(sys.stdin.read())
    trio.run(_main, spec["tool"], *_prepare(spec))
