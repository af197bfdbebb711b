"""The bash command analyser: may this command line run without asking, and in parallel?

The policy engine asks this module about every `Bash(command)` call. `BashAnalyser.classify`
parses the command with tree-sitter's bash grammar, finds every simple command in it
(across `&&`, `||`, `;`, `|`, `&`, newlines, subshells, groups, loops and, recursively, inside
`$(...)`, backticks and `<(...)`), and asks the catalogue (`policies.catalogue`) whether each
one is read-only. Around the simple commands it looks at what the shell itself does:
redirections that write files, assignments that change later commands (`PATH=...`), globs that
could expand to options (`find *` next to a file named `-delete`), function definitions.

A grammar is not bash. Wherever tree-sitter-bash and bash could disagree on where a word,
a comment, a here-document or a command ends (text the tree does not cover, tokens that do not
touch where bash would join them, `[ a > b ]`, backticks in here-documents, words after a
redirection, ...), the command is refused rather than trusted. The cases were found by
running random command lines through both and comparing with `bash -x`
(tests/policies/test_bash_properties.py); each is pinned in the table of
tests/policies/test_bash_analysis.py. Inputs known to crash the grammar are never parsed.

The answer is a `BashClassification` value. Whether a read-only command may run unasked
depends on the OS floor (DESIGN.md, "The floor and what it buys"):

- floor proven: a command whose every part is read-only gets `decision_hint="allow"` and is
  concurrency-safe, even with variable expansion or substitution inside it, because the
  kernel runs it with a read-only workspace;
- no floor: only the exact commands of `NO_FLOOR_EXACT_COMMANDS` are allowed.

Arithmetic and indirection run code hidden in variables (`x='a[$(cmd)]'; echo $((x))`), so
any arithmetic context or indirection whose operand is not a literal is not read-only
(tests/policies/test_bash_arithmetic.py proves each context in a real sandbox).

A critical delete (`policies.critical`: `rm -rf "$PWD"`, `cd .. && rm -rf ws`,
`find . -delete`, `.git`, ...) is flagged with `critical_delete`; the policy engine never
auto-approves it, in any mode. Every simple command is also spelled as deny and ask rules
see it (`views`, `policies.command_views`), through wrappers and literal `sh -c`/`eval`
scripts.

The analysis is a pure function of its inputs; the only state is the parser, which
`BashAnalyser` creates on first use and keeps for the next call.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Literal

from policies.catalogue import (
    CheckContext,
    Word,
    check_command,
    is_safe_env_assignment,
    is_shell_local_name,
    name_set,
    resolve_program,
    unwrap_wrapper,
)
from policies.command_views import CommandView, command_views
from policies.critical import DeleteCheck, cd_may_leave, delete_danger

if TYPE_CHECKING:
    from tree_sitter import Node, Parser, Tree

__all__ = [
    "MAX_COMMAND_CHARS",
    "NO_FLOOR_EXACT_COMMANDS",
    "BashAnalyser",
    "BashClassification",
    "CommandPart",
    "DecisionHint",
    "classify",
    "suggest_rule",
]


MAX_COMMAND_CHARS: Final = 10_000
"""Longer commands are not analysed at all: they always ask."""

NO_FLOOR_EXACT_COMMANDS: Final = frozenset(
    {
        "pwd",
        "ls",
        "ls -la",
        "date",
        "whoami",
        "true",
        # These trust the repository's git configuration (core.fsmonitor, diff.external),
        # as the early kernel's exact allowlist did; with the floor, .git/config is
        # read-only inside the sandbox and the question does not arise.
        "git status",
        "git diff",
        "git log",
        "git branch",
    }
)
"""Commands auto-approved when the floor is not proven, compared after collapsing blanks.

Without the floor nothing enforces a classification, so only commands that cannot be
steered by their arguments, variables or redirections are allowed, spelled exactly.
"""

DecisionHint = Literal["allow", "ask"]

_SCRIPT_RUNNERS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", ".", "source"})
"""Programs that run a script: from a file operand, or read from their input without one."""
_SUBSTITUTION = re.compile(r"\$\(|`|<\(")
_HIDDEN_DELETE = re.compile(
    r"\b(?:rm|unlink|rmdir|shred|truncate|mv)\b"
    r"|\bfind\b[^\n]*?-delete\b"
    r"|\bgit\s+(?:-\S+\s+)*clean\b"
    r"|\bgit\s+(?:-\S+\s+)*reset\b[^;&|\n]*--hard"
)
"""A deleting or truncating command anywhere in a command's text, strings included: what a
text evaluated past the analyser's sight (`$((x))`, `eval "$v"`) may be hiding."""
_MAX_NESTED_SCRIPTS = 3  # `sh -c "sh -c '...'"` depth searched for critical deletes
_MAX_WRAPPERS = 8
_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_WRITE_OPERATORS = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})
_READ_OPERATORS = frozenset({"<", "<&", "<&-", ">&-"})

_NO_FLOOR_SHAPE = re.compile(r"[ \t]*([A-Za-z-]+(?:[ \t]+[A-Za-z-]+)*)[ \t]*")
_PREFIX_WORD = re.compile(r"[A-Za-z][A-Za-z0-9._:-]*")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_JOINED = re.compile(rb"(?:\\\n)*")
_METACHARACTERS = frozenset({b" ", b"\t", b"\n", b";", b"&", b"|", b"(", b")", b"<", b">"})
_GAP = re.compile(rb"(?:[ \t\n]|\\\n)*")
_CONTIGUOUS_NODES = frozenset({"concatenation", "simple_expansion", "string", "translated_string"})
_BLANKS = re.compile(rb"(?:[ \t]|\\\n)*")
_ARITHMETIC_ASSIGNS = re.compile(r"(?:^|[^=!<>])=(?!=)|<<=|>>=|\+\+|--")
# Arithmetic evaluates the text of every variable it names, recursively, and a subscript in
# that text runs its `$(...)`: `x='a[$(rm f)]'; echo $((x))` runs rm. Only expressions made
# of integer constants and operators are read-only (tests/policies/test_bash_arithmetic.py).
# `$#`, `$?`, `$$` and `$!` always expand to integers (or nothing).
_ARITHMETIC_CONSTANT = re.compile(
    r"\b(?:[0-9]+#[0-9A-Za-z@_]+|0[xX][0-9A-Fa-f]+|[0-9]+)\b|\$(?:[#?$!]|\{[#?$!]\})"
)
_ARITHMETIC_OPERATORS = re.compile(r"[ \t\n+\-*/%<>=!&|^~?:(),]*")
_INTEGER_WORD = re.compile(
    r"[-+]?(?:0[xX][0-9A-Fa-f]+|[0-9]+(?:#[0-9A-Za-z@_]+)?)|(\"?)\$(?:[#?$!]|\{[#?$!]\})\1"
)
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPED = re.compile(r"\\.", re.DOTALL)
_ANY_METACHARACTER = re.compile(r"[|&;()<> \t\n]")
_ARITHMETIC_TESTS = name_set("-eq -ne -lt -le -gt -ge")
_INDIRECT_TESTS = name_set("-v -R")
_ARITHMETIC_DANGER = "a variable holding `a[$(cmd)]` runs cmd"
# Programs for which a "don't ask again" prefix rule would allow anything at all.
_NO_PREFIX_RULE = name_set(
    "sh bash zsh dash ksh fish eval exec source . xargs sudo doas env timeout nice nohup"
    " time stdbuf command builtin rm python python3 python2 node perl ruby php deno bun"
    " npx uvx bunx pnpx find awk gawk mawk sed"
)
# Programs whose first word after the name says what they do: a prefix rule must name it.
_NEEDS_SUBCOMMAND = name_set(
    "git npm pnpm yarn cargo go uv pip pip3 pipx docker podman kubectl gh make just"
    " poetry hatch tox nox"
)


