"""Permission rules: the `Tool(specifier)` syntax, parsed once and matched per call.

Policy files list rules as strings (`allow = ["Bash(npm run test:*)", "Edit(src/**)"]`); the
engine (`policies.engine`) asks a `CompiledRule` whether it matches one call. Parsing is a pure
function of the text (`parse_rule`), so the loader can reject a bad rule with its file and
line before anything runs; compiling binds a parsed rule to the directories its paths are
relative to.

Forms:

- `Tool`: every call of that tool. `Read` and `Edit` name their family (below).
- `Bash(make check)`: exactly that command line (surrounding blanks ignored).
- `Bash(npm run test:*)`: the prefix `npm run test`, then the end or a blank (when the
  prefix ends with a letter, digit or `_`; after any other character anything may follow).
- `Bash(npm test *)`, `Bash(git * main)`, `Bash(* --version)`: Claude Code's wildcard form.
  Each `*` stands for any text, blanks included (`\\*` is a literal star, `\\\\` a
  backslash); a pattern whose only `*` ends it after a blank (`npm test *`) also matches the
  bare command (`npm test`), and the blank matters (`ls *` matches `ls -la`, not `lsof`). A
  `*` early in a rule makes it wide (`git * main` allows `git push origin main`), as in
  Claude Code. Allow rules match each simple command of a line on its own, so a `*` never
  reaches past `&&`, `;` or `|` into another command.
- `Bash(*)` is `Bash`, as in Claude Code.
- Path rules, for every tool that declares path fields (`ToolFacts.path_fields`), with
  gitignore-style globs (`*`, `?`, `[abc]`, `[!abc]`, `[[:digit:]]`, `**`; `*` and `**` see
  dotfiles; `{`, `!` first, `+(` are plain characters; a reversed range `[z-a]` and `..` are
  errors, since either would be a rule that silently matches nothing):
  `//abs/path` is the absolute path `/abs/path`; `~/x` is relative to the home directory;
  `/x` is relative to the directory of the file that defines the rule (for a project's
  `.warren/policy*.toml` that is the project root, the directory holding `.warren/`);
  anything else is relative to the workspace, and, as in gitignore, a pattern without a
  `/` (`*.env`, `.env`) matches at any depth. A pattern that matches a directory matches
  everything inside it, and `dir/**` matches `dir` itself as well as its contents.
- Families: `Read(...)` covers every tool of the `read` family (Read, Glob, Grep, LS, and any
  new one that declares it); `Edit(...)` every `edit` tool (Edit, Write, MultiEdit,
  NotebookEdit). `Write(...)`, `Glob(...)` and the others cover only their tool.
- `dispatch_agent(name)`: a subagent of that type.
- `WebFetch(domain:example.com)`: Claude Code's network rule, parsed and checked (a host
  name, `*.` in front for its subdomains); Warren has no network tool, so it matches no call
  (and every network call is denied by the floor).
- `mcp__server__tool` (one MCP tool) and `mcp__server` (every tool of that server).

Matching is string work on absolute paths that the engine resolved; it never touches disk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

from policies.claude_names import SUBAGENT_TOOL, WORKFLOW_TOOL
from policies.facts import Family

__all__ = [
    "FAMILY_KEYWORDS",
    "CompiledRule",
    "ParsedRule",
    "PathPattern",
    "RuleKind",
    "RuleSyntaxError",
    "bash_rule_matches",
    "compile_path_pattern",
    "compile_rule",
    "parse_rule",
    "wildcard_regex",
]

FAMILY_KEYWORDS: Final[Mapping[str, Family]] = MappingProxyType({"Read": "read", "Edit": "edit"})
"""Rule keywords that name a family of tools (`policies.facts`): `Read(...)` covers every tool
that declares the `read` family, `Edit(...)` every `edit` tool. Any other keyword names one
tool; which input field holds a tool's path is the tool's own fact, never a table here."""

RuleKind = Literal[
    "tool", "exact", "prefix", "wildcard", "path", "agent", "workflow", "mcp_server", "domain"
]

_RULE = re.compile(
    r"(?P<tool>mcp__[A-Za-z0-9_-]*__\*|[A-Za-z_][A-Za-z0-9_-]*)(?:\((?P<spec>.*)\))?", re.DOTALL
)
_AGENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_WORD_END = re.compile(r"[A-Za-z0-9_]")
_DOMAIN = re.compile(
    r"(?:\*\.)?(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
)
_UNESCAPED_STAR = re.compile(r"(?<!\\)(?:\\\\)*\*")


class RuleSyntaxError(ValueError):
    """A rule that does not parse; the loader turns it into a located `PolicyError`."""


@dataclass(frozen=True, slots=True)
class ParsedRule:
    """A rule's syntax, before it is bound to directories."""

    text: str
    """The rule as written, without surrounding blanks (what `show` and audit print)."""
    tool: str
    kind: RuleKind
    specifier: str | None = None
    """The command, prefix, path pattern or agent name; None for `tool` and `mcp_server`."""


