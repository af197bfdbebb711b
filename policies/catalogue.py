"""The catalogue of read-only commands, with the flags that make each of them write or run code.

The bash analyser (`policies.bash_analysis`) splits a command line into simple commands and
hands each one here as a program name plus its argument words. This module answers one
question per simple command: can it change anything (files, the shell's state, other
processes), or run code we cannot see? `check_command` returns `None` for "read-only" and
otherwise a reason written for the user ("`sort -o` writes to a file").

Why a catalogue and not a denylist: a command that is not listed here is not read-only. Each
entry is a checker that knows the flags of that program that write files or run commands
(`find -exec`, `sort -o`, `rg --pre`, `git -c`, `sed -i`, `awk 'BEGIN{system(...)}'`), and
rejects them, including GNU long-option abbreviations (`sort --out=x` is `--output=x`).
Anything the checker cannot understand is rejected: being wrong in that direction only costs
a question to the user.

What the checkers are given are `Word`s, not strings: a word's value is known only when it is
written literally. Words whose value comes from a variable are accepted as arguments (under
the OS floor the kernel enforces read-only anyway, see DESIGN.md "The floor and what it
buys"), but a word that visibly starts an option with an unknown name or value (`-$X`,
`--pre=$X`) is rejected by every checker that has forbidden flags.

Wrappers that only change how a command runs (`timeout`, `nice`, `nohup`, `time`, `stdbuf`,
`env`, `command`, `builtin`) are unwrapped by `unwrap_wrapper`, and the analyser classifies what
they run.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

__all__ = [
    "SYSTEM_BIN_DIRS",
    "CheckContext",
    "Checker",
    "Unwrapped",
    "Word",
    "check_command",
    "is_safe_env_assignment",
    "is_shell_local_name",
    "name_set",
    "resolve_program",
    "unwrap_wrapper",
]


def name_set(text: str) -> frozenset[str]:
    """A set of names written as one blank-separated string (long lists stay readable)."""
    return frozenset(text.split())


@dataclass(frozen=True, slots=True)
class Word:
    """One shell word of a simple command, as far as it is known before the shell runs it."""

    text: str
    """The word as written in the command (quotes and all)."""
    value: str | None
    """The word after quote removal, when it is fully literal; `None` when any part of it is
    an expansion, a substitution, a glob or something the analyser could not decode."""
    prefix: str
    """The literal text before the first part that is not known (equal to `value` when known).
    `"-$X"` has prefix `"-"`: it is visibly an option, with an unknown name."""
    first_unknown: Literal["expansion", "glob", "opaque"] | None = None
    """What the first unknown part is: a `$`-expansion or substitution (or `~`), an unquoted
    glob or brace pattern, or something the analyser could not decode. `None` when known."""
    critical_view: str = ""
    """The word as `rm` would see it if every variable were empty, with `$HOME` and `~` kept as
    `~`: what the critical-delete check looks at (`$EMPTY/*` becomes `/*`)."""
    only_globs: bool = False
    """Every unknown part is an unquoted glob or brace pattern (no variable, substitution,
    `~` or undecodable text): `build/*.o` is, `$DIR/*` is not."""

    @property
    def glob_could_be_flag(self) -> bool:
        """True when pathname or brace expansion could turn this word into an option.

        `*`, `-*`, `{-delete,}` or `?x` can expand to a file name starting with `-`
        (`touch -- -delete; find *`); `src/*.py` cannot. A variable expanded before the glob
        (`$dir/*`) is treated like any other variable.
        """
        if self.first_unknown not in ("glob", "opaque"):
            return False
        return self.prefix == "" or self.prefix.startswith("-")

    @property
    def unknown_option(self) -> bool:
        """True when the word visibly starts an option but its name or value is not known."""
        return self.value is None and self.prefix.startswith("-")


@dataclass(frozen=True, slots=True)
class CheckContext:
    """What a checker may need to know beyond the words."""

    workspace: Path | None = None
    """The workspace root, when known: `git -C DIR` is read-only only inside it."""
    git_risk: str | None = None
    """Why git may not run here without asking (a repository of the workspace configures a
    program under a driver's name, `sandbox.git_safety`); None: git's read-only commands may."""


Checker = Callable[[Sequence[Word], CheckContext], str | None]
"""Returns `None` when the command is read-only, else why it is not (shown to the user)."""


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """What `unwrap_wrapper` found: either the command the wrapper runs, or a verdict."""

    inner: tuple[Word, ...] | None = None
    """The wrapped command's words (program first), when the wrapper runs one."""
    read_only: bool = False
    """When `inner` is None: whether the wrapper on its own is read-only (`env`, `command -v`)."""
    reason: str | None = None
    """When `inner` is None and it is not read-only: why."""


SYSTEM_BIN_DIRS = frozenset({"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"})
"""`/usr/bin/cat` is `cat`; `./cat` or `/work/repo/bin/cat` is whatever the workspace holds."""

NAMED_ONLY = frozenset({"git"})
"""Programs read-only only when looked up on PATH by name: a read-only one-shot puts a guard
first on PATH (`git`: `sandbox.git_safety.guard_script`), which `/usr/bin/git` or `command -p
git` would skip."""


def resolve_program(value: str) -> tuple[str | None, str | None]:
    """The catalogue name of a program word, or why it cannot be trusted.

    Returns `(name, None)` or `(None, reason)`. Absolute paths are trusted only in the
    standard system directories; any other path names a file we cannot vouch for.
    """
    if value == "":
        return None, "the command name is empty"
    if "/" not in value:
        return value, None
    path = posixpath.normpath(re.sub("/+", "/", value))
    directory, base = posixpath.split(path)
    if directory in SYSTEM_BIN_DIRS and base in NAMED_ONLY:
        return None, f"`{value}` skips the checks `{base}` gets when run by name: run `{base}`"
    if directory in SYSTEM_BIN_DIRS and base:
        return base, None
    return None, f"`{value}` is not a program from a standard system directory"


# --- assignments --------------------------------------------------------------------------

_SHELL_LOCAL_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables a command may be given without risk: none of them makes a program load or run
# other code. Anything else (PATH, LD_PRELOAD, GIT_*, PAGER=less, BASH_ENV, ...) can.
_SAFE_ENV_NAMES = name_set(
    "LANG LANGUAGE TZ NO_COLOR CLICOLOR CLICOLOR_FORCE FORCE_COLOR COLUMNS LINES TERM"
    " GREP_COLORS LS_COLORS"
)
# Pagers run a program; set to `cat` (or empty, meaning "no pager") they are harmless.
_PAGER_NAMES = frozenset({"PAGER", "GIT_PAGER", "MANPAGER", "SYSTEMD_PAGER", "BAT_PAGER"})


def is_shell_local_name(name: str) -> bool:
    """Whether assigning this shell variable cannot change how later commands run.

    Bash gives no special meaning to lower-case names, and by convention programs read only
    upper-case environment variables, so `x=1` is shell-local while `PATH=...`, `IFS=...` or
    `BASH_ENV=...` change what later commands do in the persistent shell.
    """
    return _SHELL_LOCAL_NAME.fullmatch(name) is not None


def is_safe_env_assignment(name: str, value: str | None) -> bool:
    """Whether `NAME=value cmd` leaves `cmd` read-only (a locale, colours, a `cat` pager)."""
    if is_shell_local_name(name) or name in _SAFE_ENV_NAMES or name.startswith("LC_"):
        return True
    return name in _PAGER_NAMES and value in ("cat", "")


# --- option scanning helpers --------------------------------------------------------------


def _long_name(value: str) -> str:
    return value[2:].split("=", 1)[0]


def _abbreviates(name: str, options: frozenset[str]) -> str | None:
    """The forbidden long option that `--name` could stand for (GNU getopt accepts any
    unambiguous prefix, so `--out` is `--output`)."""
    if not name:
        return None
    for option in sorted(options):
        if option.startswith(name):
            return option
    return None


def _scan_options(
    program: str,
    args: Sequence[Word],
    *,
    short: str = "",
    long: frozenset[str] = frozenset(),
    short_values: str = "",
    double_dash_ends: bool = True,
    effects: Mapping[str, str] | None = None,
    default_effect: str = "is not read-only",
) -> str | None:
    """Reject forbidden options of a getopt-style program.

    `short` lists forbidden one-letter options, found anywhere in a cluster (`-uo` is `-u -o`)
    up to the first letter listed in `short_values` (whose value is the rest of the cluster).
    `long` lists forbidden long options, matched with GNU abbreviations. `effects` maps an
    option (letter or long name) to what it does, for the reason.
    """
    effects = effects or {}
    for word in args:
        if word.value is None:
            if not word.unknown_option:
                continue
            if not (word.prefix.startswith("--") and "=" in word.prefix):
                return f"`{word.text}` is an option of `{program}` that is not known before it runs"
            value = word.prefix
        else:
            value = word.value
        if value == "--":
            if double_dash_ends:
                return None
            continue
        if value.startswith("--"):
            hit = _abbreviates(_long_name(value), long)
            if hit is not None:
                return f"`{program} --{hit}` {effects.get(hit, default_effect)}"
        elif value.startswith("-") and len(value) > 1:
            for letter in value[1:]:
                if letter in short:
                    return f"`{program} -{letter}` {effects.get(letter, default_effect)}"
                if letter in short_values:
                    break
    return None


_WRITES = "writes to a file"


def _simple(program: str) -> Checker:
    """A program with no option that writes or runs code: any arguments are fine."""

    def check(args: Sequence[Word], ctx: CheckContext) -> str | None:
        return None

    return check


def _options(
    program: str,
    *,
    short: str = "",
    long: frozenset[str] = frozenset(),
    short_values: str = "",
    effects: Mapping[str, str] | None = None,
) -> Checker:
    """A getopt-style program that is read-only unless given one of the listed options."""

    def check(args: Sequence[Word], ctx: CheckContext) -> str | None:
        return _scan_options(
            program, args, short=short, long=long, short_values=short_values, effects=effects
        )

    return check


def _operands(args: Sequence[Word], short_values: str, long_values: frozenset[str]) -> list[Word]:
    """The operands of a getopt-style command line, skipping option values.

    `short_values` and `long_values` must list exactly the options that take a separate
    value: listing one that does not would hide a real operand. A word that is an option
    with an unknown name (`-$X`) counts as an operand, which can only over-count.
    """
    result: list[Word] = []
    expect_value = False
    options_ended = False
    for word in args:
        if expect_value:
            expect_value = False
            continue
        value = word.value
        if options_ended or value is None or value == "-" or not value.startswith("-"):
            result.append(word)
        elif value == "--":
            options_ended = True
        elif value.startswith("--"):
            expect_value = "=" not in value and value[2:] in long_values
        else:
            for index, letter in enumerate(value[1:], start=1):
                if letter in short_values:
                    expect_value = index == len(value) - 1
                    break
    return result


# --- individual checkers ------------------------------------------------------------------

_FIND_FORBIDDEN = MappingProxyType(
    {
        "-exec": "runs commands",
        "-execdir": "runs commands",
        "-ok": "runs commands",
        "-okdir": "runs commands",
        "-delete": "deletes files",
        "-fprint": "writes to a file",
        "-fprint0": "writes to a file",
        "-fprintf": "writes to a file",
        "-fls": "writes to a file",
    }
)


def _check_find(args: Sequence[Word], ctx: CheckContext) -> str | None:
    for word in args:
        if word.value is None:
            if word.unknown_option:
                return f"`{word.text}` could be a `find` action that is not known before it runs"
            continue
        effect = _FIND_FORBIDDEN.get(word.value)
        if effect is not None:
            return f"`find {word.value}` {effect}"
    return None


def _check_rg(args: Sequence[Word], ctx: CheckContext) -> str | None:
    # rg has no GNU abbreviations, but `--pre`, `--pre-glob` and any prefix of `pre` are
    # rejected alike: a preprocessor runs an arbitrary program on every file searched.
    for word in args:
        value = word.value if word.value is not None else word.prefix
        if (
            word.value is None
            and word.unknown_option
            and not (value.startswith("--") and "=" in value)
        ):
            return f"`{word.text}` is an option of `rg` that is not known before it runs"
        if not value.startswith("--"):
            continue
        name = _long_name(value)
        if name.startswith("pre") or (name and "pre".startswith(name)):
            return "`rg --pre` runs a preprocessor program"
        if name and "hostname-bin".startswith(name):
            return "`rg --hostname-bin` runs a program"
    return None


def _check_tee(args: Sequence[Word], ctx: CheckContext) -> str | None:
    for word in _operands(args, "", frozenset()):
        if word.value != "/dev/null":
            return f"`tee` writes to `{word.text}`"
    return None


def _check_uniq(args: Sequence[Word], ctx: CheckContext) -> str | None:
    # uniq INPUT OUTPUT writes OUTPUT; -f, -s and -w are its only options with a value.
    operands = _operands(args, "fsw", frozenset({"skip-fields", "skip-chars", "check-chars"}))
    if len(operands) > 1:
        return f"`uniq` writes its second operand `{operands[1].text}`"
    return None


def _check_xxd(args: Sequence[Word], ctx: CheckContext) -> str | None:
    # xxd [options] [infile [outfile]]: options end at the first operand. Only the bare
    # two-letter forms below certainly take the next word as their value; longer spellings
    # are not skipped, which can only over-count operands.
    positional: list[Word] = []
    skip = False
    for index, word in enumerate(args):
        if skip:
            skip = False
            continue
        value = word.value
        if value is None:
            if word.unknown_option:
                return f"`{word.text}` is an option of `xxd` that is not known before it runs"
            positional = list(args[index:])
            break
        if value == "--":
            positional = list(args[index + 1 :])
            break
        if not value.startswith("-") or value == "-":
            positional = list(args[index:])
            break
        if value in ("-c", "-g", "-l", "-o", "-s", "-n", "-R"):
            skip = True
    if len(positional) > 1:
        return f"`xxd` writes its second operand `{positional[1].text}`"
    return None


def _check_test(args: Sequence[Word], ctx: CheckContext) -> str | None:
    # bash evaluates the subscript of `test -v 'a[...]'` as arithmetic, and a `$(...)` in
    # it runs, even though the word is quoted; a name that is not literal (`test -v "$x"`)
    # may hold such a subscript. Numeric comparisons (`-eq`) are safe here: `test` and `[`
    # want plain integers, only `[[` evaluates (tests/policies/test_bash_arithmetic.py).
    for index, word in enumerate(args):
        if word.value not in ("-v", "-R"):
            continue
        operand = args[index + 1] if index + 1 < len(args) else None
        if operand is None or operand.value == "]":
            continue  # `test -v` alone tests the string `-v`
        if operand.value is None or not _VARIABLE_NAME.fullmatch(operand.value):
            return (
                f"`test {word.value} {operand.text}` evaluates a variable name that is not "
                "literal, whose subscript can run commands"
            )
    return None


def _check_printf(args: Sequence[Word], ctx: CheckContext) -> str | None:
    if not args:
        return None
    first = args[0]
    if first.value is None:
        return (
            "`printf` with an unknown first argument could be `printf -v`, which assigns a variable"
        )
    if first.value.startswith("-v"):
        return "`printf -v` assigns a shell variable"
    return None


_HOSTNAME_QUERIES = name_set(
    "-s -f -d -i -I -A -a -y --short --fqdn --long --domain --ip-address"
    " --all-ip-addresses --all-fqdns --alias --nis --yp"
)


def _check_hostname(args: Sequence[Word], ctx: CheckContext) -> str | None:
    for word in args:
        if word.value not in _HOSTNAME_QUERIES:
            return "`hostname` with an argument sets the host name"
    return None


def _check_version_only(program: str, flags: frozenset[str]) -> Checker:
    def check(args: Sequence[Word], ctx: CheckContext) -> str | None:
        if len(args) == 1 and args[0].value in flags:
            return None
        for word in args:
            if word.value in ("-c", "-e", "-p"):
                return f"`{program} {word.value}` runs inline code"
        return f"`{program}` runs a program (only `{program} --version` is read-only)"

    return check


_READ_VALUE_OPTIONS = "adinNptu"


def _check_read(args: Sequence[Word], ctx: CheckContext) -> str | None:
    """`read` assigns shell variables: read-only only when every name is shell-local."""
    expect: str | None = None
    for word in args:
        value = word.value
        if expect is not None:
            if expect == "a" and (value is None or not is_shell_local_name(value)):
                return f"`read -a {word.text}` assigns a variable that later commands may use"
            expect = None
            continue
        if value is None:
            return f"`read {word.text}` assigns a variable whose name is not known"
        if value.startswith("-") and len(value) > 1:
            for index, letter in enumerate(value[1:], start=1):
                if letter in _READ_VALUE_OPTIONS:
                    rest = value[index + 1 :]
                    if rest == "":
                        expect = letter
                    elif letter == "a" and not is_shell_local_name(rest):
                        return f"`read -a {rest}` assigns a variable that later commands may use"
                    break
                if letter not in "ers":
                    return f"`read -{letter}` is not an option the analyser knows"
            continue
        if not is_shell_local_name(value):
            return f"`read {value}` assigns a variable that later commands may use"
    return None


# sed and awk: a script on the command line -----------------------------------------------


def _resolve_long(name: str, options: frozenset[str]) -> str | None:
    """The long option `--name` stands for under GNU getopt rules, or None if unknown or
    ambiguous."""
    if name in options:
        return name
    matches = [option for option in options if option.startswith(name)]
    return matches[0] if len(matches) == 1 and name else None


@dataclass(frozen=True)
class _ScriptOptions:
    """The options of a program whose script is on its command line (sed, awk), as GNU getopt
    reads them: every option the analyser knows is listed, anything else is refused."""

    flags: str
    """One-letter options without a value."""
    short_values: str
    """One-letter options with a value: the rest of the cluster, else the next word."""
    short_refused: Mapping[str, str]
    """One-letter options that are never read-only, with what they do."""
    long_flags: frozenset[str]
    long_values: frozenset[str]
    """Long options with a value: after `=`, else the next word."""
    long_refused: Mapping[str, str]
    scripts: frozenset[str]
    """The options (letters and long names) whose value is a script: `-e`, `--expression`."""
    unknown: str = ""
    """Ends the refusal of a word that is an option with an unknown name (`-$X`)."""
    program_ends_options: bool = False
    """POSIX awk: without a script option the first operand is the program, and options
    end there."""

    @property
    def long_names(self) -> frozenset[str]:
        return self.long_flags | self.long_values | frozenset(self.long_refused)


@dataclass
class _ScriptCommand:
    """A sed or awk command line as `_read_script_command` found it."""

    given: set[str] = field(default_factory=set)
    """The options given (letters and long names)."""
    scripts: list[Word] = field(default_factory=list)
    """The values of the script options, in order."""
    operands: list[Word] = field(default_factory=list)


def _read_script_command(
    program: str, args: Sequence[Word], options: _ScriptOptions
) -> _ScriptCommand | str:
    """`args` as `program` reads them; or why they are refused: an option the analyser does
    not know (or cannot know before the shell runs), one of the refused ones, a value missing.
    """
    command = _ScriptCommand()
    index = 0
    options_ended = False
    while index < len(args):
        word = args[index]
        index += 1
        value = word.value
        if value is None:
            if word.unknown_option and not options_ended:
                return (
                    f"`{word.text}` is an option of `{program}` that is not known" + options.unknown
                )
            command.operands.append(word)
            continue
        if options_ended or not value.startswith("-") or value == "-":
            command.operands.append(word)
            if options.program_ends_options and not command.scripts:
                options_ended = True
            continue
        if value == "--":
            options_ended = True
            continue
        if value.startswith("--"):
            name, has_value, attached = value[2:].partition("=")
            option = _resolve_long(name, options.long_names)
            if option is None:
                return f"`{program} {value}` is not an option the analyser knows"
            refused = options.long_refused.get(option)
            if refused is not None:
                return f"`{program} --{option}` {refused}"
            command.given.add(option)
            if option not in options.long_values:
                continue
            spelled, inline = f"--{option}", attached if has_value else None
        else:
            letters = value[1:]
            for position, letter in enumerate(letters):
                refused = options.short_refused.get(letter)
                if refused is not None:
                    return f"`{program} -{letter}` {refused}"
                if letter not in options.flags + options.short_values:
                    return f"`{program} -{letter}` is not an option the analyser knows"
                command.given.add(letter)
                if letter in options.short_values:
                    option, spelled, inline = letter, f"-{letter}", letters[position + 1 :] or None
                    break
            else:
                continue
        # An option with a value: written in the same word, else the next one.
        if inline is not None:
            taken = Word(text=inline, value=inline, prefix=inline)
        elif index < len(args):
            taken = args[index]
            index += 1
        else:
            return f"`{program} {spelled}` is missing its value"
        if option in options.scripts:
            command.scripts.append(taken)
    return command


# sed -------------------------------------------------------------------------------------

_SED_OPTIONS = _ScriptOptions(
    flags="nErsuz",
    short_values="el",
    short_refused=MappingProxyType(
        {"i": "edits files in place", "f": "reads a script file the analyser cannot see"}
    ),
    long_flags=name_set(
        "quiet silent regexp-extended separate sandbox debug posix unbuffered null-data"
        " zero-terminated binary follow-symlinks version help"
    ),
    long_values=name_set("expression line-length"),
    long_refused=MappingProxyType(
        {"in-place": "edits files in place", "file": "reads a script file"}
    ),
    scripts=name_set("e expression"),
    unknown=" before it runs",
)


def _check_sed(args: Sequence[Word], ctx: CheckContext) -> str | None:
    command = _read_script_command("sed", args, _SED_OPTIONS)
    if isinstance(command, str):
        return command
    scripts = command.scripts or command.operands[:1]
    if not scripts:
        return None
    if not command.given & {"n", "quiet", "silent"}:
        return "`sed` without `-n` is read-only only with print commands; use `sed -n`"
    for script in scripts:
        if script.value is None:
            return "the `sed` script is not known before the shell runs it"
        problem = _sed_script_problem(script.value)
        if problem is not None:
            return problem
    return None


def _literal_end(text: str, start: int, closer: str) -> int | None:
    """Index just past the `closer` that ends a literal (a sed regex, an awk string or regex)
    whose text starts at `start`; None when a newline or the end of `text` comes first.

    Like GNU sed's match_slash: only a backslash escapes; brackets are not special.
    """
    index = start
    while index < len(text):
        char = text[index]
        if char == "\n":
            return None
        if char == "\\":
            index += 2
            continue
        if char == closer:
            return index + 1
        index += 1
    return None


def _sed_address(script: str, index: int) -> int | None:
    """Index past one sed address at `index` (or `index` itself when there is none)."""
    if index >= len(script):
        return index
    char = script[index]
    if char.isdigit():
        while index < len(script) and script[index].isdigit():
            index += 1
        if index < len(script) and script[index] == "~":
            index += 1
            while index < len(script) and script[index].isdigit():
                index += 1
        return index
    if char == "$":
        return index + 1
    if char == "/" or char == "\\":
        if char == "\\":
            if index + 1 >= len(script) or script[index + 1] in "\n\\":
                return None
            delimiter = script[index + 1]
            index += 2
        else:
            delimiter = "/"
            index += 1
        end = _literal_end(script, index, delimiter)
        if end is None:
            return None
        while end < len(script) and script[end] in "IM":
            end += 1
        return end
    return index


def _sed_script_problem(script: str) -> str | None:
    """Accept only scripts made of addresses and the print commands `p P = l q Q`.

    Anything else (`s`, `w`, `e`, `r`, comments, labels) is refused: `s///w file` and
    `s///e` write or run commands, and a conservative grammar is easier to trust than a
    blacklist.
    """
    index = 0
    depth = 0
    length = len(script)

    def skip_blanks(position: int) -> int:
        while position < length and script[position] in " \t":
            position += 1
        return position

    while True:
        while index < length and script[index] in " \t;\n":
            index += 1
        if index >= length:
            break
        if script[index] == "}":
            depth -= 1
            if depth < 0:
                return "the `sed` script has an unmatched `}`"
            index += 1
            continue
        start = index
        after = _sed_address(script, index)
        if after is None:
            return "the `sed` script has an unterminated address"
        if after != start:
            index = skip_blanks(after)
            if index < length and script[index] == ",":
                index = skip_blanks(index + 1)
                if index < length and script[index] in "+~":
                    index += 1
                    digits = index
                    while index < length and script[index].isdigit():
                        index += 1
                    if index == digits:
                        return "the `sed` script has an incomplete address"
                else:
                    second = _sed_address(script, index)
                    if second is None or second == index:
                        return "the `sed` script has an incomplete address"
                    index = second
        index = skip_blanks(index)
        if index < length and script[index] == "!":
            index = skip_blanks(index + 1)
        if index >= length:
            return "the `sed` script ends after an address"
        command = script[index]
        index += 1
        if command == "{":
            depth += 1
            continue
        if command in "lqQ":
            index = skip_blanks(index)
            while index < length and script[index].isdigit():
                index += 1
        elif command not in "pP=":
            return (
                f"`sed` command `{command}` is not a print command"
                " (only p, P, =, l, q and Q are read-only)"
            )
        index = skip_blanks(index)
        if index < length and script[index] not in ";\n}":
            return f"the `sed` script has `{script[index]}` after a command"
    if depth != 0:
        return "the `sed` script has an unmatched `{`"
    return None


# awk -------------------------------------------------------------------------------------

_AWK_UNSEEN = "reads the program from a file the analyser cannot see"
_AWK_OPTIONS = _ScriptOptions(
    flags="bcChLMnNOPrsStV",
    short_values="Fve",
    short_refused=MappingProxyType(
        {
            "f": _AWK_UNSEEN,
            "E": _AWK_UNSEEN,
            "i": "loads source files (`-i inplace` edits files)",
            "l": "loads a shared library",
            "o": "writes a file",
            "p": "writes a profile file",
            "d": "writes a file",
            "D": "starts the debugger",
            "W": "takes implementation options the analyser does not know",
        }
    ),
    long_flags=name_set(
        "characters-as-bytes traditional copyright usage help lint bignum use-lc-numeric"
        " non-decimal-data optimize no-optimize posix re-interval sandbox lint-old version"
    ),
    long_values=name_set("field-separator assign source"),
    long_refused=MappingProxyType(
        {
            "file": _AWK_UNSEEN,
            "exec": _AWK_UNSEEN,
            "include": "loads source files (`-i inplace` edits files)",
            "load": "loads a shared library",
            "pretty-print": "writes a file",
            "profile": "writes a profile file",
            "dump-variables": "writes a file",
            "debug": "starts the debugger",
        }
    ),
    scripts=name_set("e source"),
    program_ends_options=True,
)
# After these words a `/` starts a regular expression, not a division.
_AWK_REGEX_KEYWORDS = frozenset({"print", "printf", "return", "case", "do", "else"})


def _check_awk(program_name: str) -> Checker:
    def check(args: Sequence[Word], ctx: CheckContext) -> str | None:
        command = _read_script_command(program_name, args, _AWK_OPTIONS)
        if isinstance(command, str):
            return command
        for program in command.scripts or command.operands[:1]:
            if program.value is None:
                return f"the `{program_name}` program is not known before the shell runs it"
            problem = _awk_program_problem(program.value)
            if problem is not None:
                return f"`{program_name}`: {problem}"
        return None

    return check


def _awk_program_problem(program: str) -> str | None:
    """Refuse awk programs that could run commands or write files.

    A light tokenizer skips strings and regular expressions, then refuses `system`, any `@`
    (gawk's `@load`, `@include` and indirect calls such as `@f()` with `f = "system"`), a
    single `|` (pipes to or from commands, `|&` coprocesses) and `>` at the top level of a
    `print`/`printf` statement (output redirection). Where a `/` could be read both as a
    division and as a regular expression the program is refused.
    """
    if "system" in program:
        return "`system()` runs commands"
    if "@" in program:
        return "`@` (gawk `@load`, `@include`, indirect calls) is not read-only"
    index = 0
    length = len(program)
    previous: Literal["start", "operand", "operator", "ambiguous"] = "start"
    in_print = False
    depth = 0
    while index < length:
        char = program[index]
        if char in " \t\r":
            index += 1
            continue
        if char == "\\" and index + 1 < length and program[index + 1] == "\n":
            index += 2
            continue
        if char in "\n;":
            if depth == 0:
                in_print = False
            previous = "start"
            index += 1
            continue
        if char == "#":
            while index < length and program[index] != "\n":
                index += 1
            continue
        if char == '"':
            end = _literal_end(program, index + 1, '"')
            if end is None:
                return "unterminated string"
            index = end
            previous = "operand"
            continue
        if char == "/":
            if previous == "ambiguous":
                return "`/` after `++` or `--` is ambiguous"
            if previous in ("start", "operator"):
                end = _literal_end(program, index + 1, "/")
                if end is None:
                    return "unterminated regular expression"
                body = program[index + 1 : end - 1]
                if body.count("[") > body.count("]"):
                    return "a `/` inside brackets in a regular expression is ambiguous"
                index = end
                previous = "operand"
                continue
            previous = "operator"
            index += 1
            continue
        if char.isalpha() or char == "_":
            start = index
            while index < length and (program[index].isalnum() or program[index] == "_"):
                index += 1
            identifier = program[start:index]
            if identifier in ("print", "printf"):
                in_print = True
                depth = 0
            previous = "operator" if identifier in _AWK_REGEX_KEYWORDS else "operand"
            continue
        if char.isdigit() or (char == "." and index + 1 < length and program[index + 1].isdigit()):
            while index < length and (program[index].isalnum() or program[index] == "."):
                index += 1
            previous = "operand"
            continue
        if char == "|":
            if index + 1 < length and program[index + 1] == "|":
                index += 2
                previous = "operator"
                continue
            return "a `|` pipes to or from a command"
        if char == ">":
            if in_print and depth == 0:
                return "`>` after `print` redirects output to a file"
            previous = "operator"
            index += 1
            continue
        if char in "({[":
            if char == "(" and in_print:
                depth += 1
            if char == "{":
                in_print = False
                depth = 0
                previous = "start"
            else:
                previous = "operator"
            index += 1
            continue
        if char in ")]}":
            if char == ")" and in_print:
                depth -= 1
            if char == "}":
                in_print = False
                depth = 0
                previous = "start"
            else:
                previous = "operand"
            index += 1
            continue
        if char in "+-" and index + 1 < length and program[index + 1] == char:
            previous = "ambiguous"
            index += 2
            continue
        previous = "operator"
        index += 1
    return None


# git -------------------------------------------------------------------------------------

_GIT_GLOBAL_FLAGS = name_set(
    "--no-pager -P --no-replace-objects --literal-pathspecs --glob-pathspecs"
    " --noglob-pathspecs --icase-pathspecs --no-optional-locks --no-advice"
)
_GIT_GLOBAL_REASONS = MappingProxyType(
    {
        "-c": "`git -c` sets configuration (core.pager, diff.external) that runs commands",
        "--config-env": "`git --config-env` sets configuration that can run commands",
        "--exec-path": "`git --exec-path` chooses where git runs its programs from",
        "--git-dir": "`git --git-dir` reads another repository and its configuration",
        "--work-tree": "`git --work-tree` points git at another tree",
        "-p": "`git -p` runs a pager program",
        "--paginate": "`git --paginate` runs a pager program",
    }
)
# Options that run programs or write files, on any read-only subcommand (GNU-style
# abbreviations included: `--out=x` is `--output=x`).
_GIT_FORBIDDEN_LONG = frozenset(
    {"output", "ext-diff", "textconv", "filters", "open-files-in-pager", "upload-pack", "help"}
)
_GIT_OPTION_EFFECTS = MappingProxyType(
    {
        "output": _WRITES,
        "ext-diff": "runs an external diff program",
        "textconv": "runs text conversion programs",
        "filters": "runs filter programs",
        "open-files-in-pager": "runs a pager program",
        "O": "runs a pager program",
        "upload-pack": "runs a program",
        "help": "starts a manual viewer",
    }
)
_GIT_SIMPLE = name_set(
    "status log diff show blame annotate rev-parse rev-list ls-files ls-tree cat-file"
    " grep describe shortlog merge-base for-each-ref name-rev count-objects check-ignore"
    " check-attr check-mailmap show-ref show-branch diff-tree diff-files diff-index var"
    " version whatchanged cherry range-diff"
)
_GIT_SPECIAL = name_set("branch tag reflog remote config stash worktree submodule")


def _git_c_inside(path: str, ctx: CheckContext) -> bool:
    if ctx.workspace is None or path == "":
        return False
    root = posixpath.normpath(str(ctx.workspace))
    target = path if path.startswith("/") else posixpath.join(root, path)
    target = posixpath.normpath(target)
    return target == root or target.startswith(root.rstrip("/") + "/")


def _check_git(args: Sequence[Word], ctx: CheckContext) -> str | None:
    index = 0
    while index < len(args):
        word = args[index]
        value = word.value
        if value is None:
            if word.unknown_option:
                return f"`git {word.text}` is an option that is not known before it runs"
            return "the git subcommand is not known before the shell runs it"
        if not value.startswith("-"):
            break
        if value == "-C":
            if index + 1 >= len(args):
                return "`git -C` is missing its directory"
            target = args[index + 1].value
            if target is None or not _git_c_inside(target, ctx):
                return "`git -C` is read-only only into a directory inside the workspace"
            index += 2
            continue
        if value in _GIT_GLOBAL_FLAGS:
            index += 1
            continue
        if value == "--version" and index == len(args) - 1:
            return None
        name = value.split("=", 1)[0]
        reason = _GIT_GLOBAL_REASONS.get(name)
        if reason is None and name.startswith("-c"):
            reason = _GIT_GLOBAL_REASONS["-c"]
        return reason or f"`git {value}` is not a global option the analyser knows"
    else:
        return None  # bare `git` prints usage
    subcommand = args[index].value
    rest = list(args[index + 1 :])
    assert subcommand is not None
    if subcommand not in _GIT_SIMPLE and subcommand not in _GIT_SPECIAL:
        return f"`git {subcommand}` is not a read-only git command"
    problem = _scan_options(
        f"git {subcommand}",
        rest,
        short="O" if subcommand == "grep" else "",
        long=_GIT_FORBIDDEN_LONG,
        double_dash_ends=False,
        effects=_GIT_OPTION_EFFECTS,
    )
    if problem is not None:
        return problem
    verdict = None if subcommand in _GIT_SIMPLE else _GIT_SUBCOMMANDS[subcommand](rest)
    if verdict is None and ctx.git_risk is not None:
        # Its fixed code-running settings are overridden when it runs; a driver's are not.
        return f"`git {subcommand}` is not run without asking here: {ctx.git_risk}"
    return verdict


def _git_positionals(args: Sequence[Word]) -> list[Word]:
    return [w for w in args if not (w.value or w.prefix).startswith("-") or w.value == "-"]


def _git_flag_present(args: Sequence[Word], letters: str, longs: frozenset[str]) -> bool:
    for word in args:
        value = word.value
        if value is None or not value.startswith("-") or value == "--":
            continue
        if value.startswith("--"):
            if _long_name(value) in longs:
                return True
        elif any(letter in letters for letter in value[1:]):
            return True
    return False


_BRANCH_LIST_LONG = name_set(
    "list contains no-contains merged no-merged points-at verbose all remotes"
)
_BRANCH_BAD_LONG = name_set(
    "delete move copy force set-upstream-to set-upstream unset-upstream edit-description"
    " track no-track create-reflog recurse-submodules"
)
_TAG_BAD_LONG = name_set(
    "annotate sign no-sign local-user force delete verify message file edit cleanup"
    " create-reflog trailer"
)


def _git_lister(
    what: str,
    *,
    short: str,
    long: frozenset[str],
    effect: str,
    lists: str,
    list_long: frozenset[str],
) -> Callable[[Sequence[Word]], str | None]:
    """`git branch` and `git tag`: read-only when they list. `short` and `long` are the options
    that change or verify (`effect`); a name given without a listing option (`lists`,
    `list_long`) creates one."""

    def check(args: Sequence[Word]) -> str | None:
        problem = _scan_options(
            f"git {what}",
            args,
            short=short,
            long=long,
            double_dash_ends=False,
            default_effect=effect,
        )
        if problem is not None:
            return problem
        if _git_positionals(args) and not _git_flag_present(args, lists, list_long):
            return f"`git {what} NAME` creates a {what} (list with `git {what} --list`)"
        return None

    return check


def _git_reflog(args: Sequence[Word]) -> str | None:
    if not args or (args[0].value or "").startswith("-"):
        return None
    if args[0].value in ("show", "exists", "list"):
        return None
    return f"`git reflog {args[0].text}` is not a read-only reflog command"


def _git_remote(args: Sequence[Word]) -> str | None:
    positionals = _git_positionals(args)
    if not positionals:
        if all(word.value in ("-v", "--verbose") for word in args):
            return None
        return "only `git remote -v`, `git remote show` and `git remote get-url` are read-only"
    if positionals[0].value in ("show", "get-url"):
        return None
    return f"`git remote {positionals[0].text}` changes the remotes"


_CONFIG_WRITE_LONG = frozenset(
    {"add", "unset", "unset-all", "replace-all", "rename-section", "remove-section", "edit"}
)
_CONFIG_READ_LONG = frozenset(
    {"get", "get-all", "get-regexp", "get-urlmatch", "get-color", "get-colorbool", "list"}
)
_CONFIG_SCOPE = name_set(
    "--global --local --system --worktree --show-origin --show-scope --null -z --includes"
    " --no-includes --name-only"
)


def _git_config(args: Sequence[Word]) -> str | None:
    problem = _scan_options(
        "git config",
        args,
        short="e",
        long=_CONFIG_WRITE_LONG,
        double_dash_ends=False,
        default_effect="changes configuration",
    )
    if problem is not None:
        return problem
    positionals = _git_positionals(args)
    if positionals:
        first = positionals[0].value
        if first in ("get", "list"):
            return None
        if first in ("set", "unset", "rename-section", "remove-section", "edit"):
            return f"`git config {first}` changes configuration"
    if _git_flag_present(args, "l", _CONFIG_READ_LONG):
        return None
    if len(positionals) == 1 and all(
        word is positionals[0] or word.value in _CONFIG_SCOPE for word in args
    ):
        return None
    return "`git config` is read-only only with --get, --list or a single name"


def _git_first_is(allowed: frozenset[str], what: str) -> Callable[[Sequence[Word]], str | None]:
    def check(args: Sequence[Word]) -> str | None:
        if args and args[0].value in allowed:
            return None
        return f"only `git {what} {'/'.join(sorted(allowed))}` is read-only"

    return check


def _git_submodule(args: Sequence[Word]) -> str | None:
    positionals = _git_positionals(args)
    if not positionals or positionals[0].value == "status":
        return None
    return "only `git submodule status` is read-only"


_GIT_SUBCOMMANDS: Mapping[str, Callable[[Sequence[Word]], str | None]] = MappingProxyType(
    {
        "branch": _git_lister(
            "branch",
            short="dDmMcCfut",
            long=_BRANCH_BAD_LONG,
            effect="changes branches",
            lists="lvar",
            list_long=_BRANCH_LIST_LONG,
        ),
        "tag": _git_lister(
            "tag",
            short="asudfvmFe",
            long=_TAG_BAD_LONG,
            effect="changes or verifies tags",
            lists="l",
            list_long=frozenset({"list"}),
        ),
        "reflog": _git_reflog,
        "remote": _git_remote,
        "config": _git_config,
        "stash": _git_first_is(frozenset({"list", "show"}), "stash"),
        "worktree": _git_first_is(frozenset({"list"}), "worktree"),
        "submodule": _git_submodule,
    }
)


# --- the catalogue ------------------------------------------------------------------------

# Left out on purpose: less, more and man (interactive; `!cmd` runs commands), top and tput
# (terminal control), ruff check (writes .ruff_cache), xargs (runs commands), sdiff (-o
# writes), split, csplit and shuf (write files or have -o).
_SIMPLE_COMMANDS = name_set(
    # Read files or print facts, and have no option that writes or runs a program.
    "cat head tail wc ls stat du df diff cmp comm which type pwd echo true false :"
    " uname whoami id groups nproc seq tr cut paste nl od hexdump sha256sum md5sum sha1sum"
    " sha512sum sha224sum sha384sum b2sum cksum column fold fmt rev tac expand unexpand look"
    " strings ps free uptime locale getconf basename dirname realpath readlink sleep printenv"
    " grep egrep fgrep arch logname join"
    # jq cannot write files or run programs; `-f FILE` only reads a jq program.
    " jq"
    # base64 and base32 encode or decode to standard output only.
    " base64 base32"
    # `cd` changes only the persistent shell's directory; every later command is classified
    # on its own (and with the floor runs in the same sandbox).
    " cd"
)

_CATALOGUE: Mapping[str, Checker] = MappingProxyType(
    {
        **{name: _simple(name) for name in _SIMPLE_COMMANDS},
        "find": _check_find,
        "rg": _check_rg,
        "sed": _check_sed,
        "git": _check_git,
        "awk": _check_awk("awk"),
        "gawk": _check_awk("gawk"),
        "mawk": _check_awk("mawk"),
        "nawk": _check_awk("nawk"),
        "sort": _options(
            "sort",
            short="o",
            long=frozenset({"output", "compress-program"}),
            effects={"o": _WRITES, "output": _WRITES, "compress-program": "runs a program"},
        ),
        # date's -d, -f, -I and -r take a value: `date -Iseconds` is not `-s`.
        "date": _options(
            "date",
            short="s",
            long=frozenset({"set"}),
            short_values="dfIr",
            effects={"s": "sets the system clock", "set": "sets the system clock"},
        ),
        # `tree -R` re-runs tree with `-o 00Tree.html` in every directory.
        "tree": _options(
            "tree",
            short="oR",
            long=frozenset({"output"}),
            effects={"o": _WRITES, "output": _WRITES, "R": "writes 00Tree.html files"},
        ),
        "file": _options(
            "file",
            short="C",
            long=frozenset({"compile"}),
            effects={
                "C": "writes a compiled magic file",
                "compile": "writes a compiled magic file",
            },
        ),
        "tee": _check_tee,
        "uniq": _check_uniq,
        "xxd": _check_xxd,
        "printf": _check_printf,
        "test": _check_test,
        "[": _check_test,
        "hostname": _check_hostname,
        "read": _check_read,
        # Interpreters are read-only only when asked for their version.
        "python": _check_version_only("python", frozenset({"--version", "-V"})),
        "python3": _check_version_only("python3", frozenset({"--version", "-V"})),
        "node": _check_version_only("node", frozenset({"--version", "-v"})),
    }
)

# Programs that run other programs or code: specific reasons instead of the generic one.
_NEVER_READ_ONLY: Mapping[str, str] = MappingProxyType(
    {
        **{
            shell: f"`{shell}` runs a shell script"
            for shell in name_set("sh bash zsh dash ksh mksh fish csh tcsh busybox")
        },
        "eval": "`eval` runs its arguments as a command",
        "let": "`let` evaluates arithmetic, which runs commands hidden in variables' subscripts",
        "exec": "`exec` replaces the shell (or changes its file descriptors for good)",
        "source": "`source` runs a script in this shell",
        ".": "`.` runs a script in this shell",
        "xargs": "`xargs` runs a command for each input line",
        "sudo": "`sudo` runs a command as another user",
        "doas": "`doas` runs a command as another user",
        "npx": "`npx` downloads and runs a package",
        "uvx": "`uvx` downloads and runs a package",
        "bunx": "`bunx` downloads and runs a package",
        "pnpx": "`pnpx` downloads and runs a package",
        "perl": "`perl` runs a program",
        "ruby": "`ruby` runs a program",
        "php": "`php` runs a program",
        "deno": "`deno` runs a program",
        "bun": "`bun` runs a program",
        "python2": "`python2` runs a program",
        "pypy3": "`pypy3` runs a program",
        "less": "`less` is interactive and can run commands",
        "more": "`more` is interactive and can run commands",
        "man": "`man` is interactive and runs a pager",
    }
)
_RUNNER_SUBCOMMANDS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("pipx", "run"): "`pipx run` downloads and runs a package",
        ("npm", "exec"): "`npm exec` downloads and runs a package",
        ("npm", "x"): "`npm x` downloads and runs a package",
        ("pnpm", "dlx"): "`pnpm dlx` downloads and runs a package",
        ("pnpm", "exec"): "`pnpm exec` runs a program",
        ("yarn", "dlx"): "`yarn dlx` downloads and runs a package",
        ("uv", "run"): "`uv run` runs a program",
        ("uv", "tool"): "`uv tool` installs or runs packages",
    }
)
_INLINE_CODE_FLAGS = MappingProxyType(
    {
        "python": "-c",
        "python3": "-c",
        "python2": "-c",
        "node": "-e",
        "perl": "-e",
        "ruby": "-e",
        "php": "-r",
        "deno": "eval",
        "bun": "-e",
    }
)