@dataclass(frozen=True, slots=True)
class CommandPart:
    """One simple command found in the command line."""

    words: tuple[str, ...]
    """The argv words as written (quotes and all), without assignments and redirections."""
    values: tuple[str | None, ...] = ()
    """The same words after quote removal, `None` where a word is not known before the shell
    runs it (expansions, substitutions, globs). Empty for parts that are not simple commands."""
    assignments: tuple[str, ...] = ()
    """`NAME=value` words before the command (or a bare assignment's own text)."""
    program: str | None = None
    """The program that runs, after resolving `/usr/bin/x` and unwrapping `timeout`,
    `env`, `nice`, ... (`None` when unknown)."""
    read_only: bool = False
    reason: str | None = None
    """Why this part is not read-only (None when it is)."""
    nested: bool = False
    """Inside a command or process substitution."""

    @property
    def text(self) -> str:
        return " ".join((*self.assignments, *self.words))


@dataclass(frozen=True, slots=True)
class BashClassification:
    """What the analyser found out about one command line."""

    command: str
    read_only: bool
    """Every part is a catalogued read-only command and nothing writes (no write
    redirection, no variable that changes later commands), and the command parsed. Does not
    depend on the floor."""
    decision_hint: DecisionHint
    """`allow` when the command may run without asking under the given floor, else `ask`."""
    hint_reason: str
    """Why the hint is what it is, for the audit log and the question shown to the user."""
    concurrency_safe: bool
    """May run in parallel with other safe calls: true exactly when auto-approved."""
    floor: bool
    """The floor value the hint was computed for."""
    parts: tuple[CommandPart, ...] = ()
    """Simple commands in source order; nested ones (in substitutions) follow their host."""
    reasons: tuple[str, ...] = ()
    """Why the command is not read-only (empty when it is)."""
    parse_ok: bool = True
    too_long: bool = False
    critical_delete: bool = False
    """A critical delete (`policies.critical`): the workspace, an ancestor, `.git`, `/`, `~`,
    or a recursive delete of anything but a literal path strictly inside the workspace."""
    critical_reason: str | None = None
    """What the critical delete would destroy, for the question shown to the user."""
    views: tuple[CommandView, ...] = ((None,),)
    """Every simple command as deny and ask rules see it (`policies.command_views`),
    including those of literal `sh -c` and `eval` scripts; `(None,)` stands for code the
    analyser cannot read (a script that is not literal, a line that did not parse)."""
    has_command_substitution: bool = False
    has_process_substitution: bool = False
    has_expansion: bool = False
    """Parameter, arithmetic, tilde, brace or pathname expansion anywhere."""
    has_redirection: bool = False
    """Any redirection, including `2>&1`, here-documents and here-strings."""
    has_write_redirection: bool = False
    has_heredoc: bool = False

    @property
    def has_substitution(self) -> bool:
        return self.has_command_substitution or self.has_process_substitution


class BashAnalyser:
    """Classifies bash command lines; holds the tree-sitter parser between calls.

    Create one per session (the policy engine holds it) and call `classify` for every Bash
    call. The parser is created on first use, so constructing an analyser costs nothing and
    importing this module does not load tree-sitter. An analyser is not thread-safe (a
    tree-sitter parser is not); Warren calls it from the trio thread only.
    """

    def __init__(self) -> None:
        self._parser: Parser | None = None
        self.git_risk: str | None = None
        """Why git may not run without asking in this workspace (its context probe's
        finding, `orchestrator.conversation.context_probe`), set before the first call is
        classified; None: git's read-only commands are read-only."""

    def _parse(self, source: bytes) -> Tree:
        if self._parser is None:
            import tree_sitter_bash
            from tree_sitter import Language, Parser

            self._parser = Parser(Language(tree_sitter_bash.language()))
        return self._parser.parse(source)

    def classify(
        self, command: str, *, floor: bool, workspace: Path | None = None
    ) -> BashClassification:
        """Classify `command` for auto-approval under the given floor.

        `workspace` is the workspace root: `git -C DIR` is read-only only inside it, and
        deleting it is a critical delete. Never raises on any input text.
        """
        return self._classify(command, floor=floor, workspace=workspace, depth=0)

    def _classify(
        self, command: str, *, floor: bool, workspace: Path | None, depth: int
    ) -> BashClassification:
        if len(command) > MAX_COMMAND_CHARS:
            return BashClassification(
                command=command,
                read_only=False,
                decision_hint="ask",
                floor=floor,
                hint_reason=f"the command is longer than {MAX_COMMAND_CHARS} characters",
                concurrency_safe=False,
                parse_ok=False,
                too_long=True,
                reasons=(f"the command is longer than {MAX_COMMAND_CHARS} characters",),
            )
        source, problem = _source_for_parser(command)
        walk = _Walk(self, source, workspace, depth)
        if problem is None:
            tree = self._parse(source)
            walk.run(tree.root_node)
            parse_ok = not tree.root_node.has_error
            if not parse_ok:
                walk.reasons.insert(0, f"the command could not be parsed{_error_hint(tree)}")
        else:
            parse_ok = False
            walk.reasons.append(problem)
        reasons = tuple(dict.fromkeys(walk.reasons))
        read_only = parse_ok and not reasons and all(part.read_only for part in walk.parts)
        hint: DecisionHint = "ask"
        if not parse_ok:
            hint_reason = "the command could not be parsed"
        elif walk.critical:
            hint_reason = walk.critical_reason or "the command deletes a critical path"
        elif not read_only:
            hint_reason = reasons[0] if reasons else "the command is not read-only"
        elif floor:
            hint, hint_reason = "allow", "read-only, and the sandbox enforces it"
        elif _is_no_floor_exact(command):
            hint, hint_reason = "allow", "on the short list of commands allowed without the floor"
        else:
            hint_reason = (
                "read-only, but without a proven sandbox only a few exact commands run unasked"
            )
        return BashClassification(
            command=command,
            read_only=read_only,
            decision_hint=hint,
            hint_reason=hint_reason,
            concurrency_safe=hint == "allow",
            floor=floor,
            parts=tuple(walk.parts),
            reasons=reasons,
            parse_ok=parse_ok,
            critical_delete=walk.critical,
            critical_reason=walk.critical_reason if walk.critical else None,
            views=tuple(walk.views) if parse_ok else (*walk.views, (None,)),
            has_command_substitution=walk.has_command_substitution,
            has_process_substitution=walk.has_process_substitution,
            has_expansion=walk.has_expansion,
            has_redirection=walk.has_redirection,
            has_write_redirection=walk.has_write_redirection,
            has_heredoc=walk.has_heredoc,
        )

    def suggest_rule(self, command: str) -> str:
        """The rule to save for a "don't ask again" answer to `command`.

        A prefix rule (`Bash(npm run test:*)`) only for one simple command made of plain
        words, without redirections, pipes, substitutions, expansions or assignments, whose
        program cannot run arbitrary code through its arguments; otherwise the exact command
        (`Bash(<command>)`). The prefix is the program and up to two following
        subcommand-like words (`npm run test`, `cargo test`, `make check`).
        """
        text = command.strip()
        exact = f"Bash({text})"
        source, problem = _source_for_parser(text)
        if not text or len(text) > MAX_COMMAND_CHARS or "\n" in text or problem is not None:
            return exact
        root = self._parse(source).root_node
        if root.has_error or root.child_count != 1 or root.children[0].type != "command":
            return exact
        walk = _Walk(self, source, None, 0)
        words: list[str] = []
        for child in root.children[0].children:
            node = child.named_children[0] if child.type == "command_name" else child
            if node.type not in ("word", "number"):
                return exact
            word = walk.word(node)
            if word.value is None or word.value != word.text:
                return exact
            words.append(word.value)
        name, _ = resolve_program(words[0]) if words else (None, None)
        if name is None or name in _NO_PREFIX_RULE:
            return exact
        prefix = [words[0]]
        for word_text in words[1:3]:
            if _PREFIX_WORD.fullmatch(word_text) is None:
                break
            prefix.append(word_text)
        if len(prefix) == 1 and name in _NEEDS_SUBCOMMAND:
            return exact
        return f"Bash({' '.join(prefix)}:*)"