def parse_rule(text: str) -> ParsedRule:
    """Parse one rule. Raises `RuleSyntaxError` with a message saying how to fix it."""
    stripped = text.strip()
    if not stripped:
        raise RuleSyntaxError("empty rule; write a tool name such as `Bash` or `Edit(src/**)`")
    match = _RULE.fullmatch(stripped)
    if match is None:
        raise RuleSyntaxError(
            f"`{stripped}` is not a rule: write `Tool` or `Tool(specifier)`, "
            "for example `Bash(make check)` or `Read(src/**)`"
        )
    tool, spec = match["tool"], match["spec"]
    if tool.startswith("mcp__"):
        return _parse_mcp(stripped, tool, spec)
    if spec is None:
        return ParsedRule(stripped, tool, "tool")
    if _CONTROL.search(spec):
        raise RuleSyntaxError(f"`{stripped}`: the specifier contains a control character")
    if not spec.strip():
        raise RuleSyntaxError(
            f"`{stripped}`: empty specifier; write `{tool}` to match every call of the tool"
        )
    if tool == "Bash":
        return _parse_bash(stripped, spec.strip())
    if tool == "WebFetch" and spec.strip().startswith("domain:"):
        domain = spec.strip().removeprefix("domain:")
        if _DOMAIN.fullmatch(domain) is None:
            raise RuleSyntaxError(
                f"`{stripped}`: `{domain}` is not a host name (write `domain:example.com`, "
                "or `domain:*.example.com` for its subdomains)"
            )
        return ParsedRule(stripped, tool, "domain", domain.lower())
    if tool in (SUBAGENT_TOOL, WORKFLOW_TOOL):  # `Task(reviewer)`, `Workflow(review)`
        name = spec.strip()
        what = "an agent" if tool == SUBAGENT_TOOL else "a saved workflow's"
        if _AGENT_NAME.fullmatch(name) is None:
            raise RuleSyntaxError(
                f"`{stripped}`: `{name}` is not {what} name (letters, digits, `_.:-`)"
            )
        return ParsedRule(stripped, tool, "agent" if tool == SUBAGENT_TOOL else "workflow", name)
    # Any other keyword with a specifier is a path rule: whether the tool takes a path is its
    # own fact (`ToolFacts.path_fields`), so a new file tool needs no change here.
    return ParsedRule(stripped, tool, "path", _check_path_spec(stripped, spec.strip()))


def _parse_mcp(text: str, tool: str, spec: str | None) -> ParsedRule:
    if spec is not None:
        raise RuleSyntaxError(
            f"`{text}`: MCP rules take no specifier; write `mcp__server__tool` or `mcp__server`"
        )
    name = tool.removeprefix("mcp__")
    if not name or name.startswith("_"):
        raise RuleSyntaxError(f"`{text}`: write `mcp__server` or `mcp__server__tool`")
    if name.endswith("__*"):
        return ParsedRule(text, tool.removesuffix("__*"), "mcp_server")
    server, sep, rest = name.partition("__")
    if not sep:
        return ParsedRule(text, tool, "mcp_server")
    if not rest or not server:
        raise RuleSyntaxError(f"`{text}`: write `mcp__server` or `mcp__server__tool`")
    return ParsedRule(text, tool, "tool")


def _parse_bash(text: str, spec: str) -> ParsedRule:
    if spec.endswith(":*"):
        prefix = spec[:-2].rstrip()
        if not prefix:
            raise RuleSyntaxError(
                f"`{text}`: empty prefix before `:*`; write `Bash` to match every command"
            )
        if ":*" in prefix:
            raise RuleSyntaxError(f"`{text}`: `:*` may only end a Bash rule")
        if _has_wildcard(prefix):
            raise RuleSyntaxError(
                f"`{text}`: `*` and `:*` cannot be mixed; write `Bash({prefix} *)`"
            )
        return ParsedRule(text, "Bash", "prefix", prefix)
    if spec == "*":
        return ParsedRule(text, "Bash", "tool")  # Claude Code: `Bash(*)` is `Bash`
    if ":*" in spec:
        raise RuleSyntaxError(f"`{text}`: `:*` may only end a Bash rule (`Bash(npm test:*)`)")
    if _has_wildcard(spec):
        return ParsedRule(text, "Bash", "wildcard", spec)
    return ParsedRule(text, "Bash", "exact", spec)


