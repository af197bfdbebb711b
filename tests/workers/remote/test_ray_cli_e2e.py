"""`warren -p --pool ray` end to end: the real CLI, the real SDK against the fake Messages API,
three subagents on the test's two-node Ray cluster (127.0.0.1), each under its node's floor
with a snapshot of the workspace (`survey_through_the_cli`), and a workflow whose four
read-only agents run there as Ray actors (`workflow_through_the_cli`), both run by
test_ray_pool.py on the run's one cluster; and an unreachable cluster: one line, the local
pool, exit 0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.ray_cluster import LocalRayCluster, free_port
from tests.workers.remote.conftest import live_actors

pytestmark = [needs_sandbox, pytest.mark.in_process]

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
KEY = "sk-ant-ray-e2e-key-never-on-a-node"
AREAS = ("billing", "catalog", "shipping")


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "shop"
    for area in AREAS:
        (repo / area).mkdir(parents=True)
        (repo / area / "core.py").write_text(f"def {area}():\n    return '{area}'\n")
    agents = tmp_path / "config" / "warren" / "agents"
    agents.mkdir(parents=True)
    (agents / "surveyor.md").write_text(
        "---\nname: surveyor\ndescription: Surveys one area.\ntools: Bash, Read\n---\n"
        "Survey the area you are given.\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        XDG_STATE_HOME=str(tmp_path / "state"),
        ANTHROPIC_API_KEY=KEY,
        PYTHONPATH=str(ROOT),
    )
    return repo, env


def _first_text(request: RecordedRequest) -> str:
    content = request.messages[0]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def survey_through_the_cli(ray_cluster: LocalRayCluster, tmp_path: Path) -> None:
    """`warren -p --pool ray`: three surveyors on the cluster (tests/workers/remote/
    test_ray_pool.py runs it on the one cluster of the run), the session with an extra root
    (`--add-dir`) that the billing surveyor reads from its own snapshot."""
    repo, env = _setup(tmp_path)
    lib = tmp_path / "lib"  # outside the workspace: an extra root
    lib.mkdir()
    (lib / "shared.py").write_text("SHARED = 'from the extra root'\n")

    def route(request: RecordedRequest) -> FakeResponse:
        text = _first_text(request)
        area = next((a for a in AREAS if f"[survey:{a}]" in text), None)
        if area is None:  # the main agent
            if len(request.messages) == 1:
                return Reply(
                    content=[
                        {"type": "tool_use", "id": f"toolu_d{i}", "name": "dispatch_agent",
                         "input": {"description": f"survey {a}", "subagent_type": "surveyor",
                                   "prompt": f"[survey:{a}] look around"}}
                        for i, a in enumerate(AREAS)
                    ]
                )  # fmt: skip
            return Reply.text("surveyed")
        if len(request.messages) == 1:  # write into the snapshot, then print the environment
            command = f"touch {repo}/{area}/pwned.txt {lib}/pwned.txt; env"
            return Reply.tool_use("Bash", {"command": command}, hold_before_stop=True)
        if len(request.messages) == 3:
            read = lib / "shared.py" if area == "billing" else repo / area / "core.py"
            return Reply.tool_use("Read", {"file_path": str(read)})
        return Reply.text(f"report on {area}")

    seen: dict[str, Any] = {}
    args = ["-p", "survey the shop", "--cwd", str(repo), "--pool", "ray", "--add-dir", str(lib)]
    args += ["--output-format", "stream-json", "--allowed-tools", "Bash(touch:*)"]
    # Under `uv run`, Ray's uv integration would package the current directory and upload it
    # to the cluster: the CLI runs below a process that looks like `uv run` to Ray.
    (tmp_path / "uv").symlink_to(Path(sys.executable).resolve())
    (tmp_path / "run").write_text(
        "import json, os, subprocess, sys\n"
        "sys.exit(subprocess.call(json.loads(os.environ['TEST_ARGV'])))\n"
    )
    with FakeMessagesAPI(route=route) as api:
        cli = subprocess.Popen(
            [str(tmp_path / "uv"), "run"],
            cwd=tmp_path,
            env={**env, "RAY_ADDRESS": ray_cluster.address, "ANTHROPIC_BASE_URL": api.base_url,
                 "TEST_ARGV": json.dumps([*WARREN, *args])},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(cli.communicate(timeout=240)))
        reader.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and cli.poll() is None:
            held = [r for r in api.requests if "[survey:" in _first_text(r) and r.ended_at is None]
            if len(held) == 3:
                break
            time.sleep(0.05)
        # All three are in flight: look at who runs them before they go on.
        coordinator = {p.pid for p in psutil.Process(cli.pid).children(recursive=True)}
        cluster = ray_cluster.members()
        seen["actors"] = _processes(cluster, "NodeWorker")
        seen["workers"] = _processes(cluster, "workers.agent_worker")
        seen["coordinator"] = coordinator | {cli.pid}
        seen["actor_env"] = _environments(seen["actors"])
        seen["worker_env"] = _environments(seen["workers"])
        api.release(3)
        reader.join(timeout=240)
        requests = api.requests
    stdout, stderr = output
    assert cli.returncode == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    results = [e for e in events if e.get("subtype") == "subagent_result"]
    assert [e["terminal_reason"] for e in results] == ["completed"] * 3
    # Three Ray actors on the cluster's nodes, none of them the coordinator's process.
    actors, workers = seen["actors"], seen["workers"]
    assert len(actors) >= 3 and len(workers) >= 3
    assert not {p.pid for p in actors + workers} & seen["coordinator"]
    assert all(e["worker_node"].startswith("node ") for e in results)
    # No key in an actor's environment or a worker's sandbox (nor the cluster's token).
    assert all("ANTHROPIC_API_KEY" not in env for env in seen["actor_env"])
    assert all(not {"ANTHROPIC_API_KEY", "RAY_AUTH_TOKEN"} & set(env) for env in seen["worker_env"])
    assert len(seen["actor_env"]) >= 3 and len(seen["worker_env"]) >= 3
    # They read one snapshot; none could write it, and the workspace is as it was.
    assert len({e["snapshot"] for e in results}) == 1
    touched = [
        r.messages[2]["content"][0]
        for r in requests
        if len(r.messages) == 3 and "[survey:" in _first_text(r)
    ]
    assert len(touched) == 3
    for result in touched:
        text = json.dumps(result["content"])
        assert "Read-only file system" in text and KEY not in text and "PATH=" in text
    assert not list(repo.rglob("pwned.txt")) and not list(lib.rglob("pwned.txt"))
    # The extra root reached the node as a snapshot of its own, shown at its path.
    read_back = [
        json.dumps(r.messages[4]["content"][0]["content"])
        for r in requests
        if len(r.messages) == 5 and "[survey:billing]" in _first_text(r)
    ]
    assert len(read_back) == 1 and "from the extra root" in read_back[0], read_back
    # Their reports reached the main agent, in dispatch order, naming the snapshot.
    main = [r for r in requests if "[survey:" not in _first_text(r)]
    reports = [json.dumps(b["content"]) for b in main[-1].messages[-1]["content"]]
    for area, report in zip(AREAS, reports, strict=True):
        assert f"report on {area}" in report and "workspace snapshot" in report
    # Nothing of this machine was uploaded, and nothing is left running on the cluster.
    from ray.experimental import internal_kv

    assert internal_kv._internal_kv_list("gcs://_ray_pkg") == []
    assert live_actors() == []
    # Each actor's snapshot view went with it (`NodeCache.release_view`); the blobs stay for
    # the next session.
    cache = ray_cluster.temp_dir / "cache"
    assert [p.name for p in (cache / "mounts").iterdir()] == []
    assert [p.suffix for p in (cache / "views").iterdir()] == []
    assert list((cache / "blobs").iterdir())
    # `warren doctor --pool ray` proves the floor of each node of the live cluster.
    doctor = subprocess.run(
        [str(tmp_path / "uv"), "run"],
        cwd=tmp_path,
        env={**env, "RAY_ADDRESS": ray_cluster.address,
             "TEST_ARGV": json.dumps([*WARREN, "doctor", "--pool", "ray", "--json"])},
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr
    nodes = _documents(doctor.stdout)[-1]  # after the local floor's report
    assert len(nodes) == 2 and all(node["ok"] for node in nodes), nodes
    assert live_actors() == []
    assert "Traceback" not in stderr


WORKFLOW_AREAS = ("billing", "catalog", "search", "shipping")
WORKFLOW = """\
META = {"name": "ray-survey", "description": "Count each area's lines", "phases": ["Survey"]}
N = {"type": "object", "required": ["area", "lines"],
     "properties": {"area": {"type": "string"}, "lines": {"type": "integer"}}}
