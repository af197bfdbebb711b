"""One Ray cluster (a head and a second node on 127.0.0.1) for every Ray test of the run,
started on first use and stopped, with everything on it, when the run ends: a cluster takes
seconds to start, and the whole Ray suite has about a minute.

The test process is a Ray driver of its own (to look at the cluster: its nodes, the actors
left on it); the cluster's token reaches the processes the tests start through the
environment, as a user's would."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.kit.ray_cluster import LocalRayCluster, local_ray_cluster


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalRayCluster]:
    from workers.remote.cluster import import_ray

    saved = {name: os.environ.get(name) for name in (*LocalRayCluster.ENV_NAMES, "RAY_ADDRESS")}
    with local_ray_cluster(nodes=2) as cluster:
        os.environ.update(cluster.env)
        ray = import_ray()
        try:
            ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
            deadline = time.monotonic() + 120  # a loaded machine is slow to start a node
            while len(alive_nodes(ray)) < 2:
                assert time.monotonic() < deadline, "the second Ray node never joined"
                time.sleep(0.1)
            yield cluster
        finally:
            ray.shutdown()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def live_actors(class_name: str = "NodeWorker") -> list[dict[str, Any]]:
    """The actors of `class_name` on the cluster that are not dead (any job's)."""
    import ray

    return [
        a
        for a in ray._private.state.actors().values()
        if a.get("ActorClassName", "").endswith(class_name) and a.get("State") != "DEAD"
    ]
