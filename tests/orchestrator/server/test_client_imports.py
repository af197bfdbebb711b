"""The launcher's cost on a warm launch: `warren` imports the standard library and the thin
client, nothing else of Warren's and no dependency, until it knows the server will not take
the run (`orchestrator.cli.run_and_exit`)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.orchestrator.server.conftest import ROOT

LAUNCHER = (
    "orchestrator",
    "orchestrator.cli",
    "orchestrator.cli.client",
    "orchestrator.cli.commands",
)


def test_the_warm_path_imports_only_the_thin_client() -> None:
    code = (
        "import json, sys\n"
        "from orchestrator.cli import run_and_exit\n"
        "from orchestrator.cli.client import code_version, run_through_server, server_dir\n"
        "from orchestrator.cli.commands import is_command\n"
        "code_version(); server_dir(); is_command(['-p', 'hi'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(done.stdout))
    ours = {
        name
        for name in loaded
        if name.split(".")[0] in ("orchestrator", "workers", "sandbox", "policies")
    }
    assert ours == set(LAUNCHER)
    foreign = {
        name
        for name in loaded - ours
        if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("_")
    }
    assert foreign <= {"sitecustomize", "usercustomize"}, foreign  # no trio, pydantic, SDK
    assert not {"argparse", "typing", "asyncio"} & loaded
