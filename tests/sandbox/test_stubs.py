"""The host stub registry: shared between concurrent sandboxes, removed by the last one,
never deleting what a user put there."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sandbox.stubs import StubRegistry, StubRequest


@pytest.fixture
def registry(scratch: Path) -> StubRegistry:
    return StubRegistry(scratch / "registry")


def test_created_then_removed(registry: StubRegistry, scratch: Path) -> None:
    stubs = [
        StubRequest(path=scratch / ".envrc", kind="dir"),
        StubRequest(path=scratch / "commondir", kind="file", content="."),
    ]
    lease = registry.acquire(stubs)
    assert (scratch / ".envrc").is_dir()
    assert (scratch / "commondir").read_text() == "."
    registry.release(lease)
    assert not (scratch / ".envrc").exists()
    assert not (scratch / "commondir").exists()
    assert json.loads((registry.directory / "stubs.json").read_text()) == {}


def test_shared_until_the_last_holder_leaves(registry: StubRegistry, scratch: Path) -> None:
    stub = [StubRequest(path=scratch / ".vscode", kind="dir")]
    first = registry.acquire(stub)
    second = registry.acquire(stub)
    registry.release(first)
    assert (scratch / ".vscode").is_dir()
    registry.release(second)
    assert not (scratch / ".vscode").exists()


def test_user_content_is_never_deleted(registry: StubRegistry, scratch: Path) -> None:
    lease = registry.acquire(
        [
            StubRequest(path=scratch / ".idea", kind="dir"),
            StubRequest(path=scratch / "cfg", kind="file"),
        ]
    )
    (scratch / ".idea" / "workspace.xml").write_text("mine")
    (scratch / "cfg").write_text("mine too")
    registry.release(lease)
    assert (scratch / ".idea" / "workspace.xml").read_text() == "mine"
    assert (scratch / "cfg").read_text() == "mine too"


def test_pre_existing_paths_are_not_ours(registry: StubRegistry, scratch: Path) -> None:
    (scratch / ".warren").mkdir()
    lease = registry.acquire([StubRequest(path=scratch / ".warren", kind="dir")])
    registry.release(lease)
    assert (scratch / ".warren").is_dir()


def test_sweep_removes_stubs_of_dead_holders(registry: StubRegistry, scratch: Path) -> None:
    lease = registry.acquire([StubRequest(path=scratch / ".envrc", kind="dir")])
    state_file = registry.directory / "stubs.json"
    state = json.loads(state_file.read_text())
    state[str(scratch / ".envrc")]["holders"] = ["999999999:1:crashed"]
    state_file.write_text(json.dumps(state))
    assert registry.sweep() == [scratch / ".envrc"]
    assert not (scratch / ".envrc").exists()
    registry.release(lease)  # a late release of a swept stub is harmless


def test_a_symlinked_parent_is_not_followed(registry: StubRegistry, scratch: Path) -> None:
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    (scratch / "repo").symlink_to(elsewhere)
    with pytest.raises(OSError):
        registry.acquire([StubRequest(path=scratch / "repo" / ".envrc", kind="dir")])
    assert not (elsewhere / ".envrc").exists()


def test_concurrent_holders(registry: StubRegistry, scratch: Path) -> None:
    stub = [StubRequest(path=scratch / ".git", kind="dir")]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(25):
                lease = registry.acquire(stub)
                assert (scratch / ".git").is_dir()
                registry.release(lease)
        except BaseException as exc:  # collected and re-raised by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not (scratch / ".git").exists()
