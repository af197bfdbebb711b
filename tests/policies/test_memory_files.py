"""The pure parts of `policies.memory_files`: which `@references` are imports, the chain of
directories, and the deny-rule matcher the context probe uses in place of `PathPattern`."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.conversation import context_probe
from policies import memory_files
from policies.memory_files import find_imports, memory_chain, wire_denied
from policies.rules import compile_path_pattern


@pytest.mark.parametrize(
    ("text", "imports"),
    [
        ("@a.md", ["a.md"]),
        ("see @docs/a.md.", ["docs/a.md"]),
        ("(@docs/a.md) and @b.md,", ["b.md"]),
        ("mail someone@example.com", []),
        ("@~/notes.md @/abs/x.md", ["~/notes.md", "/abs/x.md"]),
        ("@with\\ space.md", ["with space.md"]),
        ("`@in-span.md` @out.md", ["out.md"]),
        ("```\n@fenced.md\n```\n@after.md", ["after.md"]),
        ("~~~md\n@fenced.md\n~~~", []),
        ("@a.md @a.md", ["a.md"]),
        ("@ alone", []),
    ],
)
def test_find_imports(text: str, imports: list[str]) -> None:
    assert find_imports(text) == imports


def test_an_import_in_parentheses_keeps_its_path() -> None:
    # `(@x)` has no blank before `@`: not an import, as in Claude Code.
    assert find_imports("(@docs/a.md)") == []


def test_memory_chain_runs_from_the_root_down() -> None:
    chain = memory_chain("/r", "/r/a/b")
    dirs = [str(Path(p).parent) for p in chain[:: len(memory_files.MEMORY_FILES)]]
    assert dirs == ["/r", "/r/a", "/r/a/b"]
    assert memory_chain("/elsewhere", "/r") == memory_chain("/r", "/r")


@pytest.mark.parametrize(
    ("root", "cwd"), [("r", "r"), ("r", "r/a/b"), ("r/a", "r"), ("r", "rx/a"), ("r/", "r/a/")]
)
def test_the_probe_skips_its_helpers_only_when_no_chain_name_exists(
    tmp_path: Path, root: str, cwd: str
) -> None:
    """`context_probe._any_memory_file` (its fast path) looks at the names `memory_chain`
    gives, each of which alone makes it load the helpers, whatever the name is."""
    base = str(tmp_path)
    root_path, cwd_path = f"{base}/{root}", f"{base}/{cwd}"
    Path(cwd_path).mkdir(parents=True, exist_ok=True)
    Path(root_path).mkdir(parents=True, exist_ok=True)
    assert not context_probe._any_memory_file(cwd_path, root_path)
    for name in memory_chain(root_path, cwd_path):
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).symlink_to("/nonexistent")  # a dangling link counts: gather decides
        assert context_probe._any_memory_file(cwd_path, root_path), name
        Path(name).unlink()


def test_the_probe_and_trust_know_the_same_names() -> None:
    assert context_probe.MEMORY_FILES == memory_files.MEMORY_FILES


SPECS = [
    ".env",
    "*.env",
    "secrets/**",
    "secrets",
    "docs/*.md",
    "**/private/*",
    "/anchored.md",
    "//abs/tree/**",
    "~/notes/*.md",
    "a?c/[bx]*",
]
PARTS = st.sampled_from([".env", "x.env", "secrets", "docs", "a.md", "private", "abc", "bz"])


@given(spec=st.sampled_from(SPECS), parts=st.lists(PARTS, min_size=0, max_size=4))
def test_wire_denied_agrees_with_path_pattern(spec: str, parts: list[str]) -> None:
    workspace, home = Path("/ws"), Path("/home/u")
    pattern = compile_path_pattern(spec, anchor=workspace, workspace=workspace, home=home)
    for base in ("/ws", "/home/u", "/abs/tree", "/ws-evil"):
        path = "/".join([base, *parts])
        assert wire_denied([pattern.wire()], path) == pattern.matches(path), (spec, path)
