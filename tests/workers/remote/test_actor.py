"""What a `NodeWorker` actor does on its node, short of a cluster (its methods are plain
Python: Ray only calls them): the modules its calls load, which every one of a session's up
to 64 actors pays for in CPU on the nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.kit.floor import needs_sandbox

ROOT = Path(__file__).resolve().parents[3]

pytestmark = needs_sandbox

_MEASURE = """
import json, sys
from workers.remote.actor import NodeWorker
from sandbox.spec import SandboxSpec

actor = NodeWorker()
relay = actor._relay
started = relay.call(relay.start, {
    "spec": SandboxSpec().model_dump(mode="json"),
    "argv": [sys.executable, "-c", "import sys; sys.stdin.read()"],
    "workspace": sys.argv[1], "cwd": sys.argv[1], "view": None, "channel": None,
})
before = set(sys.modules)
usage = actor.usage()
loaded = sorted(set(sys.modules) - before)
actor.stop(10)
print(json.dumps({"ok": started["ok"], "usage": usage, "loaded": loaded}))
"""


def test_measuring_a_worker_loads_none_of_the_coordinators_modules(tmp_path: Path) -> None:
    """The pool asks each busy remote worker's actor for its usage twice a second; the first
    ask imported workers.pool (the coordinator's pool, with the orchestrator, the protocol's
    models and the broker): a tenth of a second of CPU in each actor during its first run."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path)],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.decode().splitlines()[-1])
    assert got["ok"] and got["usage"] is not None and got["usage"][0] > 0
    coordinator = ("workers.pool", "workers.broker", "orchestrator", "workers.protocol")
    assert [m for m in got["loaded"] if m.startswith(coordinator)] == []
