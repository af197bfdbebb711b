"""The sandbox's environment, built from an allowlist rather than inherited and then filtered.

A pure function of the policy and a host environment: `gather_host_facts` calls it with
`os.environ`, the tests with a dict. The API key, tokens and agent sockets never reach a
sandbox because nothing is copied unless a pattern asks for it, and even then the scrub list
drops anything that looks like a credential.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from sandbox.spec import EnvPolicy

__all__ = ["build_env"]


def build_env(
    policy: EnvPolicy, environ: Mapping[str, str], *, home: Path
) -> tuple[tuple[str, str], ...]:
    """The (name, value) pairs to set inside the sandbox, sorted by name.

    A host variable is copied when an `allow` pattern matches it and no `scrub` pattern does
    (scrub is case-insensitive: `github_token` is as secret as `GITHUB_TOKEN`); naming it
    exactly in `allow` overrides the scrub. `HOME` is the spec's home, then `values` win.
    """
    exact = {pattern for pattern in policy.allow if not _has_magic(pattern)}
    out: dict[str, str] = {}
    for name, value in environ.items():
        if not any(fnmatchcase(name, pattern) for pattern in policy.allow):
            continue
        if name not in exact and any(
            fnmatchcase(name.upper(), pattern.upper()) for pattern in policy.scrub
        ):
            continue
        out[name] = value
    out["HOME"] = str(home)
    out.update(policy.values)
    return tuple(sorted(out.items()))


def _has_magic(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")