def _has_wildcard(spec: str) -> bool:
    """Does `spec` hold a `*` that no backslash escapes (Claude Code's wildcard form)?"""
    return _UNESCAPED_STAR.search(spec) is not None


def wildcard_regex(spec: str) -> str:
    """Claude Code's wildcard Bash specifier as a regular expression for `re.fullmatch`.

    `*` is any text (blanks and newlines included), `\\*` a star, `\\\\` a backslash; when the
    only `*` ends the pattern after a blank, the blank and what follows are optional
    (`git *` matches `git`), as Claude Code's `matchWildcardPattern` has it.
    """
    out: list[str] = []
    stars = 0
    index = 0
    while index < len(spec):
        char = spec[index]
        if char == "\\" and index + 1 < len(spec) and spec[index + 1] in "*\\":
            out.append(re.escape(spec[index + 1]))
            index += 2
            continue
        if char == "*":
            stars += 1
            out.append("(?s:.*)")
        else:
            out.append(re.escape(char))
        index += 1
    if stars == 1 and out[-1] == "(?s:.*)" and out[-2:-1] == [re.escape(" ")]:
        out[-2:] = ["(?s: .*)?"]
    return "".join(out)


def _check_path_spec(text: str, spec: str) -> str:
    if spec.startswith("~") and not (spec == "~" or spec.startswith("~/")):
        raise RuleSyntaxError(
            f"`{text}`: only `~/` (your home) is understood, not `~user`; "
            "write `//home/user/...` for someone else's home"
        )
    if "\\" in spec.replace("\\*", "").replace("\\?", "").replace("\\[", ""):
        raise RuleSyntaxError(f"`{text}`: a backslash may only escape `*`, `?` or `[`")
    if "***" in spec:
        raise RuleSyntaxError(f"`{text}`: `***` is not a glob; use `**` for any depth")
    if ".." in spec.split("/"):
        raise RuleSyntaxError(
            f"`{text}`: `..` cannot appear in a path rule (paths are matched resolved); "
            "write the directory as `//absolute/path` or `~/path`"
        )
    for component in spec.split("/"):
        reversed_range = _reversed_range(component)
        if reversed_range is not None:
            raise RuleSyntaxError(
                f"`{text}`: not a valid glob (the range `{reversed_range}` in `[...]` is "
                "reversed, so it could never match; write it low to high)"
            )
    return spec


# -- path patterns --

_GLOB_MAGIC = re.compile(r"[*?\[\\]")
_POSIX_CLASS = re.compile(
    r"\[:(alnum|alpha|ascii|blank|cntrl|digit|graph|lower|print|punct|space|upper|word|xdigit):\]"
)
_RANGE = None
"""In `_reversed_range`'s member list: the `-` between the two ends of a range."""


def _reversed_range(component: str) -> str | None:
    """The first reversed range (`z-a`) of a class in one path component, if any.

    wcmatch drops a reversed range without a word, which would make `Read([z-a])` a rule
    that never matches (and `[!z-a]` one that matches everything). This scans classes the
    way wcmatch's parser does (`_wcparse.WcParse._sequence`: a `[` with no `]` is literal, a
    `-` first or last or next to a POSIX class is a member), so a pattern passes here
    exactly when wcmatch keeps every range (test_rules: the wcmatch oracle property).
    """
    failed_at = -1  # like wcmatch's `bad_sequence`: a `[` before it is literal
    index = 0
    while index < len(component):
        char = component[index]
        if char == "\\":
            index += 2
            continue
        if char == "[" and index + 1 > failed_at:
            end, bad = _scan_class(component, index + 1)
            if bad is not None:
                return bad
            if end < 0:
                failed_at = -end
            else:
                index = end
                continue
        index += 1
    return None


