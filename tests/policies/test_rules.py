"""Rule syntax and matching, table-driven: every form, every family, every path anchor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        ("Bash(*)", "Bash", "tool", None),
        ("Bash(npm test *)", "Bash", "wildcard", "npm test *"),
        ("Bash(git * main)", "Bash", "wildcard", "git * main"),
        ("Bash(python3 -m pytest *)", "Bash", "wildcard", "python3 -m pytest *"),
        ("Bash(a\\*b)", "Bash", "exact", "a\\*b"),
        ("Read(./src/**)", "Read", "path", "./src/**"),
        ("WebFetch(domain:Example.com)", "WebFetch", "domain", "example.com"),
        ("WebFetch(domain:*.example.com)", "WebFetch", "domain", "*.example.com"),
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
        ("Bash(git * main:*)", "cannot be mixed"),
        ("WebFetch(domain:exa mple.com)", "not a host name"),
        ("WebFetch(domain:)", "not a host name"),
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
        # Claude Code's wildcard form (code.claude.com/docs/en/permissions)
        ("wildcard", "npm test *", "npm test", True),
        ("wildcard", "npm test *", "npm test --watch a", True),
        ("wildcard", "npm test *", "npm testing", False),
        ("wildcard", "ls *", "ls -la", True),
        ("wildcard", "ls *", "lsof", False),
        ("wildcard", "ls*", "lsof", True),
        ("wildcard", "git * main", "git push origin main", True),
        ("wildcard", "git * main", "git checkout main", True),
        ("wildcard", "git * main", "git main", False),
        ("wildcard", "git * main", "git push origin main2", False),
        ("wildcard", "* --version", "node --version", True),
        ("wildcard", "python3 -m pytest *", "python3 -m pytest -q tests/x.py", True),
        ("wildcard", "python3 -m pytest *", "python3 -m pytestx", False),
        ("wildcard", "echo \\* *", "echo * a", True),
        ("wildcard", "echo \\* *", "echo x a", False),
        ("wildcard", "a * b *", "a x b", False),  # two stars: the trailing blank is required
        ("wildcard", "a * b *", "a x b y", True),
    ],
)
def test_bash_specifiers(kind: str, spec: str, command: str, expected: bool) -> None:
    assert bash_rule_matches(kind, spec, command) is expected  # type: ignore[arg-type]


def _claude_code_wildcard(pattern: str, command: str) -> bool:
    """Claude Code's `matchWildcardPattern`, restated: escapes, `*` as `.*` with DOTALL, the
    lone trailing ` *` optional. The oracle for the property below."""
    import re

    star, slash = "\x00S\x00", "\x00B\x00"
    text = pattern.strip().replace("\\\\", slash).replace("\\*", star)
    regex = re.escape(text).replace("\\*", ".*")
    regex = regex.replace(re.escape(star), "\\*").replace(re.escape(slash), "\\\\")
    if regex.endswith("\\ .*") and text.count("*") == 1:
        regex = regex[: -len("\\ .*")] + "( .*)?"
    return re.fullmatch(regex, command, re.DOTALL) is not None


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab *\\", min_size=1, max_size=10),
    st.text(alphabet="ab *\\", max_size=10),
)
@example("a *", "a")
@example("a\\**", "a*")
def test_wildcards_mean_what_claude_code_means(pattern: str, command: str) -> None:
    try:
        parsed = parse_rule(f"Bash({pattern})")
    except RuleSyntaxError:
        return
    if parsed.kind != "wildcard":
        return
    assert parsed.specifier is not None
    expected = _claude_code_wildcard(parsed.specifier, command.strip())
    assert bash_rule_matches("wildcard", parsed.specifier, command) is expected


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


# -- wcmatch globs: today's meaning kept, no silent rule --


@pytest.mark.parametrize(
    ("spec", "path", "expected"),
    [
        # `**` and `*` see dotfiles (DOTGLOB): a deny rule on a directory is not weakened
        ("secrets/**", "/work/repo/secrets/.hidden/x", True),
        ("secrets/**", "/work/repo/secrets/.key", True),
        ("secrets/**", "/work/repo/secrets", True),
        ("secrets/**", "/work/repo/secretsx/a", False),
        ("src/**/*.py", "/work/repo/src/.venv/lib/a.py", True),
        ("**/*.pem", "/work/repo/.certs/a.pem", True),
        ("*.env", "/work/repo/.config/.prod.env/x", True),
        ("*", "/work/repo/.env", True),
        ("~/.config/*/token", "/home/ann/.config/gh/token", True),
        # no brace, negation or extended globs: those characters are literal
        ("{a,b}.txt", "/work/repo/a.txt", False),
        ("{a,b}.txt", "/work/repo/{a,b}.txt", True),
        ("!x", "/work/repo/y", False),
        ("!x", "/work/repo/!x", True),
        ("+(a).txt", "/work/repo/a.txt", False),
        ("@(a|b)", "/work/repo/@(a|b)", True),
        ("a|b", "/work/repo/a", False),
        # classes
        ("[[:digit:]].log", "/work/repo/7.log", True),
        ("[a-c].log", "/work/repo/d.log", False),
        ("[^a-c].log", "/work/repo/d.log", True),
        ("[a-].log", "/work/repo/-.log", True),
        ("[]a].log", "/work/repo/].log", True),
        ("x[a/b]", "/work/repo/x[a/b]", True),
        # components: empty and `.` ones are dropped, a leading literal dir narrows the root
        ("src//a.py", "/work/repo/src/a.py", True),
        ("src/./a.py", "/work/repo/src/a.py", True),
        ("//work/repo", "/work/repo", True),
        ("//work/re*", "/work/repo-evil/x", True),
        ("//work/repo/*", "/work/repo-evil/x", False),
        # a file name with a newline is not a name without one
        ("src/a.py", "/work/repo/src/a.py\n", False),
        ("src/*.py", "/work/repo/src/a.py\n", False),
        (".env", "/work/repo/.env\n", False),
    ],
)
def test_wcmatch_globs(spec: str, path: str, expected: bool) -> None:
    assert matches(spec, path) is expected


@pytest.mark.parametrize(
    ("spec", "reversed_range"),
    [
        ("[z-a]", "z-a"),
        ("[?-.]", "?-."),
        ("src/[b-a].py", "b-a"),
        ("[az-a]", "z-a"),  # wcmatch would keep `[a]`: a narrower rule than written
        ("[!z-a]", "z-a"),  # wcmatch would match every character
        ("[^9-0]x", "9-0"),
        ("a/b/c[a-cz-y]", "z-y"),
        ("[\\[-\\*]", "[-*"),
        ("[a--]", None),  # `a`..`-` reversed only when `-` really ends the range: it does
    ],
)
def test_every_reversed_range_is_refused(spec: str, reversed_range: str | None) -> None:
    with pytest.raises(RuleSyntaxError) as info:
        parse_rule(f"Read({spec})")
    assert "not a valid glob" in str(info.value)
    if reversed_range is not None:
        assert f"`{reversed_range}`" in str(info.value)


@pytest.mark.parametrize(
    "spec", ["[a-z]", "[a-a]", "[-a]", "[a-]", "[]-a]", "[!-]", "[[:alpha:]-a]", "a[b", "[z-a"]
)
def test_ranges_that_are_not_reversed_are_kept(spec: str) -> None:
    parse_rule(f"Read({spec})")


@pytest.mark.parametrize("spec", ["../x", "src/../secrets", "//etc/../root", "~/..", "a/.."])
def test_dot_dot_is_refused_not_silently_unmatched(spec: str) -> None:
    with pytest.raises(RuleSyntaxError, match=r"`\.\.` cannot appear"):
        parse_rule(f"Read({spec})")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="[]!^-az?*\\:.AZ09", max_size=14))
@example("[z-a]")
@example("[x-[:alpha:]!]")
@example("[[:alpha:]-!]")
@example("[a-b-!]")
@example("[a--]")
@example("[-[z-a]")
@example("[\\*-!]")
@example("[[-!]")
@example("[a][z-a]")
@example("[a[z-a]")
def test_our_range_check_agrees_with_what_wcmatch_drops(component: str) -> None:
    """Oracle: wcmatch's parser, watched, drops a range exactly when `_reversed_range` says."""
    from wcmatch import _wcparse, glob

    from policies.rules import _reversed_range

    dropped: list[bool] = []  # per class wcmatch kept (a class that fails is a literal `[`)
    in_class: list[bool] = []
    check, sequence = _wcparse.WcParse._sequence_range_check, _wcparse.WcParse._sequence

    def watched_check(self: Any, result: list[str], last: str) -> bool:
        removed: bool = check(self, result, last)
        in_class[-1] = in_class[-1] or removed
        return removed

    def watched_sequence(self: Any, i: Any, current: list[str]) -> str:
        in_class.append(False)
        kept: str = sequence(self, i, current)  # raises StopIteration for a literal `[`
        dropped.append(in_class[-1])
        return kept

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_wcparse.WcParse, "_sequence_range_check", watched_check)
        patch.setattr(_wcparse.WcParse, "_sequence", watched_sequence)
        glob.translate(component, flags=glob.GLOBSTAR | glob.DOTGLOB | glob.FORCEUNIX)
    assert any(dropped) is (_reversed_range(component) is not None)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab./-[]", max_size=12).filter(lambda s: ".." not in s.split("/")),
    # paths come normalised (no `.` or `..` components: the engine resolves them first)
    st.lists(
        st.text(alphabet="ab.-[]", min_size=1, max_size=4).filter(lambda s: s not in (".", "..")),
        max_size=5,
    ),
    st.sampled_from(["", "//", "~/", "/", "src/"]),
)
@example("a", ["b", "a", "c"], "")
@example("a/b", ["a", "b", "c"], "")
@example("[a]", ["[a]"], "")
def test_the_literal_fast_path_agrees_with_the_glob(spec: str, parts: list[str], form: str) -> None:
    """A pattern without glob characters is compared as text; wcmatch must agree."""
    try:
        parse_rule(f"Read({form}{spec})")
    except RuleSyntaxError:
        return
    pattern = compile_path_pattern(f"{form}{spec}", anchor=ANCHOR, workspace=WS, home=HOME)
    for root in (str(WS), str(HOME), str(ANCHOR), "/"):
        path = "/".join([root.rstrip("/"), *parts]) or "/"
        if pattern.root != "/" and not (
            path == pattern.root or path.startswith(pattern.root + "/")
        ):
            continue
        relative = path[len(pattern.root) :].lstrip("/")
        by_regex = not pattern.glob or pattern.regex.fullmatch(relative) is not None
        assert pattern.matches(path) is by_regex, (pattern, path)
