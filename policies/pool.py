"""Where subagents run: the local worker pool, or a Ray cluster (`--pool`, `[pool]`).

A cluster receives the workspace a subagent may read, so choosing one is the user's decision
(or the machine administrator's), never a repository's: `[pool]` is accepted in the user's
and the managed policy only (`policies.files` refuses it elsewhere with a located error).
This module holds what the choice is made of and how it is resolved, as values:

- `PoolSection`, the `[pool]` table as written (`backend`, `address`; unset keys leave the
  choice to lower levels);
- `PoolSetting`, the table merged over the levels, each value with the file it came from;
- `PoolConfig`, the effective choice a session runs with (`resolve_pool`: the managed policy,
  then `--pool`, `RAY_ADDRESS`, then the user's policy);
- `check_max_subagents`: the local pool runs at most 10 workers on this machine, a cluster
  up to 64.

The address is what Ray itself accepts for a cluster it did not start: the GCS address
`HOST:PORT`, or `ray://HOST:PORT` for Ray Client. It never carries the cluster's token: Ray
reads `RAY_AUTH_TOKEN` from the environment, which Warren passes to nothing but Ray.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictStr, model_validator

from policies.sources import PolicyError, PolicyTable

__all__ = [
    "MAX_LOCAL_SUBAGENTS",
    "MAX_RAY_SUBAGENTS",
    "POOL_LEVELS",
    "RAY_ADDRESS_ENV",
    "PoolBackend",
    "PoolConfig",
    "PoolSection",
    "PoolSetting",
    "check_address",
    "check_max_subagents",
    "merge_pool",
    "resolve_pool",
]

PoolBackend = Literal["local", "ray"]

MAX_LOCAL_SUBAGENTS: Final = 10
"""Subagents at once in the local pool: each is a worker process on this machine."""
MAX_RAY_SUBAGENTS: Final = 64
"""Subagents at once on a Ray cluster (`limits.max_subagents`' upper bound)."""

RAY_ADDRESS_ENV: Final = "RAY_ADDRESS"
"""The cluster address `--pool ray` takes first, as Ray's own tools do."""

POOL_LEVELS: Final[tuple[str, ...]] = ("built-in", "user", "managed")
"""The policy levels whose `[pool]` counts: a repository's files cannot set it."""

_SCHEMES: Final = ("ray://",)
_HOSTNAME: Final = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)
_FORMS: Final = (
    "HOST:PORT (the head's GCS address, port 6379 by default) or ray://HOST:PORT (Ray "
    "Client, port 10001 by default)"
)


def check_address(text: str) -> str:
    """`text` if it is a cluster address Ray accepts (`HOST:PORT`, `ray://HOST:PORT`; the host
    a name, an IPv4 address or a bracketed IPv6 one), surrounding blanks removed.

    **Errors:** `ValueError` saying which form is expected (and that a token never goes in
    the address).
    """
    address = text.strip()
    rest = address
    scheme, sep, after = address.partition("://")
    if sep:
        if f"{scheme}://" not in _SCHEMES:
            raise ValueError(f"`{scheme}://` is not a Ray cluster address; give {_FORMS}")
        rest = after
    if "@" in rest:
        raise ValueError(
            "a cluster address carries no user or token (Ray reads the token from "
            f"RAY_AUTH_TOKEN); give {_FORMS}"
        )
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise ValueError(f"{address!r} is not a cluster address; give {_FORMS}")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: the port must be a number from 1 to 65535; give {_FORMS}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{address!r}: {host} is not an IPv6 address; give {_FORMS}") from None
    elif not _HOSTNAME.fullmatch(host):
        raise ValueError(
            f"{address!r}: {host!r} is not a host name or address (an IPv6 address goes in "
            f"brackets: [::1]:6379); give {_FORMS}"
        )
    return address


Address = Annotated[StrictStr, AfterValidator(check_address)]


class PoolSection(PolicyTable):
    """`[pool]` in the user's or the managed policy: where subagents run."""

    backend: PoolBackend | None = None
    """`local` (worker processes on this machine) or `ray` (actors on a Ray cluster); unset
    leaves it to lower levels, and then `local`."""
    address: Address | None = None
    """The cluster `--pool ray` connects to when `RAY_ADDRESS` is not set: `HOST:PORT` or
    `ray://HOST:PORT`. A managed policy's address is used even when `RAY_ADDRESS` is set."""

    def is_set(self) -> bool:
        return self.backend is not None or self.address is not None