def _scan_class(text: str, start: int) -> tuple[int, str | None]:
    """Scan the class whose `[` ends just before `start`.

    Returns (index after its `]`, None), or (-(index where the scan failed), None) when the
    `[` is literal, or (0, "z-a") for the first reversed range.
    """
    members: list[str | None] = []
    index = start
    end_range = 0
    escape_hyphen = -1
    last_posix = False

    def take() -> str | None:
        nonlocal index
        if index >= len(text):
            return None
        index += 1
        return text[index - 1]

    def posix() -> bool:
        nonlocal index
        match = _POSIX_CLASS.match(text, index - 1)
        if match is None:
            return False
        index = match.end()
        return True

    bad: str | None = None  # reported only when the class closes: else `[` is literal
    char = take()
    if char in ("!", "^"):
        char = take()
    if char == "[":
        last_posix = posix()
        members.append("[:posix:]" if last_posix else "[")
        char = take()
    elif char in ("-", "]"):
        members.append(char)
        char = take()
    while char != "]":
        if char is None:
            return -index, None
        if char == "-":
            if last_posix:
                members.append("-")
                last_posix = False
            elif index - 1 > escape_hyphen:
                members.append(_RANGE)
                escape_hyphen = index + 1
                end_range = index
            elif end_range and index - 1 >= end_range:
                bad = bad or _close_range(members, "-")
                end_range = 0
            else:
                members.append("-")
            char = take()
            continue
        last_posix = False
        if char == "[" and posix():
            last_posix = True
            if end_range and index - 1 >= end_range:
                members[-1] = "-"
            members.append("[:posix:]")
            char = take()
            continue
        if char == "\\":
            char = take()
            if char is None or char == "/":
                return -index, None
        elif char == "/":
            return -index, None
        if end_range and index - 1 >= end_range:
            bad = bad or _close_range(members, char)
            end_range = 0
        else:
            members.append(char)
        char = take()
    return (0, bad) if bad is not None else (index, None)


def _close_range(members: list[str | None], last: str) -> str | None:
    """End the range open in `members` with `last`: its text when reversed (wcmatch then
    drops both ends, `_wcparse.WcParse._sequence_range_check`), else None."""
    first = members[-2]
    if first is not None and len(first) == 1 and ord(last) < ord(first):
        del members[-2:]
        return f"{first}-{last}"
    members.append(last)
    return None


def _glob_regex(pattern: str, anchored: bool) -> re.Pattern[str]:
    """`pattern` (a relative glob) and everything below what it matches, as one regex.

    wcmatch does the globbing: `**` any depth (dotfiles included: DOTGLOB, so `secrets/**`
    covers `secrets/.hidden/x`), no brace, negation or extended globs. Imported here, on
    the first path a glob rule is asked about, because importing it costs more than the
    rest of loading a policy (tests/bench/bench_policy.py).
    """
    from wcmatch import glob

    flags = glob.GLOBSTAR | glob.DOTGLOB | glob.FORCEUNIX
    prefix = "" if anchored else "**/"
    include, _ = glob.translate([f"{prefix}{pattern}", f"{prefix}{pattern}/**"], flags=flags)
    return re.compile("|".join(f"(?:{regex})" for regex in include))


class PathPattern:
    """A compiled gitignore-style pattern below one root directory.

    The pattern's leading literal directories join the root, so most paths are turned away
    by a string comparison, a literal rest is compared as text, and only a real glob is
    matched by a regex, built on first use (`_glob_regex`).
    """

    __slots__ = ("_inside", "_literal", "_regex", "anchored", "glob", "root")

    root: str
    """Absolute, resolved, without a trailing `/` (except the filesystem root `/`)."""
    glob: str
    """The rest of the pattern, relative to `root`; `""` matches the root and all below."""
    anchored: bool
    """False for a pattern without `/`, which matches a name at any depth."""

    def __init__(self, root: str, glob: str, *, anchored: bool) -> None:
        self.root = root
        self.glob = glob
        self.anchored = anchored
        self._regex: re.Pattern[str] | None = None
        self._literal = _GLOB_MAGIC.search(glob) is None
        self._inside = "/" if root == "/" else root + "/"
        """What a path strictly below `root` starts with."""

    def __repr__(self) -> str:
        return f"PathPattern({self.root!r}, {self.glob!r}, anchored={self.anchored})"

    @property
    def regex(self) -> re.Pattern[str]:
        """Matches a path relative to `root` (`""` for the root itself)."""
        if self._regex is None:
            self._regex = _glob_regex(self.glob, self.anchored)
        return self._regex

    def wire(self) -> tuple[str, str, bool, str | None]:
        """This pattern as plain values for a process without wcmatch (the context probe:
        `policies.memory_files.wire_denied` matches them the way `matches` does)."""
        literal = _GLOB_MAGIC.search(self.glob) is None
        return self.root, self.glob, self.anchored, None if literal else self.regex.pattern

    def matches(self, path: str) -> bool:
        """Does the absolute, normalised `path` fall under this pattern? (Called for every
        line of a Grep result and every file of a start-up walk: no work here that the
        constructor could do once.)"""
        if path.startswith(self._inside):
            relative = path[len(self._inside) :]
        elif path == self.root:
            relative = ""
        else:
            return False  # `/repo-evil` is not inside `/repo`: never a string-prefix test
        if not self.glob:
            return True
        if self._literal:
            if self.anchored:
                return relative == self.glob or relative.startswith(self.glob + "/")
            return self.glob in relative.split("/")
        return self.regex.fullmatch(relative) is not None


