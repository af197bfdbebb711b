"""deploy/ray/: the files that set up a Warren-ready Ray cluster cannot be run here (no Docker
daemon, no second machine), so what can be checked is checked: they parse, each `ray start`
uses only flags Ray 2.60's accepts (the recorded list, and the installed Ray's own when there
is one), token auth is on everywhere with the token never written into a file, bwrap's
container settings are there, and `cluster.yaml` satisfies Ray's cluster schema."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "ray"

_RAY_START_HELP = (
    "--address --autoscaling-config --block --cgroup-path --dashboard-agent-grpc-port "
    "--dashboard-agent-listen-port --dashboard-host --dashboard-port --disable-usage-stats "
    "--enable-object-reconstruction --enable-resource-isolation --head --include-dashboard "
    "--include-log-monitor --labels --labels-file --log-color --log-style --max-worker-port "
    "--memory --metrics-export-port --min-worker-port --no-monitor --no-redirect-output "
    "--node-ip-address --node-manager-port --node-name --num-cpus --num-gpus "
    "--object-manager-port --object-spilling-directory --object-store-memory "
    "--plasma-directory --port --proxy-server-url --ray-client-server-port "
    "--ray-debugger-external --redis-password --redis-shard-ports --redis-username "
    "--resources --runtime-env-agent-port --system-config --system-reserved-cpu "
    "--system-reserved-memory --temp-dir --tracing-startup-hook --verbose "
    "--worker-port-list"
)
RAY_START_FLAGS = frozenset(_RAY_START_HELP.split())
"""`ray start`'s options in Ray 2.60.0 (`ray.scripts.scripts.start.params`)."""


def _load(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _ray_starts(command: str) -> list[list[str]]:
    """The arguments after each `ray start` in a shell command line."""
    out = []
    for part in command.split(";"):
        words = shlex.split(part)
        for i, word in enumerate(words[:-1]):
            if word.endswith("ray") and words[i + 1] == "start":
                out.append(words[i + 2 :])
    return out


def _flags(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def test_compose_runs_a_head_and_a_worker_node_with_token_auth() -> None:
    compose = _load("docker-compose.yml")
    head, worker = compose["services"]["ray-head"], compose["services"]["ray-worker"]
    for service in (head, worker):
        assert service["command"][:2] == ["ray", "start"]
        args = service["command"][2:]
        assert _flags(args) <= RAY_START_FLAGS, _flags(args) - RAY_START_FLAGS
        assert "--block" in args  # the daemons stay under the container's one process
        env = service["environment"]
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?")  # from the caller only
        assert {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} <= set(
            service["security_opt"]
        )
        assert "privileged" not in service and "cap_add" not in service
    assert {"--head", "--port=6379", "--ray-client-server-port=10001"} <= set(head["command"])
    assert "--address=ray-head:6379" in worker["command"]
    assert all(port.startswith("127.0.0.1:") for port in head["ports"])
    assert "ports" not in worker


def test_the_ray_up_config_sets_up_every_node_the_same_way() -> None:
    cluster = _load("cluster.yaml")
    assert cluster["provider"]["type"] == "local"
    assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    setup = "\n".join(cluster["setup_commands"])
    assert "bubblewrap" in setup and '"warren[ray]"' in setup
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [(command, args) for command in cluster[key] for args in _ray_starts(command)]
        assert len(starts) == 1, key
        command, args = starts[0]
        assert "export RAY_AUTH_MODE=token" in command
        assert _flags(args) <= RAY_START_FLAGS, _flags(args) - RAY_START_FLAGS
    assert "RAY_AUTH_TOKEN=" not in (DEPLOY / "cluster.yaml").read_text()


def test_the_node_image_has_bwrap_and_warren_and_no_token() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "bubblewrap" in text and '[ray]"' in text and "USER warren" in text
    assert "RAY_AUTH_TOKEN=" not in text
    cmd = json.loads(next(line for line in text.splitlines() if line.startswith("CMD "))[4:])
    assert cmd[:2] == ["ray", "start"] and _flags(cmd[2:]) <= RAY_START_FLAGS


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_the_installed_ray_agrees() -> None:
    """With Ray installed (`warren[ray]`): its `ray start` knows every recorded flag, and
    `cluster.yaml` satisfies its cluster schema (one child process: importing Ray is slow)."""
    script = (
        "import json, os, yaml, jsonschema, ray.autoscaler\n"
        "from ray.scripts.scripts import start\n"
        "schema = os.path.join(os.path.dirname(ray.autoscaler.__file__), 'ray-schema.json')\n"
        f"config = yaml.safe_load(open({str(DEPLOY / 'cluster.yaml')!r}))\n"
        "jsonschema.validate(config, json.load(open(schema)))\n"
        "print(json.dumps(sorted(o for p in start.params for o in p.opts)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    installed = set(json.loads(done.stdout.splitlines()[-1]))
    assert installed >= RAY_START_FLAGS, RAY_START_FLAGS - installed