def check_command(name: str, args: Sequence[Word], ctx: CheckContext) -> str | None:
    """`None` if `name args...` is read-only, else the reason it is not.

    `name` is the resolved program name (see `resolve_program`); wrappers must already have
    been unwrapped with `unwrap_wrapper`.
    """
    checker = _CATALOGUE.get(name)
    if checker is not None:
        return checker(args, ctx)
    inline = _INLINE_CODE_FLAGS.get(name)
    if inline is not None and any(word.value == inline for word in args):
        return f"`{name} {inline}` runs inline code"
    reason = _NEVER_READ_ONLY.get(name)
    if reason is not None:
        return reason
    if args and args[0].value is not None:
        runner = _RUNNER_SUBCOMMANDS.get((name, args[0].value))
        if runner is not None:
            return runner
    return f"`{name}` is not a read-only command"


# --- wrappers -----------------------------------------------------------------------------


def _inner(words: Sequence[Word], wrapper: str) -> Unwrapped:
    if not words:
        return Unwrapped(reason=f"`{wrapper}` is missing the command it runs")
    return Unwrapped(inner=tuple(words))


def _wrapper_operands(
    wrapper: str,
    args: Sequence[Word],
    *,
    short: str,
    long: frozenset[str],
    flags: frozenset[str] = frozenset(),
) -> int | Unwrapped:
    """Where the operands of `wrapper` start in `args`, past its options (and a `--`): the
    letters of `short` and the names of `long` take a value, in the same word (`-oL`,
    `--output=L`) or the next; `flags` take none. Its refusal for a word not known before the
    shell runs, or an option the analyser does not know."""
    index = 0
    while index < len(args):
        value = args[index].value
        if value is None:
            return Unwrapped(reason=f"`{wrapper}` has an argument that is not known")
        if value == "--":
            return index + 1
        if not value.startswith("-") or value == "-":
            return index
        if value.startswith("--"):
            name, has_value, _ = value[2:].partition("=")
            taken = 0 if name not in long else 1 if has_value else 2
        else:
            taken = 0 if value[1] not in short else 1 if len(value) > 2 else 2
        if not taken and value not in flags:
            return Unwrapped(reason=f"`{wrapper} {value}` is not an option the analyser knows")
        index += taken or 1
    return index