def classify(command: str, *, floor: bool, workspace: Path | None = None) -> BashClassification:
    """One-off classification with a fresh analyser; hold a `BashAnalyser` for repeated use."""
    return BashAnalyser().classify(command, floor=floor, workspace=workspace)


def suggest_rule(command: str) -> str:
    """One-off `BashAnalyser.suggest_rule` with a fresh analyser."""
    return BashAnalyser().suggest_rule(command)


def _source_for_parser(command: str) -> tuple[bytes, str | None]:
    """The bytes to parse, or why the command must not be given to the parser at all."""
    if "\x00" in command:
        return b"", "the command contains a NUL character"
    try:
        source = command.encode("utf-8")
    except UnicodeEncodeError:
        return b"", "the command contains characters that are not valid UTF-8"
    brace = command.find("{")
    if brace >= 0 and _ASTRAL.search(command, brace):
        # tree-sitter-bash 0.25 reads out of bounds (SIGSEGV on Linux) on a `{` followed,
        # anywhere later, by a character outside the BMP: tree-sitter/tree-sitter-bash#337.
        # A crash here would take the coordinator down, so such commands are not parsed
        # (tests/policies/test_bash_properties.py::test_parser_crash_inputs_are_not_parsed).
        return (
            b"",
            "the command has `{` before a character outside the BMP, which the parser cannot take",
        )
    return source, None


def _is_no_floor_exact(command: str) -> bool:
    match = _NO_FLOOR_SHAPE.fullmatch(command)
    return match is not None and " ".join(match.group(1).split()) in NO_FLOOR_EXACT_COMMANDS


def _error_hint(tree: Tree) -> str:
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            snippet = node.text.decode("utf-8", "replace")[:40] if node.text else ""
            return f" (near `{snippet}`)" if snippet.strip() else ""
        stack.extend(reversed(node.children))
    return ""


# --- words --------------------------------------------------------------------------------

# Kinds of the pieces a word is built from.
_UNQUOTED, _QUOTED, _EXPANSION, _HOME, _GUARDED, _OPAQUE, _BRACE = range(7)
_ANSI_SIMPLE: Final[Mapping[str, str]] = MappingProxyType(
    {
        "a": "\a",
        "b": "\b",
        "e": "\x1b",
        "E": "\x1b",
        "f": "\f",
        "n": "\n",
        "r": "\r",
        "t": "\t",
        "v": "\v",
        "\\": "\\",
        "'": "'",
        '"': '"',
        "?": "?",
    }
)
_DQ_ESCAPABLE = frozenset('$`"\\')
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:%+=,@^-]*")  # no quoting, escapes or expansions
_PARAMETER_START = re.compile(r"[A-Za-z0-9_{(\[@*#?$!-]")


def _decode_ansi_c(body: str) -> str | None:
    """Bash's `$'...'` decoding, or None when the result is not plain text we can trust."""
    out: list[str] = []
    index = 0
    length = len(body)
    while index < length:
        char = body[index]
        if char != "\\" or index + 1 >= length:
            out.append(char)
            index += 1
            continue
        escape = body[index + 1]
        simple = _ANSI_SIMPLE.get(escape)
        if simple is not None:
            out.append(simple)
            index += 2
            continue
        if escape in "01234567":
            end = index + 1
            while end < length and end < index + 4 and body[end] in "01234567":
                end += 1
            code = int(body[index + 1 : end], 8)
            index = end
        elif escape in "xuU":
            limit = {"x": 2, "u": 4, "U": 8}[escape]
            end = index + 2
            while (
                end < length and end < index + 2 + limit and body[end] in "0123456789abcdefABCDEF"
            ):
                end += 1
            if end == index + 2:
                out.append("\\" + escape)
                index = end
                continue
            code = int(body[index + 2 : end], 16)
            index = end
            if escape != "x":
                if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    return None
                out.append(chr(code))
                continue
        elif escape == "c":
            return None
        else:
            out.append("\\" + escape)
            index += 2
            continue
        if code == 0 or code >= 0x80:
            return None  # a NUL ends the string; high bytes are not characters
        out.append(chr(code))
    return "".join(out)


@dataclass(slots=True)
class _WordBuilder:
    chars: list[str] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)

    def literal(self, text: str, kind: int) -> None:
        self.chars.extend(text)
        self.kinds.extend([kind] * len(text))

    def marker(self, kind: int) -> None:
        self.chars.append("")
        self.kinds.append(kind)

    def finish(self, text: str) -> Word:
        chars, kinds = self.chars, self.kinds
        first: int | None = None
        first_kind: Literal["expansion", "glob", "opaque"] | None = None
        brace_stack: list[list[int]] = []  # [index of `{`, separator seen]
        brace_at: int | None = None
        for index, (char, kind) in enumerate(zip(chars, kinds, strict=True)):
            if kind == _UNQUOTED:
                if char in "*?[" or (
                    char == "("
                    and index > 0
                    and kinds[index - 1] == _UNQUOTED
                    and chars[index - 1] in "@!+"
                ):
                    where = index - 1 if char == "(" else index
                    if first is None or where < first:
                        first, first_kind = where, "glob"
                elif char == "{":
                    brace_stack.append([index, 0])
                elif brace_stack and (
                    char == ","
                    or (
                        char == "."
                        and index + 1 < len(chars)
                        and chars[index + 1] == "."
                        and kinds[index + 1] == _UNQUOTED
                    )
                ):
                    brace_stack[-1][1] = 1  # `{a,b}` or `{1..3}`: a brace expansion
                elif char == "}" and brace_stack:
                    opened, separated = brace_stack.pop()
                    if separated and (brace_at is None or opened < brace_at):
                        brace_at = opened
            elif kind != _QUOTED and first is None:
                first = index
                first_kind = (
                    "glob" if kind == _BRACE else "opaque" if kind == _OPAQUE else "expansion"
                )
        if brace_at is not None and (first is None or brace_at < first):
            first, first_kind = brace_at, "glob"
        view: list[str] = []
        for index, (char, kind) in enumerate(zip(chars, kinds, strict=True)):
            if kind in (_UNQUOTED, _QUOTED):
                view.append("\x02" if index == brace_at else char)
            elif kind == _HOME:
                view.append("~")
            elif kind in (_GUARDED, _OPAQUE):
                view.append("\x01")
            elif kind == _BRACE:
                view.append("\x02")
        if first is None:
            value = "".join(chars)
            return Word(text=text, value=value, prefix=value, critical_view="".join(view))
        return Word(
            text=text,
            value=None,
            prefix="".join(chars[:first]),
            first_unknown=first_kind,
            critical_view="".join(view),
            only_globs=all(kind in (_UNQUOTED, _QUOTED, _BRACE) for kind in kinds),
        )


# --- the walk -----------------------------------------------------------------------------


