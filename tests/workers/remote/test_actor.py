"""What a `NodeWorker` actor does on its node, short of a cluster (its methods are plain
Python: Ray only calls them): the modules its calls load, which every one of a session's up
to 64 actors pays for in CPU on the nodes."""

from __future__ import annotations

import json
import os
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
import time
deadline = time.monotonic() + 10  # a loaded machine may not have the tree up at once
while (usage is None or usage[0] == 0) and time.monotonic() < deadline:
    time.sleep(0.05)
    usage = actor.usage()
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


_EXTRA_ROOTS = """
import json, os, sys
from pathlib import Path
import trio
from workers.remote.actor import NodeWorker, view_names
from workers.remote.snapshot import NodeCache, SnapshotBuilder
from sandbox.spec import SandboxSpec

workspace, extra, cache_root = sys.argv[1:4]
builders = [SnapshotBuilder(Path(r), read_denied=None, sandboxed=False) for r in (workspace, extra)]
manifests = [trio.run(builder.build) for builder in builders]
cache = NodeCache(Path(cache_root))  # the blobs as the node would have fetched them
for builder, manifest in zip(builders, manifests):
    cache.add_blobs({e.digest: builder.read_blob(e.digest) for e in manifest.entries if e.digest})
# After the snapshot the coordinator's copy changes: the worker must see what was shipped.
with open(os.path.join(extra, "lib.txt"), "w") as f:
    f.write("changed on the coordinator after the snapshot\\n")
script = (  # the views are empty until the sync below: the worker waits for them
    f"until [ -e {workspace}/a.txt ] && [ -e {extra}/lib.txt ]; do sleep 0.05; done; "
    f"cat {workspace}/a.txt {extra}/lib.txt; touch {extra}/planted 2>&1; "
    f"touch {workspace}/planted 2>&1; echo end"
)
actor = NodeWorker()
relay = actor._relay
started = relay.call(relay.start, {
    "spec": SandboxSpec().model_dump(mode="json"),
    "argv": [sys.executable, "-c",  # the actor runs its own python: argv[0] is replaced
             f"import subprocess; subprocess.run(['sh', '-c', {script!r}])"],
    "workspace": workspace, "extra_roots": [extra], "cwd": workspace,
    "view": "worker1", "channel": None,
})
assert started["ok"], started
views = [str(v) for v in relay.views]
lacking = actor.sync({}, *manifests)
out = b""
while True:
    got = actor.read(65536)
    out += got[0] + got[1]
    if got[4] is not None:
        break
code = actor.stop(10)
print(json.dumps({
    "views": views, "lacking": lacking, "out": out.decode(errors="replace"),
    "left": sorted(os.listdir(os.path.join(cache_root, "mounts"))),
    "names": view_names("worker1", 2),
}))
"""


def test_extra_roots_are_shown_read_only_from_views_of_their_own(tmp_path: Path) -> None:
    """`--add-dir` roots on a node (issue 18): each extra root is a view of its own, synced
    from its manifest and shown read-only at its own path, as the workspace is; the worker
    sees what was shipped (not the coordinator's later copy, which on this one machine is at
    the very path), cannot write either root, and both views go at the stop."""
    workspace, extra = tmp_path / "ws", tmp_path / "lib"
    workspace.mkdir()
    extra.mkdir()
    (workspace / "a.txt").write_text("workspace file\n")
    (extra / "lib.txt").write_text("shipped extra root\n")
    cache = tmp_path / "node-cache"
    done = subprocess.run(
        [sys.executable, "-c", _EXTRA_ROOTS, str(workspace), str(extra), str(cache)],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "WARREN_RAY_CACHE": str(cache)},
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    got = json.loads(done.stdout.decode().splitlines()[-1])
    assert got["lacking"] == []
    assert [Path(v).name for v in got["views"]] == got["names"] == ["worker1", "worker1-r1"]
    out = got["out"]
    assert "workspace file" in out and "shipped extra root" in out
    assert "changed on the coordinator" not in out
    assert out.count("Read-only file system") == 2 and out.rstrip().endswith("end")
    assert not (extra / "planted").exists() and not (workspace / "planted").exists()
    assert got["left"] == []  # both views went with the worker's stop