def _unwrap_timeout(args: Sequence[Word]) -> Unwrapped:
    # timeout [-s SIG] [-k DUR] [--preserve-status] [--foreground] [-v] DURATION COMMAND...
    start = _wrapper_operands(
        "timeout",
        args,
        short="sk",
        long=name_set("signal kill-after"),
        flags=name_set("--preserve-status --foreground -v --verbose"),
    )
    if isinstance(start, Unwrapped):
        return start
    return _inner(args[start + 1 :], "timeout")


def _unwrap_nice(args: Sequence[Word]) -> Unwrapped:
    if not args:
        return Unwrapped(read_only=True)  # prints the niceness
    index = 0
    value = args[0].value
    if value in ("-n", "--adjustment"):
        index = 2
    elif value is not None and (
        value.startswith("--adjustment=") or re.fullmatch(r"-n?-?\d+", value)
    ):
        index = 1
    if index < len(args) and args[index].value == "--":
        index += 1
    return _inner(args[index:], "nice")


def _unwrap_time(args: Sequence[Word]) -> Unwrapped:
    index = 0
    while index < len(args) and args[index].value in ("-p", "--"):
        index += 1
    if index == len(args):
        return Unwrapped(read_only=True)
    return _inner(args[index:], "time")


def _unwrap_nohup(args: Sequence[Word]) -> Unwrapped:
    index = 1 if args and args[0].value == "--" else 0
    return _inner(args[index:], "nohup")