phase("Survey")
found = parallel([lambda a=a: agent(f"[wf:{a}] Count the lines of {a}/core.py.", schema=N,
                                    label=a) for a in args["areas"]])
finish({f["area"]: f["lines"] for f in found if f})
"""


def _wf_area(request: RecordedRequest) -> str | None:
    text = _first_text(request)
    return next((a for a in WORKFLOW_AREAS if text.startswith(f"[wf:{a}]")), None)


def _workflow_route(repo: Path) -> Callable[[RecordedRequest], FakeResponse]:
    """The main agent starts the workflow and waits for its notification; each agent reads
    its area's file (its first reply held until the test has looked at who runs it), gives
    the count through StructuredOutput, then ends."""

    def route(request: RecordedRequest) -> FakeResponse:
        area = _wf_area(request)
        if area is None:  # the main agent
            text = json.dumps(request.messages)
            if "<task-id>" in text:
                return Reply.text("The workflow finished.")
            if len(request.messages) > 1:
                return Reply.text("The workflow runs in the background.")
            start = {"script": WORKFLOW, "args": {"areas": list(WORKFLOW_AREAS)}}
            return Reply.tool_use("Workflow", start)
        if len(request.messages) == 1:
            path = str(repo / area / "core.py")
            return Reply.tool_use("Read", {"file_path": path}, hold_before_stop=True)
        if len(request.messages) == 3:
            read = json.dumps(request.messages[2]["content"])
            lines = 2 if f"def {area}()" in read else -1  # the file, read on the node
            return Reply.tool_use("StructuredOutput", {"area": area, "lines": lines})
        return Reply.text(f"counted {area}")

    return route


def workflow_through_the_cli(ray_cluster: LocalRayCluster) -> None:
    """`warren -p --pool ray`: the model starts a workflow (issue 35) whose script runs four
    read-only agents in parallel with a schema; each runs as a Ray actor's worker on the
    cluster (seen in the cluster's process trees while all four wait on the model, none in
    the coordinator's; each `subagent_result` names its node), reads its area from the
    workspace's snapshot, and its typed answer reaches the script, whose result is the run's
    and the main agent's one notification."""
    # Not under /tmp: the script's sandbox has a private one.
    home = Path("/var/tmp") / f"warren-ray-wf-{uuid.uuid4().hex[:10]}"
    try:
        repo = home / "shop"
        for area in WORKFLOW_AREAS:
            (repo / area).mkdir(parents=True)
            (repo / area / "core.py").write_text(f"def {area}():\n    return '{area}'\n")
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        env.update(
            XDG_CONFIG_HOME=str(home / "config"),
            XDG_STATE_HOME=str(home / "state"),
            ANTHROPIC_API_KEY=KEY,
            PYTHONPATH=str(ROOT),
            RAY_ADDRESS=ray_cluster.address,
        )
        with FakeMessagesAPI(route=_workflow_route(repo)) as api:
            env["ANTHROPIC_BASE_URL"] = api.base_url
            with (home / "out").open("w") as out, (home / "err").open("w") as err:
                cli = subprocess.Popen(
                    [*WARREN, "-p", "Run the survey workflow.", "--cwd", str(repo),
                     "--pool", "ray", "--allowedTools", "Workflow",
                     "--output-format", "stream-json", "--verbose"],
                    env=env, stdout=out, stderr=err, text=True,
                )  # fmt: skip
            try:
                deadline = time.monotonic() + 180
                while len([r for r in api.requests if _wf_area(r) and r.ended_at is None]) < 4:
                    assert cli.poll() is None and time.monotonic() < deadline, "not all 4 ran"
                    time.sleep(0.05)
                # All four wait on the model: look at who runs them before they go on.
                coordinator = {cli.pid, *(p.pid for p in psutil.Process(cli.pid).children(True))}
                workers = _processes(ray_cluster.members(), "workers.agent_worker")
                actors = _processes(ray_cluster.members(), "NodeWorker")
            finally:
                api.release(4)
                try:
                    cli.wait(240)
                except subprocess.TimeoutExpired:
                    cli.kill()
                    cli.wait()
            requests = api.requests
        stderr = (home / "err").read_text()
        assert cli.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr
        assert len(workers) >= 4 and len(actors) >= 4
        assert not {p.pid for p in workers + actors} & coordinator
        events = [json.loads(line) for line in (home / "out").read_text().splitlines()]
        results = [e for e in events if e.get("subtype") == "subagent_result"]
        assert len(results) == 4 and len({e["agent_id"] for e in results}) == 4
        assert [e["terminal_reason"] for e in results] == ["completed"] * 4
        assert all(e["worker_node"].startswith("node ") for e in results), results
        expected = dict.fromkeys(WORKFLOW_AREAS, 2)
        [run] = (home / "state" / "warren" / "workflows").iterdir()
        record = json.loads((run / "run.json").read_text())
        assert (record["status"], record["result"]) == ("completed", expected), record
        by_area = {a: [r for r in requests if _wf_area(r) == a] for a in WORKFLOW_AREAS}
        assert all(len(found) == 3 for found in by_area.values())  # none ran twice
        main = [r for r in requests if _wf_area(r) is None]
        assert len(main) == 3 and json.dumps(main[2].messages).count("<task-id>") == 1
        assert '\\"shipping\\": 2' in json.dumps(main[2].messages)  # the result, in the note
        deadline = time.monotonic() + 60  # nothing left on the cluster (the GCS hears late)
        while live_actors():
            assert time.monotonic() < deadline, live_actors()
            time.sleep(0.1)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _documents(text: str) -> list[Any]:
    """The JSON documents printed one after another."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        document, at = decoder.raw_decode(text, at)
        found.append(document)
    return found


def _environments(processes: list[psutil.Process]) -> list[dict[str, str]]:
    """The environments of those still alive (a spare worker may be replaced meanwhile)."""
    found = []
    for process in processes:
        try:
            found.append(process.environ())
        except psutil.Error:
            continue
    return found


def _processes(members: set[int], marker: str) -> list[psutil.Process]:
    found = []
    for pid in members:
        try:
            process = psutil.Process(pid)
            if marker in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_an_unreachable_cluster_is_one_line_and_the_local_pool(tmp_path: Path) -> None:
    repo, env = _setup(tmp_path)
    dispatch = {"description": "survey", "prompt": "look around", "subagent_type": "general"}
    two = Reply(
        content=[
            {"type": "tool_use", "id": f"toolu_{i}", "name": "dispatch_agent", "input": dispatch}
            for i in range(2)
        ]
    )
    replies = [two, Reply.text("local"), Reply.text("local"), Reply.text("ok")]
    with FakeMessagesAPI(replies) as api:
        done = subprocess.run(
            [*WARREN, "-p", "survey", "--cwd", str(repo), "--pool", "ray"],
            env={**env, "RAY_ADDRESS": f"127.0.0.1:{free_port()}",
                 "ANTHROPIC_BASE_URL": api.base_url},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    [line] = done.stderr.splitlines()
    assert line.startswith("warren: the Ray cluster at 127.0.0.1:")
    assert line.endswith("is unreachable; subagents run in the local pool")
