"""Suite-wide settings: hypothesis is derandomized in CI and randomized locally.

Under `CI=true` every property runs from a fixed seed, so a run is reproducible; locally it
explores new inputs. A failure hypothesis ever finds is kept as an explicit `@example`.
Neither profile has a deadline.

No test talks to, or starts, the user's warm server. Each test process (xdist worker) starts
a private one (`warren server start` in a directory of its own, WARREN_SERVER_DIR) that the
`warren` commands the tests run go through, as a user's would: a session process forked from
a process that has imported everything, instead of a fresh interpreter importing the SDK for
every one of hundreds of runs. A test that watches the process tree of the `warren` it
started is marked `in_process` and runs without a server (`WARREN_NO_SERVER=1`), as does a
test that builds its environment from scratch; tests/orchestrator/server/ runs servers of
its own. `WARREN_TEST_SERVER=0` runs the whole suite in-process.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import settings

from tests.kit.server_processes import servers_in

ROOT = Path(__file__).resolve().parents[1]

# Until the suite's server is up (and for anything that copied the environment before it),
# nothing reaches a server.
os.environ["WARREN_NO_SERVER"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "in_process: the test's `warren` runs in-process, not in the suite's server"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` run first (in their order): started last, one of them would end
    the run alone on one xdist worker while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def suite_server() -> Iterator[None]:
    """This test process's private warm server, stopped with everything it forked at the
    end. Started detached (by `warren server start`), so it is no child of the tests."""
    if os.environ.get("WARREN_TEST_SERVER", "1") == "0":
        yield
        return
    directory = Path(tempfile.mkdtemp(prefix="wsuite", dir="/tmp"))  # a short socket path
    env = {k: v for k, v in os.environ.items() if k != "WARREN_NO_SERVER"}
    env.update(WARREN_SERVER_DIR=str(directory), PYTHONPATH=str(ROOT))
    warren = [sys.executable, "-m", "orchestrator.cli", "server"]
    started = subprocess.run(
        [*warren, "start"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert started.returncode == 0, started.stdout + started.stderr
    del os.environ["WARREN_NO_SERVER"]
    os.environ["WARREN_SERVER_DIR"] = str(directory)
    try:
        yield
    finally:
        os.environ["WARREN_NO_SERVER"] = "1"
        subprocess.run([*warren, "stop"], env=env, capture_output=True, timeout=60, check=False)
        left = servers_in(directory)
        for process in left:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _in_process_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("in_process"):
        monkeypatch.setenv("WARREN_NO_SERVER", "1")


# No deadline: a shared 2-core machine makes first calls (imports, compiled patterns) slow at
# random, and speed is measured by tests/bench/, not by timed assertions.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