def _unwrap_stdbuf(args: Sequence[Word]) -> Unwrapped:
    start = _wrapper_operands("stdbuf", args, short="ioe", long=name_set("input output error"))
    if isinstance(start, Unwrapped):
        return start
    return _inner(args[start:], "stdbuf")


_ENV_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


def _unwrap_env(args: Sequence[Word]) -> Unwrapped:
    """`env [-i] [-0] [-u NAME] [NAME=value]... [COMMAND...]`: printing is read-only; the
    command it runs is classified, with the same rule for assignments as `NAME=value cmd`,
    and for unset names too; a command run with the environment cleared is not read-only
    (it would lose the settings a read-only command runs with: git's, `sandbox.git_safety`)."""
    index = 0
    assignments: list[tuple[str, str]] = []
    unset: list[tuple[str, str]] = []  # (as written, the name when literal else "")
    cleared: str | None = None
    while index < len(args):
        word = args[index]
        value = word.value
        if value is None:
            if word.unknown_option:
                return Unwrapped(reason=f"`env {word.text}` is an option that is not known")
            break
        if value in ("-i", "--ignore-environment", "-"):
            cleared = value
            index += 1
        elif value in ("-0", "--null", "-v", "--debug"):
            index += 1
        elif value in ("-u", "--unset", "-C", "--chdir"):
            if value in ("-u", "--unset") and index + 1 < len(args):
                target = args[index + 1]
                unset.append((f"{value} {target.text}", target.value or ""))
            index += 2
        elif value.startswith(("-u", "--unset=", "-C", "--chdir=")) and value not in ("-u", "-C"):
            if value.startswith(("-u", "--unset=")):
                unset.append((value, value[2:] if value[1] == "u" else value.split("=", 1)[1]))
            index += 1
        elif value == "--":
            index += 1
            break
        elif value.startswith("-"):
            return Unwrapped(
                reason=f"`env {value}` is not an option the analyser knows "
                "(`-S` splits a string into a command)"
            )
        elif (match := _ENV_ASSIGNMENT.fullmatch(value)) is not None:
            assignments.append((match.group(1), match.group(2)))
            index += 1
        else:
            break
    if index >= len(args):
        return Unwrapped(read_only=True)
    if cleared is not None:
        return Unwrapped(reason=f"`env {cleared}` clears the environment the command runs with")
    for written, unset_name in unset:
        if not is_safe_env_assignment(unset_name, None):
            return Unwrapped(reason=f"`env {written}` changes how the command it runs behaves")
    for name, assigned in assignments:
        if not is_safe_env_assignment(name, assigned):
            return Unwrapped(reason=f"`env {name}=...` changes how the command it runs behaves")
    return _inner(args[index:], "env")


