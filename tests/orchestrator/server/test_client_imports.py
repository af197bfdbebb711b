"""The launcher's cost on a warm launch: `warren` imports the standard library and the thin
client, nothing else of Warren's and no dependency, until it knows the server will not take
the run (`orchestrator.cli.run_and_exit`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from tests.orchestrator.server.conftest import ROOT

LAUNCHER = (
    "orchestrator",
    "orchestrator.cli",
    "orchestrator.cli.client",
    "orchestrator.cli.commands",
)


def test_the_warm_path_imports_only_the_thin_client() -> None:
    code = (
        "import sys\n"
        "from orchestrator.cli import run_and_exit\n"
        "from orchestrator.cli.client import code_version, run_through_server\n"
        "from orchestrator.cli.commands import is_command\n"
        "code_version(); is_command(['-p', 'hi'])\n"
        "assert run_through_server(['-p', 'hi']) is None  # a server directory, no server\n"
        "loaded = sorted(sys.modules)\n"
        "import json\n"
        "print(json.dumps(loaded))\n"
    )
    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "WARREN_SERVER_DIR": directory}
        env.pop("WARREN_NO_SERVER", None)  # the whole warm path, up to the connect
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
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
    assert not {"argparse", "typing", "asyncio", "pathlib"} & loaded
    # Nor the Python halves of `json`, `socket` and `signal`, which bring `re` and `enum`.
    assert not {"json", "socket", "signal", "selectors", "re", "enum"} & loaded
    # Nor `collections` (with `operator`, `keyword`, `reprlib`), which `array` and
    # `collections.abc` import: the descriptors are packed by hand.
    assert not {"array", "collections", "operator", "reprlib"} & loaded
