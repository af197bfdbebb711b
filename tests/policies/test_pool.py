"""`[pool]` and `--pool` (policies/pool.py): only the user's and the managed policy may send
the workspace to a cluster, the address is one Ray accepts, the managed policy wins, and the
local pool stays capped at 10 subagents while a cluster may run 64."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from policies.commands import CommandEnvironment, show
from policies.files import PolicyError, parse_policy_text
from policies.pool import (
    PoolConfig,
    PoolSetting,
    check_address,
    check_max_subagents,
    resolve_pool,
)
from tests.policies.test_files import Levels


@pytest.fixture
def levels(tmp_path: Path) -> Levels:
    return Levels(tmp_path)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:6379", "head:6379", "ray://head.example.com:10001", "[::1]:6379", " h:1 "],
)
def test_addresses_ray_accepts(address: str) -> None:
    assert check_address(address) == address.strip()


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("http://head:6379", "`http://` is not a Ray cluster address"),
        ("anyscale://x:1", "`anyscale://` is not a Ray cluster address"),
        ("head", "is not a cluster address"),
        ("auto", "is not a cluster address"),
        ("head:0", "the port must be a number from 1 to 65535"),
        ("head:65536", "the port must be a number from 1 to 65535"),
        ("head:x", "the port must be a number"),
        ("ray://tok@head:10001", "carries no user or token"),
        ("[nope]:1", "is not an IPv6 address"),
        ("::1:6379", "is not a host name"),
        ("he ad:1", "is not a host name"),
    ],
)
def test_other_addresses_are_refused_saying_what_is_expected(address: str, why: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT") as caught:
        check_address(address)
    assert why in str(caught.value)


def test_pool_config_rejects_contradictions() -> None:
    assert PoolConfig() == PoolConfig(backend="local", address=None)
    assert PoolConfig(backend="ray", address="h:1").max_subagents == 64
    with pytest.raises(ValidationError, match="backend `ray` needs an address"):
        PoolConfig(backend="ray")
    with pytest.raises(ValidationError, match="backend `local` takes no address"):
        PoolConfig(address="h:1")
    with pytest.raises(ValidationError, match="not a Ray cluster address"):
        PoolConfig(backend="ray", address="https://h:1")


POOL = '[pool]\nbackend = "ray"\naddress = "10.0.0.5:6379"\n'


def test_the_user_and_the_managed_policy_choose_the_pool(levels: Levels) -> None:
    assert levels.load().pool == PoolSetting()
    user = levels.write("user", POOL)
    pool = levels.load().pool
    assert (pool.backend, pool.backend_source, pool.address) == ("ray", str(user), "10.0.0.5:6379")
    managed = levels.write("managed", '[pool]\naddress = "ray://gate:10001"\n')
    pool = levels.load().pool
    assert (pool.backend, pool.backend_source) == ("ray", str(user))
    assert (pool.address, pool.address_source, pool.address_level) == (
        "ray://gate:10001",
        str(managed),
        "managed",
    )


@pytest.mark.parametrize("level", ["project", "local"])
@pytest.mark.parametrize("trusted", [False, True])
def test_a_repository_cannot_send_your_code_to_a_cluster(
    levels: Levels, level: str, trusted: bool
) -> None:
    path = levels.write(level, POOL)
    if trusted:
        levels.trust()
    with pytest.raises(PolicyError) as caught:
        levels.load()
    assert str(caught.value) == (
        f"{path}: pool: `[pool]` is only allowed in the user's or the managed policy: a "
        "repository cannot send your code to a cluster"
    )
    assert "\n" not in str(caught.value)


def test_the_pool_table_is_checked_where_it_is_written() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy_text('[pool]\nbackend = "k8s"\n', file="/u/policy.toml")
    assert (caught.value.line, caught.value.key) == (2, "pool.backend")
    with pytest.raises(PolicyError) as caught:
        parse_policy_text('[pool]\naddress = "head"\n', file="/u/policy.toml")
    assert caught.value.key == "pool.address" and "HOST:PORT" in caught.value.message
    with pytest.raises(PolicyError, match="unknown key `token`"):
        parse_policy_text('[pool]\ntoken = "x"\n', file="/u/policy.toml")


USER = PoolSetting("ray", "/u/policy.toml", "user", "10.0.0.5:6379", "/u/policy.toml", "user")


@pytest.mark.parametrize(
    ("setting", "requested", "environ", "expected"),
    [
        (PoolSetting(), None, {"RAY_ADDRESS": "h:1"}, PoolConfig()),
        (PoolSetting(), "ray", {"RAY_ADDRESS": "h:1"}, PoolConfig(backend="ray", address="h:1")),
        (USER, None, {}, PoolConfig(backend="ray", address="10.0.0.5:6379")),
        (USER, None, {"RAY_ADDRESS": "ray://c:10001"}, PoolConfig(backend="ray", address="ray://c:10001")),
        (USER, "local", {"RAY_ADDRESS": "c:1"}, PoolConfig()),
        (
            PoolSetting("ray", "/etc/p", "managed", "m:1", "/etc/p", "managed"),
            "ray",
            {"RAY_ADDRESS": "c:1"},
            PoolConfig(backend="ray", address="m:1"),
        ),
    ],
)  # fmt: skip
def test_resolution_order(
    setting: PoolSetting, requested: str | None, environ: dict[str, str], expected: PoolConfig
) -> None:
    assert resolve_pool(setting, requested, environ) == expected  # type: ignore[arg-type]


def test_resolution_errors_are_one_line_naming_their_source() -> None:
    with pytest.raises(PolicyError) as caught:
        resolve_pool(PoolSetting(), "ray", {"RAY_ADDRESS": " "})
    assert str(caught.value).startswith("--pool ray needs the cluster's address: set RAY_ADDRESS")
    setting = PoolSetting("ray", "/u/policy.toml", "user")
    with pytest.raises(PolicyError, match=r"^/u/policy.toml: pool.backend: backend \"ray\" needs"):
        resolve_pool(setting, None, {})
    with pytest.raises(PolicyError, match=r"^environment: RAY_ADDRESS: 'auto' is not a cluster"):
        resolve_pool(PoolSetting(), "ray", {"RAY_ADDRESS": "auto"})
    managed = PoolSetting("local", "/etc/warren/policy.toml", "managed")
    with pytest.raises(PolicyError) as caught:
        resolve_pool(managed, "ray", {"RAY_ADDRESS": "h:1"})
    assert str(caught.value) == (
        "/etc/warren/policy.toml: pool.backend: --pool ray: the managed policy sets `[pool] "
        'backend = "local"`, which the command line cannot change'
    )
    for message in ("--pool ray needs", "RAY_ADDRESS", "managed policy sets"):
        assert "\n" not in message


def test_max_subagents_goes_to_64_only_on_a_cluster(levels: Levels) -> None:
    user = levels.write("user", "[limits]\nmax_subagents = 64\n")
    setting = levels.load().limits["max_subagents"]
    assert (setting.value, setting.source) == (64, str(user))
    check_max_subagents(64, str(user), PoolConfig(backend="ray", address="h:1"))
    check_max_subagents(10, str(user), PoolConfig())
    with pytest.raises(PolicyError) as caught:
        check_max_subagents(11, str(user), PoolConfig())
    assert str(caught.value) == (
        f"{user}: limits.max_subagents: max_subagents = 11: the local pool runs at most 10 "
        "subagents at once (each is a sandboxed process on this machine); up to 64 need the "
        'Ray pool (--pool ray, or `[pool] backend = "ray"` in your policy)'
    )
    levels.write("user", "[limits]\nmax_subagents = 65\n")
    with pytest.raises(PolicyError, match="less than or equal to 64"):
        levels.load()


def test_policy_show_shows_the_pool_and_never_the_token(levels: Levels) -> None:
    token = "ray-token-3b9f-do-not-print"
    env = {**levels.env, "RAY_ADDRESS": "c:6379", "RAY_AUTH_TOKEN": token}
    environment = CommandEnvironment(env=env, managed=levels.managed, probe=lambda: True)
    text = show(levels.workspace, environment=environment).text
    assert "pool: local  (default)\n" in text
    user = levels.write("user", POOL)
    text = show(levels.workspace, environment=environment).text
    assert f"pool: ray  ({user})\n  address = 10.0.0.5:6379  ({user})\n" in text
    assert "  RAY_ADDRESS = c:6379  (environment: what --pool ray connects to)" in text
    assert token not in text