def _unwrap_command(args: Sequence[Word]) -> Unwrapped:
    index = 0
    lookup = False
    while index < len(args):
        value = args[index].value
        if value is None or not value.startswith("-") or value == "-":
            break
        index += 1
        if value == "--":
            break
        if not re.fullmatch(r"-[pvV]+", value):
            return Unwrapped(reason=f"`command {value}` is not an option the analyser knows")
        lookup = lookup or "v" in value or "V" in value
    if lookup or index >= len(args):
        return Unwrapped(read_only=True)  # `command -v x` only looks x up
    flags = "".join(word.value or "" for word in args[:index])
    if "p" in flags and args[index].value in NAMED_ONLY:
        name = args[index].value
        why = f"`command -p {name}` skips the checks `{name}` gets when run by name: run `{name}`"
        return Unwrapped(reason=why)
    return _inner(args[index:], "command")


def _unwrap_builtin(args: Sequence[Word]) -> Unwrapped:
    if not args:
        return Unwrapped(read_only=True)
    return _inner(args, "builtin")


_WRAPPERS: Mapping[str, Callable[[Sequence[Word]], Unwrapped]] = MappingProxyType(
    {
        "timeout": _unwrap_timeout,
        "nice": _unwrap_nice,
        "nohup": _unwrap_nohup,
        "time": _unwrap_time,
        "stdbuf": _unwrap_stdbuf,
        "env": _unwrap_env,
        "command": _unwrap_command,
        "builtin": _unwrap_builtin,
    }
)


def unwrap_wrapper(name: str, args: Sequence[Word]) -> Unwrapped | None:
    """If `name` is a benign wrapper, what it runs (or its own verdict); else `None`."""
    unwrap = _WRAPPERS.get(name)
    return None if unwrap is None else unwrap(args)
