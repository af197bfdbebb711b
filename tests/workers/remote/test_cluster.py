"""The session's connection to a Ray cluster, short of a cluster: a `ray://` address without
Ray Client installed is one line saying what to install (the dev environment has Ray without
its client extra)."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from workers.remote.cluster import RayCluster


@pytest.mark.skipif(importlib.util.find_spec("grpc") is not None, reason="Ray Client installed")
async def test_a_ray_client_address_without_ray_client_says_what_to_install() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # reachable, so ray.init is next
        port = listener.getsockname()[1]
        cluster = RayCluster(f"ray://127.0.0.1:{port}", connect_timeout_s=60)
        await cluster.connect()
    assert not await cluster.wait()
    assert cluster.failure == (
        f"cannot connect to the Ray cluster at ray://127.0.0.1:{port}: a ray:// address needs "
        "Ray Client: install Warren with its `ray-client` extra (warren[ray-client]), or give "
        "the head's GCS address HOST:PORT"
    )
