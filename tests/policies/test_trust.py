"""Trust: a repository's allow rules wait for the user; a changed policy file asks again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.tools.registry import builtin_facts
from policies.engine import PolicyEngine
from policies.files import PolicyPaths, load_effective_policy, save_remembered_rule
from policies.trust import TrustStore, policy_hash, project_policy_hash


@pytest.fixture
def store(tmp_path: Path) -> TrustStore:
    return TrustStore.from_env({"HOME": "/nonexistent", "XDG_STATE_HOME": str(tmp_path / "st")})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".warren").mkdir(parents=True)
    return root


def test_store_location_follows_xdg(tmp_path: Path) -> None:
    assert TrustStore.from_env({"XDG_STATE_HOME": "/s", "HOME": "/h"}).file == Path(
        "/s/warren/trust.json"
    )
    assert TrustStore.from_env({"HOME": "/h"}).file == Path("/h/.local/state/warren/trust.json")


def test_trust_untrust_is_trusted(store: TrustStore, repo: Path) -> None:
    (repo / ".warren/policy.toml").write_text('mode = "plan"\n')
    current = project_policy_hash(repo)
    assert current is not None
    assert not store.is_trusted(repo, current)
    assert store.state(repo, current) == "untrusted"
    store.trust(repo)
    assert store.is_trusted(repo, current)
    assert store.state(repo, current) == "trusted"
    assert store.untrust(repo)
    assert not store.untrust(repo)
    assert not store.is_trusted(repo, current)


def test_a_changed_policy_file_is_untrusted_again(store: TrustStore, repo: Path) -> None:
    policy = repo / ".warren/policy.toml"
    policy.write_text('mode = "plan"\n')
    store.trust(repo)
    policy.write_text('mode = "bypass"\n')
    changed = project_policy_hash(repo)
    assert not store.is_trusted(repo, changed)
    assert store.state(repo, changed) == "changed"
    store.trust(repo)
    assert store.is_trusted(repo, changed)


def test_adding_a_local_file_changes_the_hash(store: TrustStore, repo: Path) -> None:
    (repo / ".warren/policy.toml").write_text("")
    before = project_policy_hash(repo)
    (repo / ".warren/policy.local.toml").write_text("")
    assert project_policy_hash(repo) not in (before, None)
    assert policy_hash([repo / "missing.toml"]) is None


def test_trust_is_per_resolved_path(store: TrustStore, repo: Path, tmp_path: Path) -> None:
    (repo / ".warren/policy.toml").write_text("")
    link = tmp_path / "link"
    link.symlink_to(repo)
    store.trust(link)
    assert store.is_trusted(repo, project_policy_hash(repo))
    data = json.loads(store.file.read_text())
    assert list(data["projects"]) == [str(repo.resolve())]


def test_a_corrupt_store_trusts_nothing_and_is_rewritten(store: TrustStore, repo: Path) -> None:
    (repo / ".warren/policy.toml").write_text("")
    store.file.parent.mkdir(parents=True)
    store.file.write_text("{not json")
    assert store.state(repo, project_policy_hash(repo)) == "untrusted"
    store.trust(repo)
    assert store.is_trusted(repo, project_policy_hash(repo))
    store.file.write_text('{"projects": {"x": 5}}')
    assert store.record(Path("x")) is None


def test_trust_with_an_explicit_hash_does_not_trust_unseen_changes(
    store: TrustStore, repo: Path
) -> None:
    policy = repo / ".warren/policy.toml"
    policy.write_text("")
    seen = project_policy_hash(repo)
    policy.write_text('[permissions]\nallow = ["Bash"]\n')
    store.trust(repo, seen)
    assert not store.is_trusted(repo, project_policy_hash(repo))


# -- trust through the loader and the engine (acceptance) --


def decide_edit(repo: Path, store: TrustStore) -> str:
    env = {"HOME": str(repo.parent / "home")}
    paths = PolicyPaths(
        user=None,
        project=repo / ".warren/policy.toml",
        local=repo / ".warren/policy.local.toml",
        managed=None,
    )
    policy = load_effective_policy(repo, paths=paths, trust_store=store, env=env)
    engine = PolicyEngine(
        policy, workspace=repo, floor_proven=True, env=env, tool_facts=builtin_facts()
    )
    return engine.decide(
        "Edit", {"file_path": str(repo / "src/a.py")}, tool_read_only=False
    ).decision


def decide_read(repo: Path, store: TrustStore) -> str:
    env = {"HOME": str(repo.parent / "home")}
    paths = PolicyPaths(
        user=None,
        project=repo / ".warren/policy.toml",
        local=repo / ".warren/policy.local.toml",
        managed=None,
    )
    policy = load_effective_policy(repo, paths=paths, trust_store=store, env=env)
    engine = PolicyEngine(
        policy, workspace=repo, floor_proven=True, env=env, tool_facts=builtin_facts()
    )
    return engine.decide("Read", {"file_path": str(repo / ".env")}, tool_read_only=True).decision


def test_untrusted_allow_is_ignored_and_deny_applies_then_change_untrusts(
    store: TrustStore, repo: Path
) -> None:
    policy = repo / ".warren/policy.toml"
    policy.write_text('[permissions]\nallow = ["Edit(src/**)"]\ndeny = ["Read(.env)"]\n')
    assert decide_edit(repo, store) == "ask"  # allow ignored until trusted
    assert decide_read(repo, store) == "deny"  # deny applies at once
    store.trust(repo)
    assert decide_edit(repo, store) == "allow"
    policy.write_text('[permissions]\nallow = ["Edit(src/**)", "Bash"]\ndeny = ["Read(.env)"]\n')
    assert decide_edit(repo, store) == "ask"  # changed: untrusted again
    assert decide_read(repo, store) == "deny"
    store.trust(repo)
    assert decide_edit(repo, store) == "allow"


# -- remembered rules keep trust --


def test_saving_a_rule_keeps_a_trusted_repository_trusted(store: TrustStore, repo: Path) -> None:
    (repo / ".warren/policy.toml").write_text('[permissions]\nallow = ["Edit(src/**)"]\n')
    store.trust(repo)
    local = save_remembered_rule(repo, "Bash(make check)", trust_store=store)
    assert local == repo.resolve() / ".warren/policy.local.toml"
    assert store.is_trusted(repo, project_policy_hash(repo))


def test_saving_a_rule_leaves_an_untrusted_repository_untrusted(
    store: TrustStore, repo: Path
) -> None:
    (repo / ".warren/policy.toml").write_text('[permissions]\nallow = ["Bash"]\n')
    save_remembered_rule(repo, "Bash(make check)", trust_store=store)
    assert not store.is_trusted(repo, project_policy_hash(repo))


def test_saving_the_first_rule_of_a_repository_trusts_it(store: TrustStore, repo: Path) -> None:
    save_remembered_rule(repo, "Bash(make check)", trust_store=store)
    assert store.is_trusted(repo, project_policy_hash(repo))