class _Walk:
    """One analysis: walks the syntax tree once, collecting parts, reasons and flags."""

    def __init__(
        self, analyser: BashAnalyser, source: bytes, workspace: Path | None, depth: int
    ) -> None:
        self.analyser = analyser
        self.source = source
        self.workspace = workspace
        self.context = CheckContext(workspace=workspace, git_risk=analyser.git_risk)
        self.depth = depth
        self.parts: list[CommandPart] = []
        self.reasons: list[str] = []
        self.critical = False
        self.critical_reason: str | None = None
        self.relative_deletes: list[str] = []
        self.views: list[CommandView] = []
        self.cwd_may_leave = False
        self.opaque: str | None = None
        """Why part of the text is evaluated later, past what the analyser sees (arithmetic
        on a variable, `let`, `declare -i`, `eval` or `sh -c` of text not known)."""
        self.in_pipeline_after_first = False
        """The command being looked at reads its input from a pipe (`... | sh`)."""
        self.generated: str | None = None
        """Why text made while the command runs is then run as a script (`base64 -d | sh`,
        `bash <(...)`, `eval "$(...)"`)."""
        self.has_command_substitution = False
        self.has_process_substitution = False
        self.has_expansion = False
        self.has_redirection = False
        self.has_write_redirection = False
        self.has_heredoc = False
        self.extra_args: dict[int, list[Node]] = {}
        self.live_heredocs: set[int] = set()

    # The walk is iterative: a 10,000-character command can nest deeper than Python's
    # recursion limit (tests/policies/test_bash_analysis.py::test_deep_nesting).
    def run(self, root: Node) -> None:
        stack: list[tuple[Node, int]] = [(root, 0)]
        covered = 0  # source bytes accounted for by the leaves seen so far
        while stack:
            node, nesting = stack.pop()
            kind = node.type
            inner = nesting
            if (node.child_count == 0 or kind == "heredoc_body") and node.end_byte > covered:
                if node.start_byte > covered:
                    self._check_gap(covered, node.start_byte)
                covered = node.end_byte
            if not node.is_named and node.child_count == 0 and self.text(node) != kind:
                # A token whose text is not what its type says: the external scanner lost
                # its place (`xxd -fprint0<<'EOF'` without a closing line gives a `<<`
                # token reading `-fprint`, and drops the argument).
                self.reasons.append(f"the analyser misreads `{self.text(node)[:40]}`")
            if kind == "comment":
                self._check_comment(node)
                continue
            if kind in _CONTIGUOUS_NODES:
                self._check_contiguous(node)
            handler = _HANDLERS.get(kind)
            if handler is not None:
                handler(self, node, nesting)
            elif node.is_named and kind not in _PLAIN_NODES:
                self.reasons.append(f"the analyser does not understand `{kind}` nodes")
            if kind in ("command_substitution", "process_substitution"):
                inner = nesting + 1
            stack.extend((child, inner) for child in reversed(node.children))
        if covered < len(self.source):
            self._check_gap(covered, len(self.source))
        if self.cwd_may_leave and self.relative_deletes and not self.critical:
            self._set_critical(
                f"{self.relative_deletes[0]} runs after a `cd` that may leave the workspace: "
                "the relative path may then be the workspace itself or something outside it"
            )
        self._check_hidden_deletes()

    def _check_hidden_deletes(self) -> None:
        """A delete the analyser cannot see is treated as a critical one (issue 33, class 6):
        text made as the command runs and then run, whatever it holds; text evaluated past
        the analyser's sight, when the command's text holds a deleting command anywhere,
        strings included."""
        if self.critical:
            return
        if self.generated is not None:
            self._set_critical(
                f"{self.generated}: what it runs is made as the command runs, so no delete in "
                "it can be seen before"
            )
            return
        if self.opaque is not None:
            found = _HIDDEN_DELETE.search(self.source.decode("utf-8", "replace"))
            if found is not None:
                self._set_critical(
                    f"{self.opaque}, and the command holds `{found.group(0).strip()[:30]}`: "
                    "a delete inside text evaluated later cannot be seen before it runs"
                )

    def _opaque(self, why: str) -> None:
        if self.opaque is None:
            self.opaque = why

    def _generated(self, why: str) -> None:
        if self.generated is None:
            self.generated = why

    def _set_critical(self, reason: str) -> None:
        if not self.critical:
            self.critical = True
            self.critical_reason = reason
            self.reasons.append(reason)

    def _check_gap(self, start: int, end: int) -> None:
        """Text between two tokens must be blanks: anything else the grammar skipped is
        text bash reads (`\\ cat` runs a command named ` cat`; the tree shows `cat`).

        Line continuations alone do not separate words: bash deletes them, so `!\\<newline>tee`
        is the command `!tee`, not `! tee`.
        """
        if not _GAP.fullmatch(self.source, start, end):
            self.reasons.append(
                f"`{self._slice(start, end).strip()[:40]}` is text the analyser cannot place"
            )
        elif (
            _JOINED.fullmatch(self.source, start, end)
            and start > 0
            and end < len(self.source)
            and self.source[start - 1 : start] not in _METACHARACTERS
            and self.source[end : end + 1] not in _METACHARACTERS
        ):
            self.reasons.append("bash joins into one word what the analyser reads as two")

    def _check_comment(self, node: Node) -> None:
        """bash starts a comment only at the start of a word: `]#x` and `ls\\<newline>#`
        are words to bash, which tree-sitter-bash reads as comments."""
        start = node.start_byte
        before = self.source[start - 1 : start]
        if start > 0 and (
            before not in _METACHARACTERS or self.source[start - 2 : start] == b"\\\n"
        ):
            self.reasons.append("a `#` the analyser reads as a comment is part of a word to bash")

    def _check_contiguous(self, node: Node) -> None:
        """The pieces of one word must touch: the grammar can glue a word across a newline
        (`<<<$` newline `a` reads as `$a`; bash runs `a` as a command)."""
        position = node.start_byte
        for child in node.children:
            if child.start_byte != position:
                self.reasons.append(
                    f"`{self.text(node)[:40]}` is one word to the analyser but not to bash"
                )
                return
            position = child.end_byte

    # -- words --

    def text(self, node: Node) -> str:
        return self.source[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def word(self, node: Node) -> Word:
        if node.type in ("word", "number"):
            text = self.text(node)
            if _PLAIN_WORD.fullmatch(text):  # the common case: nothing to decode
                return Word(text=text, value=text, prefix=text, critical_view=text)
        builder = _WordBuilder()
        self._add_word(builder, node)
        word = builder.finish(self.text(node))
        if word.first_unknown is not None:
            self.has_expansion = True
        return word

    def _add_word(self, builder: _WordBuilder, node: Node) -> None:
        kind = node.type
        if kind == "word":
            self._add_unquoted(builder, self.text(node))
        elif kind == "number":
            builder.literal(self.text(node), _UNQUOTED)
        elif kind == "raw_string":
            builder.literal(self.text(node)[1:-1], _QUOTED)
        elif kind == "string":
            self._add_double_quoted(builder, node)
        elif kind == "ansi_c_string":
            decoded = _decode_ansi_c(self.text(node)[2:-1])
            if decoded is None:
                builder.marker(_OPAQUE)
            else:
                builder.literal(decoded, _QUOTED)
        elif kind in ("concatenation", "translated_string"):
            children = node.children
            for index, child in enumerate(children):
                if child.is_named:
                    self._add_word(builder, child)
                elif (
                    child.type == "$"
                    and index + 1 < len(children)
                    and (children[index + 1].type == "string")
                ):
                    continue  # `$"..."`: a translated string is its string
                elif self.text(child) == "$":
                    builder.literal("$", _UNQUOTED)
                else:
                    # Loose tokens such as `$$` (the shell's PID) or an empty backtick
                    # substitution: never literal text.
                    builder.marker(_OPAQUE)
        elif kind == "simple_expansion" or kind == "expansion":
            builder.marker(self._expansion_kind(node))
        elif kind in ("command_substitution", "process_substitution", "arithmetic_expansion"):
            builder.marker(_EXPANSION)
        elif kind == "brace_expression":
            builder.marker(_BRACE)
        elif not node.is_named and self.text(node) == "$":
            builder.literal("$", _UNQUOTED)
        else:
            builder.marker(_OPAQUE)

    def _expansion_kind(self, node: Node) -> int:
        names = [child for child in node.children if child.type == "variable_name"]
        operators = {child.type for child in node.children if not child.is_named}
        if len(names) == 1 and self.text(names[0]) == "HOME" and operators <= {"$", "${", "}"}:
            return _HOME
        if operators & {":?", "?"}:
            return _GUARDED
        return _EXPANSION

    def _add_unquoted(self, builder: _WordBuilder, text: str) -> None:
        index = 0
        length = len(text)
        if not builder.chars and text.startswith("~"):
            end = text.find("/")
            end = length if end < 0 else end
            builder.marker(_EXPANSION if text[1:end] in ("+", "-") else _HOME)
            index = end
        while index < length:
            char = text[index]
            if char == "\\":
                if index + 1 >= length:
                    builder.literal("\\", _QUOTED)
                elif text[index + 1] != "\n":
                    builder.literal(text[index + 1], _QUOTED)
                index += 2
                continue
            if char == "`" or (
                char == "$" and index + 1 < length and _PARAMETER_START.match(text, index + 1)
            ):
                builder.marker(_OPAQUE)  # an expansion the grammar left inside a word
                index += 1
                continue
            if char == "~" and index > 0 and text[index - 1] in "=:":
                builder.marker(_HOME)  # bash expands `a=~` and `PATH=x:~/bin` too
                index += 1
                continue
            builder.literal(char, _UNQUOTED)
            index += 1

    def _add_double_quoted(self, builder: _WordBuilder, node: Node) -> None:
        text = self.text(node)
        if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
            builder.marker(_OPAQUE)  # the grammar folded something else into the quotes
            return
        position = node.start_byte + 1
        end = node.end_byte - 1
        for child in node.children:
            if not child.is_named or child.type == "string_content":
                continue
            if child.start_byte > position:
                builder.literal(_unescape_dq(self._slice(position, child.start_byte)), _QUOTED)
            if child.type in ("simple_expansion", "expansion"):
                builder.marker(self._expansion_kind(child))
            elif child.type in ("command_substitution", "arithmetic_expansion"):
                builder.marker(_EXPANSION)
            else:
                builder.marker(_OPAQUE)
            position = child.end_byte
        if end > position:
            builder.literal(_unescape_dq(self._slice(position, end)), _QUOTED)

    def _slice(self, start: int, end: int) -> str:
        return self.source[start:end].decode("utf-8", "replace")

    # -- simple commands --

    def command(self, node: Node, nesting: int) -> None:
        assignments: list[Node] = []
        word_nodes: list[Node] = []
        placed: list[Node] = []  # the children bash reads as words, in order
        children = node.children
        for index, child in enumerate(children):
            kind = child.type
            if not child.is_named:
                following = children[index + 1] if index + 1 < len(children) else None
                if (
                    self.text(child) == "$"
                    and following is not None
                    and following.type == "string"
                    and following.start_byte == child.end_byte
                ):
                    continue  # `$"..."`: a translated string is its string
                # Tokens the grammar leaves loose in a command (`$`, `$$`, `==`) are words
                # to bash: `tee $` writes a file named `$`.
                word_nodes.append(child)
                placed.append(child)
            elif kind == "variable_assignment":
                placed.append(child)
                assignments.append(child)
            elif kind == "command_name":
                named = child.named_children
                word_nodes.append(named[0] if named else child)
                placed.append(child)
            elif kind in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
                if kind == "file_redirect" and _redirect_parts(child)[2]:
                    self.reasons.append(
                        "words after a redirection are parsed differently by bash and the analyser"
                    )
            else:
                word_nodes.append(child)
                placed.append(child)
        self._check_coverage(node, placed)
        # Digits right before `<` or `>` name a file descriptor to bash, but the grammar
        # sometimes keeps them as an argument (`awk 0<&- 'PROGRAM'` would make `0` the awk
        # program and hide the real one).
        word_nodes = [
            word_node
            for word_node in word_nodes
            if not (
                self.text(word_node).isdigit()
                and self.source[word_node.end_byte : word_node.end_byte + 1] in (b"<", b">")
            )
        ]
        word_nodes.extend(self.extra_args.pop(node.id, ()))
        words = [self.word(word_node) for word_node in word_nodes]
        assignment_texts = tuple(self.text(assignment) for assignment in assignments)
        self.in_pipeline_after_first = _piped_into(node)
        reason, program = self._simple_command(words, assignments)
        if reason is not None:
            self.reasons.append(reason)
        self.parts.append(
            CommandPart(
                words=tuple(word.text for word in words),
                values=tuple(word.value for word in words),
                assignments=assignment_texts,
                program=program,
                read_only=reason is None,
                reason=reason,
                nested=nesting > 0,
            )
        )

    def _check_coverage(self, node: Node, placed: Sequence[Node]) -> None:
        """Make sure bash splits this command into the words the tree shows.

        Between two children there may only be blanks and line continuations: any other
        text was dropped by the grammar (`tee \\ ` parses as `tee`; bash writes a file named
        ` `). Two words with nothing but `\\<newline>` (or nothing) between them are one
        word to bash (`-del\\<newline>ete` is `-delete`).
        """
        children = node.children
        for before, after in pairwise(children):
            if not _BLANKS.fullmatch(self.source, before.end_byte, after.start_byte):
                self.reasons.append("part of the command is text the analyser cannot place")
                return
        for before, after in pairwise(placed):
            if _JOINED.fullmatch(self.source, before.end_byte, after.start_byte):
                self.reasons.append("bash joins into one word what the analyser reads as two")
                return

    def _simple_command(
        self, words: Sequence[Word], assignments: Sequence[Node]
    ) -> tuple[str | None, str | None]:
        """(why not read-only or None, the program that runs)."""
        reasons: list[str] = []
        if not words:
            for assignment in assignments:
                name = self._assigned_name(assignment)
                if not is_shell_local_name(name):
                    reasons.append(f"`{name}=...` assigns a variable that later commands use")
            return (reasons[0] if reasons else None), None
        program, inner, unwrap_reason = self._resolve(words)
        self._check_deletes(words)
        self._collect_views(words)
        if program is not None and inner is not None:
            self._check_evaluation(program, inner)
        if program in ("cd", "pushd", "popd") and (
            program != "cd" or inner is None or cd_may_leave(inner, self.workspace)
        ):
            self.cwd_may_leave = True
        for assignment in assignments:
            name = self._assigned_name(assignment)
            value = self._assigned_value(assignment)
            if not is_safe_env_assignment(name, value):
                reasons.append(f"`{name}=...` changes how `{program or words[0].text}` runs")
        for word in words:
            if word.first_unknown == "opaque" and word.glob_could_be_flag:
                reasons.append(f"`{word.text}` is a word the analyser cannot read")
                break
            if word.glob_could_be_flag:
                reasons.append(f"`{word.text}` could expand to a file name starting with `-`")
                break
        if unwrap_reason is not None:
            reasons.append(unwrap_reason)
        elif program is not None and inner is not None:
            verdict = check_command(program, inner, self.context)
            if verdict is not None:
                reasons.append(verdict)
        return (reasons[0] if reasons else None), program

    def _resolve(
        self, words: Sequence[Word]
    ) -> tuple[str | None, Sequence[Word] | None, str | None]:
        """Resolve the program through benign wrappers: (program, its arguments, reason).

        The arguments are None when the wrapper itself decided (`command -v x`, bare `env`).
        """
        current: Sequence[Word] = words
        for _ in range(_MAX_WRAPPERS):
            head = current[0]
            if head.value is None:
                return None, None, f"the command name `{head.text}` is not known before it runs"
            program, why = resolve_program(head.value)
            if program is None:
                return None, None, why
            unwrapped = unwrap_wrapper(program, current[1:])
            if unwrapped is None:
                return program, current[1:], None
            if unwrapped.inner is None:
                return program, None, None if unwrapped.read_only else unwrapped.reason
            current = unwrapped.inner
        return None, None, "too many nested wrapper commands"

    def _assigned_name(self, assignment: Node) -> str:
        for child in assignment.children:
            if child.type == "variable_name":
                return self.text(child)
            if child.type == "subscript":
                names = [c for c in child.children if c.type == "variable_name"]
                return self.text(names[0]) if names else self.text(child)
        return self.text(assignment).split("=", 1)[0]

    def _assigned_value(self, assignment: Node) -> str | None:
        seen_equals = False
        for child in assignment.children:
            if not child.is_named and child.type in ("=", "+="):
                seen_equals = True
            elif seen_equals and child.is_named:
                return self.word(child).value
        return ""

    # -- critical deletes --

    def _check_deletes(self, words: Sequence[Word]) -> None:
        if self.critical:
            return
        check: DeleteCheck = delete_danger(words, self.workspace)
        if check.danger is not None:
            self._set_critical(check.danger)
        elif check.relative is not None:
            self.relative_deletes.append(check.relative)

    def _check_evaluation(self, program: str, args: Sequence[Word]) -> None:
        """Text evaluated or run as a script that the analyser cannot read before: `let`,
        a shell or `source` given a script made by a substitution (`bash <(...)`), a shell
        reading its script from a pipe (`base64 -d | sh`)."""
        name = posixpath.basename(program)
        if name == "let":
            self._opaque("`let` evaluates its arguments as arithmetic")
        if name not in _SCRIPT_RUNNERS:
            return
        operands = [w for w in args if not (w.value or "-x").startswith("-") or w.value is None]
        script = operands[0] if operands else None
        if script is not None and script.value is None and _SUBSTITUTION.search(script.text):
            self._generated(f"`{name} {script.text[:30]}` runs a script made by a substitution")
        elif script is not None and script.value in ("/dev/stdin", "/proc/self/fd/0", "-"):
            self._generated(f"`{name} {script.value}` runs the script its input hands it")
        elif (
            script is None
            and name not in (".", "source")
            and not any(w.value in ("-c", "-i") for w in args)
            and self.in_pipeline_after_first
        ):
            self._generated(f"`{name}` runs the script its pipe hands it")

    def _collect_views(self, words: Sequence[Word]) -> None:
        """Views for deny and ask rules; a literal `sh -c`/`eval` script is parsed as well,
        for its views and its critical deletes (`sh -c 'rm -rf /'`)."""
        found = command_views([word.value for word in words])
        self.views.extend(found.views)
        for script in found.scripts:
            if script is None:
                self._opaque(f"`{words[0].text}` runs text that is not known before it runs")
                if any(w.value is None and ("$(" in w.text or "`" in w.text) for w in words):
                    self._generated(f"`{words[0].text}` runs the output of a substitution")
            if script is None or self.depth >= _MAX_NESTED_SCRIPTS:
                self.views.append((None,))
                continue
            if not script.strip():
                continue
            inner = self.analyser._classify(
                script, floor=True, workspace=self.workspace, depth=self.depth + 1
            )
            self.views.extend(inner.views)
            if inner.critical_delete:
                self._set_critical(
                    f"`{words[0].text}` runs `{script[:40]}`: {inner.critical_reason}"
                )

    # -- everything else the shell does --

    def redirected_statement(self, node: Node, nesting: int) -> None:
        body = node.child_by_field_name("body")
        for child in node.children:
            if child.type != "file_redirect":
                continue
            extra = _redirect_parts(child)[2]
            if not extra:
                continue
            if body is not None and body.type == "command":
                self.extra_args.setdefault(body.id, []).extend(extra)
            else:
                self.reasons.append(
                    "words after a redirection are parsed differently by bash and the analyser"
                )

    def file_redirect(self, node: Node, nesting: int) -> None:
        self.has_redirection = True
        operator, destination, _ = _redirect_parts(node)
        for before, after in pairwise(node.children):
            if not _BLANKS.fullmatch(self.source, before.end_byte, after.start_byte):
                # A line end inside a redirection ends the command to bash: the grammar reads
                # `>&-` and a word on the next line as one redirection, bash as two commands
                # (tests/policies/test_bash_properties.py found `cat >&-\n\\\ncat`).
                self.reasons.append("the analyser reads a redirection across a line end")
                break
        for child in node.children:
            if child.type == "file_descriptor" and not self.text(child).isdigit():
                # The grammar takes any word before `>` as a descriptor: `sort -o2>/dev/null`
                # is `sort -o 2` with stdout redirected to bash, which writes the file `2`.
                self.reasons.append(
                    f"`{self.text(child)}` before a redirection is an argument to bash"
                )
        words = [child for child in node.children if child.is_named]
        for before, after in pairwise(words):
            if _JOINED.fullmatch(self.source, before.end_byte, after.start_byte):
                # `>/dev/null` and a word touching it are one target to bash.
                self.reasons.append("bash joins into one word what the analyser reads as two")
                break
        target = self.word(destination) if destination is not None else None
        if operator in _READ_OPERATORS:
            if operator == "<" and target is not None:
                self.views.append(("<", target.value))  # the file read, for `Read(...)` rules
            return  # reading, or duplicating or closing a descriptor for reading
        if (
            operator == ">&"
            and target is not None
            and target.value is not None
            and (target.value.isdigit() or target.value == "-")
        ):
            return  # `2>&1`, `>&2`, `>&-`: duplicating or closing a file descriptor
        if operator in _WRITE_OPERATORS:
            if target is not None and target.value in _SINKS:
                return
            self.has_write_redirection = True
            where = target.text if target is not None else "?"
            self.reasons.append(f"write redirection to `{where}`")
            return
        self.reasons.append(f"the redirection `{self.text(node)}` is not understood")

    def heredoc_redirect(self, node: Node, nesting: int) -> None:
        self.has_redirection = True
        self.has_heredoc = True
        start = next((c for c in node.children if c.type == "heredoc_start"), None)
        end = next((c for c in node.children if c.type == "heredoc_end"), None)
        delimiter = self.text(start) if start is not None else ""
        closing = self.text(end) if end is not None else None
        if closing is not None and node.children[0].type == "<<-":
            closing = closing.lstrip("\t")
        if closing != re.sub(r"[\\'\"]", "", delimiter):
            # bash ends the here-document at the first line that is exactly the delimiter
            # (or at the end of the input); anything else means the two disagree on where
            # the commands after it start.
            self.reasons.append("the here-document does not end where bash ends it")
        if not any(quote in delimiter for quote in "'\"\\"):
            for child in node.children:
                if child.type == "heredoc_body":
                    self.live_heredocs.add(child.id)

    def heredoc_body(self, node: Node, nesting: int) -> None:
        """Look for substitutions the grammar left as text in an expanding here-document.

        tree-sitter-bash parses `$(...)` in a here-document body but not backticks, which
        bash runs all the same (tests/policies/test_bash_analysis.py, "heredoc backtick").
        """
        if node.id not in self.live_heredocs:
            return
        position = node.start_byte
        pieces: list[str] = []
        for child in node.children:
            if child.type == "heredoc_content":
                continue
            pieces.append(self._slice(position, child.start_byte))
            position = child.end_byte
        pieces.append(self._slice(position, node.end_byte))
        if any(_has_unparsed_substitution(piece) for piece in pieces):
            self.reasons.append("a here-document contains a substitution the analyser cannot see")

    def string_content(self, node: Node, nesting: int) -> None:
        if _has_unparsed_substitution(self.text(node)):
            self.reasons.append(
                f"`{self.text(node)[:40]}` contains a substitution the analyser cannot see"
            )

    def word_node(self, node: Node, nesting: int) -> None:
        """Catch words where tree-sitter-bash and bash disagree about where words end.

        The grammar can swallow a newline and the next line into one word (`ls` newline
        `\\rm x` parses as `ls` with two arguments; bash runs `rm x`), and leaves backticks it
        did not parse as text. An unquoted word never holds an unescaped metacharacter in
        bash, so one in a word node means the tree is not what bash will run.
        """
        text = self.text(node)
        if _has_unparsed_substitution(text):
            self.reasons.append(f"`{text[:40]}` contains a substitution the analyser cannot see")
        elif _has_metacharacter(text):
            self.reasons.append(
                f"`{text[:40]}` holds a command separator the analyser cannot place"
            )

    def herestring_redirect(self, node: Node, nesting: int) -> None:
        self.has_redirection = True

    def variable_assignment(self, node: Node, nesting: int) -> None:
        # `a[ 1 ]=x` is three words to bash (and runs the command `a[`), one assignment
        # to the grammar: an assignment word has no blanks outside quotes.
        self._check_contiguous(node)
        for child in node.children:
            if child.type == "subscript":
                self._check_contiguous(child)
        parent = node.parent
        if parent is not None and parent.type in ("command", "declaration_command"):
            return  # judged with the command it prefixes
        name = self._assigned_name(node)
        reason = None
        if not is_shell_local_name(name):
            reason = f"`{name}=...` assigns a variable that later commands use"
            self.reasons.append(reason)
        self.parts.append(
            CommandPart(
                words=(),
                assignments=(self.text(node),),
                read_only=reason is None,
                reason=reason,
                nested=nesting > 0,
            )
        )

    def array(self, node: Node, nesting: int) -> None:
        """`a=([i]=1)`: an element's `[INDEX]` is arithmetic, as in `a[i]=1`."""
        for child in node.named_children:
            text = self.text(child)
            if text.startswith("[") and "]=" in text:
                index = text[1 : text.index("]=")]
                if not _INTEGER_WORD.fullmatch(index):
                    self.reasons.append(
                        f"the index of `{text[:40]}` is evaluated as arithmetic: "
                        f"{_ARITHMETIC_DANGER}"
                    )

    def statement_part(self, node: Node, nesting: int, reason: str) -> None:
        self.reasons.append(reason)
        self.parts.append(
            CommandPart(
                words=tuple(self.text(node).split()),
                read_only=False,
                reason=reason,
                nested=nesting > 0,
            )
        )

    def declaration_command(self, node: Node, nesting: int) -> None:
        keyword = node.children[0].type if node.children else "declare"
        self.statement_part(node, nesting, f"`{keyword}` changes shell variables")
        for child in node.children[1:]:
            flags = self.text(child)
            if child.type == "word" and flags.startswith("-") and "i" in flags:
                # An integer variable evaluates every value assigned to it as arithmetic.
                self._opaque(f"`{keyword} {flags}` evaluates what is assigned as arithmetic")

    def unset_command(self, node: Node, nesting: int) -> None:
        self.statement_part(node, nesting, "`unset` removes shell variables or functions")

    def function_definition(self, node: Node, nesting: int) -> None:
        self.reasons.append("defining a shell function changes what later commands run")

    def test_command(self, node: Node, nesting: int) -> None:
        opener = node.children[0].type if node.children else "["
        reason = None
        if not self._reserved_word_delimited(node):
            # `[a]` or `[]` is a command (or glob) named that way to bash, not a test.
            reason = f"`{self.text(node)[:40]}` is not a test to bash"
            self.reasons.append(reason)
        elif (problem := self._test_evaluation(node, opener)) is not None:
            reason = problem
            self.reasons.append(reason)
            self._opaque(problem.split(":", 1)[0])
        elif opener == "[" and _has_anonymous(node, frozenset({">", ">>"})):
            # bash reads `[ a > b ]` as `[ a ]` with its output redirected to the file b.
            reason = "`>` inside `[ ]` is a write redirection"
            self.has_write_redirection = True
            self.reasons.append(reason)
        self.parts.append(
            CommandPart(
                words=tuple(self.text(node).split()),
                program=opener,
                read_only=reason is None,
                reason=reason,
                nested=nesting > 0,
            )
        )

    def _test_evaluation(self, node: Node, opener: str) -> str | None:
        """Why a test evaluates text as code, or None.

        `[[ A -eq B ]]` (and `-ne`, `-lt`, ...) evaluates both operands as arithmetic, so a
        name or expansion there runs what its value's subscripts hold; `-v NAME` and `-R NAME`
        evaluate a subscript in NAME, in any kind of test. `[ "$x" -eq 1 ]` does not: the
        `[` builtin wants plain integers (tests/policies/test_bash_arithmetic.py proves both).
        """
        stack = list(node.children)
        while stack:
            child = stack.pop()
            if child.type in ("command_substitution", "process_substitution"):
                continue
            if child.type in ("binary_expression", "unary_expression"):
                operators = [c for c in child.children if c.type == "test_operator"]
                operator = self.text(operators[0]) if operators else ""
                operands = [c for c in child.named_children if c.type != "test_operator"]
                if opener == "[[" and operator in _ARITHMETIC_TESTS:
                    for operand in operands:
                        if not _INTEGER_WORD.fullmatch(self.text(operand)):
                            return (
                                f"`[[ {operator} ]]` evaluates `{self.text(operand)[:30]}` as "
                                f"arithmetic: {_ARITHMETIC_DANGER}"
                            )
                if operator in _INDIRECT_TESTS:
                    for operand in operands:
                        if not _VARIABLE_NAME.fullmatch(self.text(operand)):
                            return (
                                f"`{operator} {self.text(operand)[:30]}` evaluates a variable "
                                "name that is not literal, whose subscript can run commands"
                            )
            stack.extend(child.children)
        return None

    def for_statement(self, node: Node, nesting: int) -> None:
        if node.children and node.children[0].type == "select":
            self.reasons.append("`select` reads choices interactively")
        for child in node.children:
            if child.type == "variable_name" and not is_shell_local_name(self.text(child)):
                self.reasons.append(
                    f"the loop assigns `{self.text(child)}`, which later commands use"
                )

    def c_style_for_statement(self, node: Node, nesting: int) -> None:
        self.reasons.append("an arithmetic `for` loop assigns shell variables")

    def compound_statement(self, node: Node, nesting: int) -> None:
        if node.children and node.children[0].type == "((":
            self._arithmetic(node)
        elif not self._reserved_word_delimited(node):
            # bash runs `{}` or `{ls;}` as commands named `{}` and `{ls`, not as a group.
            self.reasons.append(f"`{self.text(node)[:40]}` is not a command group to bash")

    def _reserved_word_delimited(self, node: Node) -> bool:
        """Whether the opening and closing tokens of `[ ]`, `[[ ]]` or `{ }` stand alone.

        bash recognises them only as separate words (`}` and `]]` after a command end):
        tree-sitter-bash also accepts `[a]` and `{}`, which bash reads as plain words.
        """
        children = node.children
        if len(children) < 2:
            return False
        opener, closer = children[0], children[-1]
        if closer.is_missing:
            return True  # a parse error already
        after = self.source[opener.end_byte : opener.end_byte + 1]
        if after not in (b" ", b"\t", b"\n"):
            return False
        before = self.source[: closer.start_byte].rstrip(b" \t")
        if opener.type == "{":
            return before.endswith((b";", b"&", b"\n"))
        return len(before) < closer.start_byte

    def arithmetic_expansion(self, node: Node, nesting: int) -> None:
        self.has_expansion = True
        self._arithmetic(node)

    def _arithmetic(self, node: Node) -> None:
        text = self.text(node)
        if _ARITHMETIC_ASSIGNS.search(text):
            self.reasons.append("the arithmetic expression assigns a shell variable")
        inner = text.removeprefix("$").lstrip("([").rstrip(")]")
        if not _ARITHMETIC_OPERATORS.fullmatch(_ARITHMETIC_CONSTANT.sub(" ", inner)):
            self.reasons.append(
                f"`{text[:40]}` evaluates variables as arithmetic: {_ARITHMETIC_DANGER}"
            )
            self._opaque(f"`{text[:40]}` evaluates variables as arithmetic")

    def subscript(self, node: Node, nesting: int) -> None:
        """An indexed array's subscript is arithmetic (`${a[i]}`, `a[i]=1`, `${!a[i]}`)."""
        children = node.children
        opened = next((i for i, c in enumerate(children) if c.type == "["), None)
        if opened is None:
            return
        index = "".join(self.text(c) for c in children[opened + 1 :] if c.type != "]")
        if index in ("@", "*") or _INTEGER_WORD.fullmatch(index):
            return
        self.reasons.append(
            f"the subscript of `{self.text(node)[:40]}` is evaluated as arithmetic: "
            f"{_ARITHMETIC_DANGER}"
        )
        self._opaque(f"the subscript of `{self.text(node)[:40]}` is evaluated as arithmetic")

    def expansion(self, node: Node, nesting: int) -> None:
        self.has_expansion = True
        children = node.children
        text = self.text(node)
        if len(children) > 2 and children[1].type == "!":
            target = children[2]
            listing = len(children) > 3 and children[3].type in ("*", "@")  # `${!prefix*}`
            if target.type != "subscript" and not listing:
                self.reasons.append(
                    f"`{text[:40]}` expands the variable named by another one's value, whose "
                    "subscript can run commands"
                )
                self._opaque(f"`{text[:40]}` expands a variable another one names")
        colon = next((i for i, c in enumerate(children) if c.type == ":"), None)
        if colon is not None and (
            children[-1].type != "}"
            or any(c.type != "number" and c.type != ":" for c in children[colon + 1 : -1])
        ):
            # `${s:OFFSET:LENGTH}`: both are arithmetic.
            self.reasons.append(
                f"`{text[:40]}` evaluates a substring offset as arithmetic: {_ARITHMETIC_DANGER}"
            )
            self._opaque(f"`{text[:40]}` evaluates a substring offset as arithmetic")
        if "@P" in self.text(node):
            self.reasons.append(
                f"`{self.text(node)[:40]}` expands a value as a prompt, which runs substitutions"
            )
        if any(not child.is_named and child.type in ("=", ":=") for child in node.children):
            self.reasons.append(f"`{self.text(node)}` assigns a shell variable")

    def simple_expansion(self, node: Node, nesting: int) -> None:
        self.has_expansion = True

    def brace_expression(self, node: Node, nesting: int) -> None:
        self.has_expansion = True

    def command_substitution(self, node: Node, nesting: int) -> None:
        self.has_command_substitution = True

    def process_substitution(self, node: Node, nesting: int) -> None:
        self.has_process_substitution = True


def _piped_into(node: Node) -> bool:
    """Whether the command `node` reads its input from a pipe: it stands after the first
    command of a pipeline (redirections around it looked through)."""
    child = node
    parent = node.parent
    while parent is not None and parent.type == "redirected_statement":
        child, parent = parent, parent.parent
    if parent is None or parent.type != "pipeline":
        return False
    first = next((c for c in parent.named_children), None)
    return first is not None and first.id != child.id


def _redirect_parts(redirect: Node) -> tuple[str | None, Node | None, list[Node]]:
    """(operator, target, words the grammar attached that bash reads as arguments).

    tree-sitter-bash hangs the words after a redirection on it: in `cat x >out y` and in
    `tee>&-x` (close stdout, then the argument `x`), bash passes `y` and `x` to the command.
    """
    operator = next((child.type for child in redirect.children if not child.is_named), None)
    words = [
        child
        for child in redirect.children
        if child.is_named and child.type not in ("file_descriptor", "ERROR")
    ]
    if operator in ("<&-", ">&-"):
        return operator, None, words
    return operator, (words[0] if words else None), words[1:]


def _unescape_dq(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            if following == "\n":
                index += 2
                continue
            if following in _DQ_ESCAPABLE:
                out.append(following)
                index += 2
                continue
        out.append(char)
        index += 1
    return "".join(out)


def _unescaped(text: str) -> str:
    """`text` with each backslash-escaped character, with its backslash, made one neutral `_`:
    what is left is what bash reads unescaped (an escaped `$` cannot start `$(`, and no two
    characters an escape kept apart become neighbours)."""
    return _ESCAPED.sub("_", text) if "\\" in text else text


def _has_unparsed_substitution(text: str) -> bool:
    """A backtick or `$(` the grammar left as plain text (bash would run it)."""
    plain = _unescaped(text)
    return "`" in plain or "$(" in plain


def _has_metacharacter(text: str) -> bool:
    """An unescaped `|&;()<>`, blank or newline: never part of one unquoted bash word."""
    return _ANY_METACHARACTER.search(_unescaped(text)) is not None


def _has_anonymous(node: Node, kinds: frozenset[str]) -> bool:
    stack = list(node.children)
    while stack:
        child = stack.pop()
        if child.type in ("command_substitution", "process_substitution"):
            continue
        if not child.is_named and child.type in kinds:
            return True
        stack.extend(child.children)
    return False


_HANDLERS: Final[Mapping[str, Callable[[_Walk, Node, int], None]]] = MappingProxyType(
    {
        "command": _Walk.command,
        "redirected_statement": _Walk.redirected_statement,
        "file_redirect": _Walk.file_redirect,
        "heredoc_redirect": _Walk.heredoc_redirect,
        "heredoc_body": _Walk.heredoc_body,
        "herestring_redirect": _Walk.herestring_redirect,
        "variable_assignment": _Walk.variable_assignment,
        "subscript": _Walk.subscript,
        "array": _Walk.array,
        "declaration_command": _Walk.declaration_command,
        "unset_command": _Walk.unset_command,
        "function_definition": _Walk.function_definition,
        "test_command": _Walk.test_command,
        "for_statement": _Walk.for_statement,
        "c_style_for_statement": _Walk.c_style_for_statement,
        "compound_statement": _Walk.compound_statement,
        "arithmetic_expansion": _Walk.arithmetic_expansion,
        "expansion": _Walk.expansion,
        "simple_expansion": _Walk.simple_expansion,
        "brace_expression": _Walk.brace_expression,
        "command_substitution": _Walk.command_substitution,
        "process_substitution": _Walk.process_substitution,
        "word": _Walk.word_node,
        "string_content": _Walk.string_content,
    }
)
# Node types that need no handling of their own: containers whose children are walked, and
# parts of words or redirections handled by their parent.
_PLAIN_NODES: Final = name_set(
    "program list pipeline subshell negated_command if_statement elif_clause else_clause"
    " while_statement do_group case_statement case_item command_name string raw_string"
    " ansi_c_string translated_string concatenation number variable_name"
    " special_variable_name heredoc_start heredoc_content heredoc_end"
    " file_descriptor variable_assignments binary_expression unary_expression"
    " parenthesized_expression ternary_expression postfix_expression test_operator"
    " extglob_pattern regex ERROR"
)