def _root_text(path: Path) -> str:
    text = os.path.normpath(str(path))
    return "/" if text == "//" else text


def compile_path_pattern(spec: str, *, anchor: Path, workspace: Path, home: Path) -> PathPattern:
    """Bind a path specifier to its root (see the module docstring for the four forms)."""
    if spec.startswith("//"):
        root, pattern, anchored = Path("/"), spec[2:], True
    elif spec == "~" or spec.startswith("~/"):
        root, pattern, anchored = home, spec[2:], True
    elif spec.startswith("/"):
        root, pattern, anchored = anchor, spec[1:], True
    else:
        root, pattern = workspace, spec
        anchored = "/" in pattern.rstrip("/")
    parts = [part for part in pattern.split("/") if part not in ("", ".")]
    while parts[-1:] == ["**"]:
        # `secrets/**` also covers `secrets` itself, so listing or searching the directory
        # is covered by the rule that covers its files (test_engine: Grep on a linked dir).
        parts.pop()
    if anchored:
        while parts and _GLOB_MAGIC.search(parts[0]) is None:
            root = root / parts.pop(0)
    return PathPattern(_root_text(root), "/".join(parts), anchored=anchored)


# -- Bash specifiers --


def bash_rule_matches(kind: RuleKind, specifier: str, command: str) -> bool:
    """Does one command text (a whole line or one simple command) match a Bash rule?"""
    text = command.strip()
    if kind == "exact":
        return text == specifier
    if kind == "wildcard":
        return re.fullmatch(wildcard_regex(specifier), text) is not None
    if kind != "prefix" or not text.startswith(specifier):
        return False
    if len(text) == len(specifier):
        return True
    if _WORD_END.fullmatch(specifier[-1]) is None:
        return True  # `Bash(git log --format=:*)`: anything may follow `=`
    return text[len(specifier)] in " \t"


# -- compiled rules --


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A parsed rule bound to its directories, ready for matching."""

    parsed: ParsedRule
    family: Family | None = None
    """The family a family keyword (`Read`, `Edit`) covers; None: the rule names one tool."""
    path: PathPattern | None = None

    @property
    def text(self) -> str:
        return self.parsed.text

    def covers(self, tool: str, family: Family | None = None) -> bool:
        """Does this rule apply to calls of `tool` (of `family`, as the tool declares) at all,
        before looking at the input?"""
        if self.parsed.kind == "mcp_server":
            return tool.startswith(self.parsed.tool + "__")
        if self.family is not None:
            return family == self.family
        return tool == self.parsed.tool

    def matches_path(self, paths: tuple[str, ...]) -> bool:
        """A path rule against the candidate paths of a call (any one matching is a match)."""
        pattern = self.path
        return pattern is not None and any(pattern.matches(path) for path in paths)


def compile_rule(parsed: ParsedRule, *, anchor: Path, workspace: Path, home: Path) -> CompiledRule:
    """Bind `parsed` to the defining file's directory (`anchor`), the workspace and home.

    The three directories must already be absolute and resolved.
    """
    path = None
    if parsed.kind == "path":
        assert parsed.specifier is not None
        path = compile_path_pattern(parsed.specifier, anchor=anchor, workspace=workspace, home=home)
    family = None if parsed.kind == "mcp_server" else FAMILY_KEYWORDS.get(parsed.tool)
    return CompiledRule(parsed=parsed, family=family, path=path)