class PoolConfig(BaseModel):
    """The pool a session runs its subagents in (`open_subagents` receives it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: PoolBackend = "local"
    """`local`: sandboxed worker processes on this machine (at most 10). `ray`: actors on the
    Ray cluster at `address` (at most 64), the API key, broker, decisions and transcripts
    staying here. Default `local`."""
    address: Address | None = None
    """The Ray cluster: `HOST:PORT` (its GCS) or `ray://HOST:PORT` (Ray Client). Required
    with `ray`; None with `local`. Default None."""

    @model_validator(mode="after")
    def _consistent(self) -> PoolConfig:
        if self.backend == "ray" and self.address is None:
            raise ValueError("backend `ray` needs an address (HOST:PORT or ray://HOST:PORT)")
        if self.backend == "local" and self.address is not None:
            raise ValueError("backend `local` takes no address (it is the Ray cluster's)")
        return self

    @property
    def max_subagents(self) -> int:
        """The most subagents this pool may run at once."""
        return MAX_RAY_SUBAGENTS if self.backend == "ray" else MAX_LOCAL_SUBAGENTS


@dataclass(frozen=True)
class PoolSetting:
    """`[pool]` merged over the levels that may set it, each value with its file and level."""

    backend: PoolBackend = "local"
    backend_source: str = "default"
    """The file that set `backend` (`default`: none did)."""
    backend_level: str = "default"
    address: str | None = None
    address_source: str | None = None
    address_level: str | None = None


def merge_pool(sections: Iterable[tuple[PoolSection, str, str]]) -> PoolSetting:
    """(section, file, level) lowest precedence first: each key from the highest that sets
    it. The caller passes only the levels in `POOL_LEVELS`."""
    setting = PoolSetting()
    for section, source, level in sections:
        if section.backend is not None:
            setting = PoolSetting(
                section.backend, source, level,
                setting.address, setting.address_source, setting.address_level,
            )  # fmt: skip
        if section.address is not None:
            setting = PoolSetting(
                setting.backend, setting.backend_source, setting.backend_level,
                section.address, source, level,
            )  # fmt: skip
    return setting


def resolve_pool(
    setting: PoolSetting,
    requested: PoolBackend | None,
    environ: Mapping[str, str],
) -> PoolConfig:
    """The pool a session runs with: `requested` (`--pool`) over the policy's backend, unless
    the managed policy set one; with `ray`, the address from the managed policy, else
    `RAY_ADDRESS`, else the user's policy.

    **Errors:** `PolicyError` (one line, naming where the value came from) when `--pool`
    contradicts the managed policy, when `ray` has no address, or when `RAY_ADDRESS` is not
    an address.
    """
    backend = setting.backend
    if requested is not None:
        if setting.backend_level == "managed" and requested != setting.backend:
            raise PolicyError(
                f"--pool {requested}: the managed policy sets `[pool] backend = "
                f'"{setting.backend}"`, which the command line cannot change',
                file=setting.backend_source,
                key="pool.backend",
            )
        backend = requested
    if backend == "local":
        return PoolConfig()
    given = environ.get(RAY_ADDRESS_ENV, "").strip()
    if setting.address is not None and (setting.address_level == "managed" or not given):
        return PoolConfig(backend="ray", address=setting.address)
    if given:
        try:
            return PoolConfig(backend="ray", address=check_address(given))
        except ValueError as exc:
            raise PolicyError(str(exc), file="environment", key=RAY_ADDRESS_ENV) from None
    how = (
        "set RAY_ADDRESS=HOST:PORT (or ray://HOST:PORT), or `address` in the `[pool]` table "
        "of your policy (~/.config/warren/policy.toml)"
    )
    if requested == "ray":
        raise PolicyError(f"--pool ray needs the cluster's address: {how}")
    raise PolicyError(
        f'backend "ray" needs the cluster\'s address: {how}',
        file=setting.backend_source,
        key="pool.backend",
    )


def check_max_subagents(value: int, source: str, pool: PoolConfig) -> None:
    """Refuse `limits.max_subagents` above what `pool` may run.

    **Errors:** `PolicyError` naming the file, saying why the local pool stops at 10.
    """
    if value <= pool.max_subagents:
        return
    if pool.backend == "local":
        why = (
            f"the local pool runs at most {MAX_LOCAL_SUBAGENTS} subagents at once (each is "
            f"a sandboxed process on this machine); up to {MAX_RAY_SUBAGENTS} need the Ray "
            'pool (--pool ray, or `[pool] backend = "ray"` in your policy)'
        )
    else:
        why = f"a Ray cluster runs at most {MAX_RAY_SUBAGENTS} subagents at once"
    raise PolicyError(f"max_subagents = {value}: {why}", file=source, key="limits.max_subagents")
