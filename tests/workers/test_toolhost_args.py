"""A tool host reads its command line without argparse when it is the argv the coordinator
builds (`HostLaunch.of_module`), and with argparse otherwise (workers/toolhost.py
`_parse_args`: argparse's import is 0.3 MB PSS of every host). Pinned here: whatever the fast
reading accepts, argparse reads the same; what it declines, argparse still answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from workers.child import HostLaunch
from workers.toolhost import _parse_args, _parse_with_argparse, _read_flags

_FLAGS = ["--role", "--workspace", "--cwd", "--extra-root", "--session-id", "--tools"]
_FLAGS += ["--read-deny", "--role=read_only", "--work", "--help", "-h", "--nope"]
_VALUES = st.sampled_from(["read_only", "read_write", "/w", "/w/sub", "-x", "--role", "", "[]"])


def _argv_after_module(launch: HostLaunch) -> list[str]:
    argv = list(launch.argv)
    return argv[argv.index("workers.toolhost") + 1 :]


@pytest.mark.parametrize("role", ["read_only", "read_write"])
def test_the_coordinator_s_argv_is_read_without_argparse_as_argparse_reads_it(role: str) -> None:
    launch = HostLaunch.of_module(
        "workers.toolhost",
        python=Path("/usr/bin/python3"),
        role=role,  # type: ignore[arg-type]
        workspace=Path("/repo"),
        cwd=Path("/repo/sub dir"),
        extra_roots=(Path("/extra/one"), Path("/extra/two")),
        tools="workers.toolhost:host_tools",
        session_id="s-1",
        read_deny=(("**/.env", "/repo"),),
    )
    args = _argv_after_module(launch)
    fast = _read_flags(args)
    assert fast is not None and fast == _parse_with_argparse(args)
    assert fast.extra_root == [Path("/extra/one"), Path("/extra/two")] and fast.role == role


@given(st.lists(st.tuples(st.sampled_from(_FLAGS), _VALUES), max_size=6), st.booleans())
@example([("--role", "read_only"), ("--workspace", "/w"), ("--cwd", "-x")], False)
@example([("--role=read_only", "--workspace"), ("/w", "/w")], False)
@example([("--workspace", "/w"), ("--role", "read_write"), ("--role", "read_only")], True)
@example([("--role", "/w"), ("--role", "read_only"), ("--workspace", "read_only")], False)
def test_whatever_the_fast_reading_accepts_argparse_reads_the_same(
    pairs: list[tuple[str, str]], odd: bool
) -> None:
    args = [word for pair in pairs for word in pair] + (["/w"] if odd else [])
    fast = _read_flags(args)
    try:
        slow = _parse_with_argparse(args)
    except SystemExit:  # argparse's error or help: the fast reading must have declined
        assert fast is None
        with pytest.raises(SystemExit):
            _parse_args(args)
        return
    assert fast is None or fast == slow
    assert _parse_args(args) == slow
