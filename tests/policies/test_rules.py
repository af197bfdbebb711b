"""Rule syntax and matching, table-driven: every form, every family, every path anchor."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.rules import (
    FAMILY_KEYWORDS,
    RuleSyntaxError,
    bash_rule_matches,
    compile_path_pattern,
    compile_rule,
    parse_rule,
)

WS = Path("/work/repo")
HOME = Path("/home/ann")
ANCHOR = Path("/home/ann/.config/warren")


@pytest.mark.parametrize(
    ("text", "tool", "kind", "specifier"),
    [
        ("Bash", "Bash", "tool", None),
        ("  Edit  ", "Edit", "tool", None),
        ("Bash(make check)", "Bash", "exact", "make check"),
        ("Bash( make check )", "Bash", "exact", "make check"),
        ("Bash(npm run test:*)", "Bash", "prefix", "npm run test"),
        ("Bash(git log --format=:*)", "Bash", "prefix", "git log --format="),
        ("Bash(echo (a))", "Bash", "exact", "echo (a)"),
        ("Read(.env)", "Read", "path", ".env"),
        ("Edit(src/**)", "Edit", "path", "src/**"),
        ("Write(//etc/**)", "Write", "path", "//etc/**"),
        ("Glob(~/notes)", "Glob", "path", "~/notes"),
        ("NotebookEdit(/nb/*.ipynb)", "NotebookEdit", "path", "/nb/*.ipynb"),
        ("dispatch_agent(reviewer)", "dispatch_agent", "agent", "reviewer"),
        ("mcp__github__create_issue", "mcp__github__create_issue", "tool", None),
        ("mcp__github", "mcp__github", "mcp_server", None),
        ("mcp__github__*", "mcp__github", "mcp_server", None),
        ("Think", "Think", "tool", None),
    ],
)
def test_parse(text: str, tool: str, kind: str, specifier: str | None) -> None:
    parsed = parse_rule(text)
    assert (parsed.tool, parsed.kind, parsed.specifier) == (tool, kind, specifier)
    assert parsed.text == text.strip()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty rule"),
        ("Bash(", "is not a rule"),
        ("Bash)", "is not a rule"),
        ("Bash()", "empty specifier"),
        ("Bash(  )", "empty specifier"),
        ("Bash(:*)", "empty prefix"),
        ("Bash(*)", "write `Bash`"),
        ("Bash(a:* b)", "may only end"),
        ("Bash(a:*:*)", "may only end"),
        ("mcp__srv__tool(x)", "MCP rules take no specifier"),
        ("mcp__", "mcp__server"),
        ("Read(~bob/x)", "~user"),
        ("Read(a\\b)", "backslash"),
        ("Read(a/***)", "***"),
        ("Bash(a\nb)", "control character"),
        ("dispatch_agent(two words)", "agent name"),
        ("1Bash", "is not a rule"),
        ("Bash (x)", "is not a rule"),
    ],
)
def test_parse_errors(text: str, fragment: str) -> None:
    with pytest.raises(RuleSyntaxError, match=None) as info:
        parse_rule(text)
    assert fragment in str(info.value)


def test_families() -> None:
    """Family keywords cover whatever tool declares the family; other keywords one tool."""
    assert dict(FAMILY_KEYWORDS) == {"Read": "read", "Edit": "edit"}
    edit = compile_rule(parse_rule("Edit"), anchor=WS, workspace=WS, home=HOME)
    assert all(edit.covers(tool, "edit") for tool in ("Edit", "Write", "MultiEdit", "Anything"))
    assert not edit.covers("Read", "read") and not edit.covers("Edit", None)
    read = compile_rule(parse_rule("Read(src/**)"), anchor=WS, workspace=WS, home=HOME)
    assert read.covers("Glob", "read") and not read.covers("Bash", "exec")
    write = compile_rule(parse_rule("Write(x)"), anchor=WS, workspace=WS, home=HOME)
    assert write.covers("Write", "edit") and not write.covers("Edit", "edit")
    assert parse_rule("Think(x)").kind == "path"  # the engine refuses it: Think takes no path
    server = compile_rule(parse_rule("mcp__gh"), anchor=WS, workspace=WS, home=HOME)
    assert server.covers("mcp__gh__issue") and not server.covers("mcp__ghx__issue")
    assert not server.covers("mcp__gh")


def matches(spec: str, path: str, *, anchor: Path = ANCHOR) -> bool:
    pattern = compile_path_pattern(spec, anchor=anchor, workspace=WS, home=HOME)
    return pattern.matches(path)


@pytest.mark.parametrize(
    ("spec", "path", "expected"),
    [
        # no slash: any depth below the workspace, like gitignore
        (".env", "/work/repo/.env", True),
        (".env", "/work/repo/sub/dir/.env", True),
        (".env", "/work/repo/.envrc", False),
        (".env", "/elsewhere/.env", False),
        ("*.env", "/work/repo/a/prod.env", True),
        ("*.env", "/work/repo/a/prod.env.bak", False),
        # a directory matches everything inside it
        ("secrets", "/work/repo/secrets/key", True),
        ("secrets/", "/work/repo/x/secrets/key", True),
        # a slash inside anchors to the workspace
        ("src/**", "/work/repo/src/a/b.py", True),
        ("src/**", "/work/repo/lib/src/a.py", False),
        ("src/*.py", "/work/repo/src/a.py", True),
        ("src/*.py", "/work/repo/src/sub/a.py", False),
        ("src/**/*.py", "/work/repo/src/a.py", True),
        ("src/**/*.py", "/work/repo/src/x/y/a.py", True),
        ("**/test_*.py", "/work/repo/test_a.py", True),
        ("**/test_*.py", "/work/repo/t/test_a.py", True),
        ("./src/a.py", "/work/repo/src/a.py", True),
        ("a?.txt", "/work/repo/ab.txt", True),
        ("a?.txt", "/work/repo/a/.txt", False),
        ("[abc].txt", "/work/repo/b.txt", True),
        ("[!abc].txt", "/work/repo/b.txt", False),
        ("[!abc].txt", "/work/repo/d.txt", True),
        ("a\\*b", "/work/repo/a*b", True),
        ("a\\*b", "/work/repo/axb", False),
        ("a[b", "/work/repo/a[b", True),
        # never a string-prefix test
        ("//work/repo", "/work/repo-evil/x", False),
        ("//work/repo", "/work/repo/x", True),
        # `/x`: relative to the defining file's directory
        ("/notes/**", "/home/ann/.config/warren/notes/a.md", True),
        ("/notes/**", "/work/repo/notes/a.md", False),
        # `~/`: home; `//`: absolute
        ("~/.aws/**", "/home/ann/.aws/credentials", True),
        ("~/.aws/**", "/work/repo/.aws/credentials", False),
        ("~", "/home/ann/anything", True),
        ("//etc/passwd", "/etc/passwd", True),
        ("//etc/*", "/etc/shadow", True),
        ("//", "/anything/at/all", True),
    ],
)
def test_path_patterns(spec: str, path: str, expected: bool) -> None:
    assert matches(spec, path) is expected


def test_anchor_of_a_project_file_is_the_project_root() -> None:
    assert matches("/src/**", "/work/repo/src/a.py", anchor=WS)
    assert not matches("/src/**", "/work/repo/lib/src/a.py", anchor=WS)


@pytest.mark.parametrize(
    ("kind", "spec", "command", "expected"),
    [
        ("exact", "make check", "make check", True),
        ("exact", "make check", "  make check  ", True),
        ("exact", "make check", "make check -j4", False),
        ("exact", "make check", "make  check", False),
        ("prefix", "npm run test", "npm run test", True),
        ("prefix", "npm run test", "npm run test --watch", True),
        ("prefix", "npm run test", "npm run testing", False),
        ("prefix", "npm run test", "npm run test:unit", False),
        ("prefix", "npm run test", "npm run tes", False),
        ("prefix", "git log --format=", "git log --format=oneline", True),
        ("prefix", "rm", "rm -rf x", True),
        ("prefix", "rm", "rmdir x", False),
    ],
)
def test_bash_specifiers(kind: str, spec: str, command: str, expected: bool) -> None:
    assert bash_rule_matches(kind, spec, command) is expected  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
@example("Read([z-a])")
@example("Read([?-.])")
def test_parse_never_raises_anything_else(text: str) -> None:
    try:
        parsed = parse_rule(text)
    except RuleSyntaxError:
        return
    compiled = compile_rule(parsed, anchor=ANCHOR, workspace=WS, home=HOME)
    assert compiled.text == text.strip()


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab*?[]!/\\.~-", max_size=16),
    st.lists(st.text(alphabet="ab.-*[]", min_size=1, max_size=4), max_size=5),
)
@example("[b-a]", ["a"])
def test_any_pattern_matches_any_path_without_error(spec: str, parts: list[str]) -> None:
    try:
        parsed = parse_rule(f"Read({spec})")
    except RuleSyntaxError:
        return
    compiled = compile_rule(parsed, anchor=ANCHOR, workspace=WS, home=HOME)
    path = "/".join(["/work/repo", *parts])
    compiled.matches_path((path,))


@pytest.mark.parametrize("spec", ["[z-a]", "[?-.]", "src/[b-a].py"])
def test_a_reversed_range_is_a_syntax_error_not_a_crash(spec: str) -> None:
    with pytest.raises(RuleSyntaxError, match="not a valid glob"):
        parse_rule(f"Read({spec})")
