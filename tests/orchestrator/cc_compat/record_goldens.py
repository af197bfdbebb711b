"""Record the goldens once: Claude Code's own stream-json for the scripted session
(tests/kit/cc_session.py), run by the Claude Code binary that claude-agent-sdk's wheel bundles,
against the fake Messages API (no network). CI never runs this; it reads the committed files.

    .venv/bin/python -m tests.orchestrator.cc_compat.record_goldens

Writes `goldens/claude-code.stream.jsonl` (the raw lines, for reading) and
`goldens/claude-code.shape.json` (kind -> field path -> JSON types), with the version recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import claude_agent_sdk

from tests.kit.cc_session import MAIN_PROMPT, route_session, shapes
from tests.kit.fake_api import FakeMessagesAPI

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"


def main() -> int:
    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled"
    claude = bundled / "claude"
    version = (bundled / "claude.version").read_text().strip()
    with tempfile.TemporaryDirectory() as tmp:
        home, workspace = Path(tmp) / "home", Path(tmp) / "ws"
        home.mkdir()
        workspace.mkdir()
        (workspace / "README.md").write_text("A one-line readme.\n")
        with FakeMessagesAPI(route=route_session(workspace)) as api:
            env = {
                "PATH": os.environ["PATH"],
                "HOME": str(home),
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
                "ANTHROPIC_BASE_URL": api.base_url,
                "ANTHROPIC_API_KEY": "sk-test-golden",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
            }
            done = subprocess.run(
                [str(claude), "-p", MAIN_PROMPT, "--output-format", "stream-json", "--verbose"],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
        if (workspace / "notes.txt").exists():
            print("the denied Write was made: not the scripted session", file=sys.stderr)
            return 1
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines or lines[-1].get("type") != "result":
        print(f"claude exited {done.returncode}: {done.stderr[-2000:]}", file=sys.stderr)
        return 1
    GOLDENS.mkdir(exist_ok=True)
    with (GOLDENS / "claude-code.stream.jsonl").open("w") as out:
        out.writelines(json.dumps(line, sort_keys=True) + "\n" for line in lines)
    shape = {"claude_code_version": version, "kinds": shapes(lines)}
    (GOLDENS / "claude-code.shape.json").write_text(json.dumps(shape, indent=1) + "\n")
    print(f"recorded {len(lines)} lines from Claude Code {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
