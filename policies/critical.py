"""Critical deletes: commands that can destroy the workspace, its history or the home directory.

The bash analyser (`policies.bash_analysis`) hands every simple command here, as its words;
`delete_danger` says whether it is a critical delete and why. The policy engine never
auto-approves a critical delete, in any mode and whatever the allow rules say (an explicit
`Bash(rm:*)` included): it asks, which is a deny where nobody can answer (`dont-ask`,
headless runs). DESIGN.md promises that deleting the workspace root is never auto-approved;
with bypass mode the analyser is the only thing standing between a misled model and
`rm -rf "$PWD"`, so the test is by shape, not by a list of spellings:

- any delete (`rm`, `unlink`, `shred`, `mv` of a source, ...) of `/`, a top-level system
  directory, `~` or anything above it, `.`, `..`, the workspace root or an ancestor of it, or
  a `.git` directory or anything inside one;
- a recursive delete (`rm -r`, `find -delete`, `find -exec rm`, `xargs rm -r`, `shred`,
  `truncate`, `git clean`) whose target is not a literal path strictly inside the workspace:
  a variable (`"$PWD"`, `"$DIR"`), a substitution, input from a pipe (`pwd | xargs rm -rf`),
  `..` upwards, an absolute path elsewhere, or a glob whose directory is not strictly inside
  (`*`, `*.o` at the top);
- a relative recursive target after a `cd` that may leave the workspace (`cd .. && rm -rf
  ws`): the analyser reports those targets (`DeleteCheck.relative`) and decides at the end of
  the line.

Over-matching only costs a question; the cases are pinned in
tests/policies/test_critical_deletes.py, each in every mode of the engine.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from policies.catalogue import Word, name_set, resolve_program

__all__ = ["DELETE_PROGRAMS", "DeleteCheck", "cd_may_leave", "delete_danger", "is_critical_path"]


DELETE_PROGRAMS: Final = name_set("rm unlink shred truncate rmdir mv find git rsync")
"""Programs `delete_danger` looks at (after unwrapping wrappers)."""

_WRAPPERS = name_set("env timeout nice nohup stdbuf time command builtin exec sudo doas xargs")
_SHELLS_AND_RUNNERS = name_set(
    "sh bash zsh dash ksh mksh fish busybox env sudo doas timeout nice nohup command xargs"
    " find perl python python3 node ruby php"
)
_TOP_LEVEL_DIRS = name_set(
    "bin boot dev etc home lib lib32 lib64 libx32 media mnt opt proc root run sbin srv"
    " sys tmp usr var"
)
_CWD_TEXT = re.compile(r"\$\{?(?:PWD|OLDPWD)\b|\$\(\s*pwd\b|`\s*pwd\b")
_UNKNOWN_INPUT = Word(text="<standard input>", value=None, prefix="", first_unknown="expansion")
"""The operands `xargs` appends: not known before the command runs."""


@dataclass(frozen=True, slots=True)
class DeleteCheck:
    """What `delete_danger` found about one simple command."""

    danger: str | None = None
    """Why this command is a critical delete, for the user; None when it is not."""
    relative: str | None = None
    """A relative target of a recursive delete (`build`): critical when the line's working
    directory may have left the workspace before it runs."""


_NOTHING: Final = DeleteCheck()


def delete_danger(words: Sequence[Word], workspace: Path | None) -> DeleteCheck:
    """Whether the simple command `words` (program first) is a critical delete.

    Wrappers are looked through leniently (`timeout 5 rm -rf /`, `sudo -u x rm -rf /`,
    `xargs -0 rm -rf`): the first word naming a delete program after a wrapper is taken as
    the command, so an unknown wrapper option cannot hide a delete.
    """
    if not words:
        return _NOTHING
    if words[0].value is None:
        # `$RM -rf "$PWD"`: a program not known before it runs may be rm.
        root = None if workspace is None else posixpath.normpath(str(workspace))
        found = _rm(words[1:], root, label=words[0].text)
        return _NOTHING if found.danger is None else found
    name = _program(words[0])
    if name not in DELETE_PROGRAMS and name not in _WRAPPERS:
        return _NOTHING  # the common case, kept cheap: every simple command comes here
    root = None if workspace is None else posixpath.normpath(str(workspace))
    from_input = False
    start = 0
    if name in _WRAPPERS:
        for index in range(1, len(words)):
            candidate = _program(words[index])
            if candidate in DELETE_PROGRAMS:
                name, start = candidate, index
                break
        else:
            return DeleteCheck()
        from_input = any(_program(w) == "xargs" for w in words[:start])
    if name not in DELETE_PROGRAMS:
        return DeleteCheck()
    args = list(words[start + 1 :])
    if from_input:
        args.append(_UNKNOWN_INPUT)
    match name:
        case "rm":
            return _rm(args, root)
        case "unlink" | "rmdir":
            return _each_target(name, _operands(args, ""), root, recursive=False)
        case "shred" | "truncate":
            values = "ns" if name == "shred" else "sr"
            return _each_target(name, _operands(args, values), root, recursive=True)
        case "mv":
            return _mv(args, root)
        case "find":
            return _find(args, root)
        case "git":
            return _git_clean(args, root)
        case "rsync":
            return _rsync(args, root)
    return DeleteCheck()


def cd_may_leave(args: Sequence[Word], workspace: Path | None) -> bool:
    """Whether `cd ARGS` may take the shell out of the workspace (or somewhere unknown)."""
    operands = [w for w in args if not (w.value or w.prefix).startswith("-") or w.value == "-"]
    if len(operands) != 1 or operands[0].value is None:
        return True  # `cd` (home), `cd "$X"`, `cd ~`
    value = operands[0].value
    if value == "-":
        return True
    if value.startswith("/"):
        root = None if workspace is None else posixpath.normpath(str(workspace))
        normal = posixpath.normpath(value)
        return root is None or not (normal == root or normal.startswith(root + "/"))
    normal = posixpath.normpath(value)
    return normal == ".." or normal.startswith("../")


def is_critical_path(view: str, workspace: Path | None) -> bool:
    """Whether deleting `view` (a word as rm sees it, variables assumed empty) is critical.

    Critical: `/`, a top-level system directory, the home directory or above, `.`, `..`
    (and `../..`), the workspace root or an ancestor of it, a `.git` directory, and
    everything inside any of these (`/*`, `~/*`, `.git/objects`).
    """
    if "\x02" in view:  # brace expansion: judge the literal text before it
        before = view.split("\x02", 1)[0]
        return before == "" or is_critical_path(before, workspace)
    if view == "":
        return False
    path = re.sub("/+", "/", view)
    while True:
        if path in ("*", ".*"):
            path = "."
        elif path.endswith(("/*", "/.*")):
            path = path[: path.rfind("/")] or "/"
        elif len(path) > 1 and path.endswith("/"):
            path = path[:-1]
        else:
            break
    if ".git" in path.split("/"):
        return True
    if path.startswith("~"):
        slash = path.find("/")
        rest = "" if slash < 0 else path[slash:]
        return posixpath.normpath("/home/\x03" + rest) in ("/", "/home", "/home/\x03")
    normal = posixpath.normpath(path)
    if normal in (".", "..", "/") or all(part == ".." for part in normal.split("/")):
        return True
    if normal.startswith("/") and normal.count("/") == 1 and normal[1:] in _TOP_LEVEL_DIRS:
        return True
    if workspace is None or not normal.startswith("/"):
        return False
    root = posixpath.normpath(str(workspace))
    return normal == root or root.startswith(normal.rstrip("/") + "/")


# --- per program --------------------------------------------------------------------------


def _program(word: Word) -> str | None:
    if word.value is None:
        return None
    name, _ = resolve_program(word.value)
    return name if name is not None else posixpath.basename(word.value)


def _operands(args: Sequence[Word], short_values: str) -> list[Word]:
    """The non-option words (`--` ends options; `-sSIZE` and `-s SIZE` take a value)."""
    out: list[Word] = []
    expect_value = False
    ended = False
    for word in args:
        value = word.value
        if expect_value:
            expect_value = False
            continue
        if ended:
            out.append(word)
            continue
        if value is None:
            out.append(word)  # `-r$X` may split into `-r /`: an unknown operand too
            continue
        if value == "-" or not value.startswith("-"):
            out.append(word)
            continue
        if value == "--":
            ended = True
        elif not value.startswith("--"):
            letters = value[1:]
            for index, letter in enumerate(letters):
                if letter in short_values:
                    expect_value = index == len(letters) - 1
                    break
        elif "=" not in value and value[2:] in ("size", "reference", "iterations", "random-source"):
            expect_value = True
    return out


def _rm(args: Sequence[Word], root: str | None, *, label: str = "rm") -> DeleteCheck:
    recursive = False
    for word in args:
        value = word.value
        if value == "--":
            break
        if value is None:
            if word.unknown_option:
                recursive = True  # `-$FLAGS` may be `-r`
            continue
        if value.startswith("--"):
            recursive = recursive or value == "--recursive" or "--recursive".startswith(value)
        elif value.startswith("-") and value != "-":
            recursive = recursive or "r" in value or "R" in value
    return _each_target(label, _operands(args, ""), root, recursive=recursive)


def _each_target(
    program: str, targets: Sequence[Word], root: str | None, *, recursive: bool
) -> DeleteCheck:
    relative: str | None = None
    for word in targets:
        danger = _target_danger(program, word, root, recursive=recursive)
        if danger is not None:
            return DeleteCheck(danger=danger)
        literal = word.value is not None or word.only_globs
        if recursive and literal and not word.prefix.startswith("/"):
            relative = relative or f"`{program} {word.text}`"
    return DeleteCheck(relative=relative)


def _target_danger(program: str, word: Word, root: str | None, *, recursive: bool) -> str | None:
    view = word.critical_view if word.value is None else word.value
    if is_critical_path(view, _as_path(root)) or _CWD_TEXT.search(word.text):
        return f"`{program} {word.text}` deletes {_what(view, root)}"
    if not recursive:
        return None
    if word.value is not None:
        where = _strictly_inside(word.value, root)
    elif word.only_globs and "\x02" not in view:
        where = _glob_strictly_inside(view, root)
    else:
        where = "a path that is not known before the command runs"
    if where is None:
        return None
    return (
        f"`{program} {word.text}` deletes recursively {where}, not a literal path strictly "
        "inside the workspace"
    )


def _as_path(root: str | None) -> Path | None:
    return None if root is None else Path(root)


def _what(view: str, root: str | None) -> str:
    path = posixpath.normpath(view) if view not in ("", "*") else "."
    if path == "/":
        return "/ (everything)"
    if path.startswith("/") and path.count("/") == 1 and path[1:] in _TOP_LEVEL_DIRS:
        return f"{path}, a system directory"
    if ".git" in path.split("/"):
        return "the repository's history (.git)"
    if root is not None and path.startswith("/") and root.startswith(path.rstrip("/") + "/"):
        return f"{path}, an ancestor of the workspace"
    if root is not None and path == root:
        return "the workspace root"
    if path in (".", "*") or view.startswith("*"):
        return "the current directory, which may be the workspace root"
    if path.startswith(".."):
        return f"{path}, above the current directory"
    if view.startswith("~"):
        return "the home directory"
    return "a critical path"


def _strictly_inside(value: str, root: str | None) -> str | None:
    """None when the literal path `value` is strictly inside the workspace, else where it is."""
    if value.startswith("/"):
        normal = posixpath.normpath(value)
        if root is None or not normal.startswith(root + "/"):
            return f"{normal}, outside the workspace"
        rest = normal[len(root) + 1 :]
    else:
        rest = posixpath.normpath(value)
        if rest == "." or rest == ".." or rest.startswith("../"):
            return f"{value}, which is not below the current directory"
    if ".git" in rest.split("/"):
        return "the repository's history (.git)"
    return None


def _glob_strictly_inside(pattern: str, root: str | None) -> str | None:
    """A glob is inside when its literal directory is, and it cannot match `..` or `.git`."""
    first = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    slash = pattern.rfind("/", 0, first)
    if slash <= 0:
        return f"`{pattern}` in the current directory, which may be the workspace root"
    components = pattern.split("/")
    if any(
        part in ("..", ".git") or (part.startswith(".") and any(c in part for c in "*?["))
        for part in components
    ):
        return f"`{pattern}`, which can match `..` or `.git`"
    return _strictly_inside(pattern[:slash], root)


def _mv(args: Sequence[Word], root: str | None) -> DeleteCheck:
    operands = _operands(args, "tS")
    target_dir = any(w.value is not None and w.value.startswith(("-t", "--target")) for w in args)
    sources = operands if target_dir else operands[:-1]
    for word in sources:
        view = word.critical_view if word.value is None else word.value
        if is_critical_path(view, _as_path(root)) or _CWD_TEXT.search(word.text):
            return DeleteCheck(danger=f"`mv {word.text}` moves away {_what(view, root)}")
    return DeleteCheck()


_FIND_OPTIONS = frozenset({"-H", "-L", "-P"})
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(args: Sequence[Word], root: str | None) -> DeleteCheck:
    index = 0
    while index < len(args) and (
        args[index].value in _FIND_OPTIONS or (args[index].value or "").startswith(("-D", "-O"))
    ):
        index += 2 if args[index].value == "-D" else 1
    roots: list[Word] = []
    while index < len(args):
        value = args[index].value
        if value is not None and (value.startswith(("-", "(", "!")) or value in (")", ",")):
            break
        roots.append(args[index])
        index += 1
    deletes = None
    for position in range(index, len(args)):
        value = args[position].value
        if value == "-delete" or (value is None and args[position].unknown_option):
            deletes = "-delete" if value else args[position].text
        elif value in _FIND_EXEC and position + 1 < len(args):
            program = _program(args[position + 1])
            if program is None or program in DELETE_PROGRAMS or program in _SHELLS_AND_RUNNERS:
                deletes = f"{value} {args[position + 1].text}"
        if deletes:
            break
    if deletes is None:
        return DeleteCheck()
    if not roots:
        roots = [Word(text=".", value=".", prefix=".")]
    found = _each_target("find", roots, root, recursive=True)
    if found.danger is not None:
        return DeleteCheck(danger=f"{found.danger} (with `{deletes}`)")
    return found


_GIT_VALUE_OPTIONS = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace"})


def _git_clean(args: Sequence[Word], root: str | None) -> DeleteCheck:
    """`git clean` deletes untracked (with -x also ignored) files: the work nobody committed."""
    index = 0
    base: list[Word] = []
    while index < len(args):
        value = args[index].value
        if value is None or not value.startswith("-"):
            break
        if value in _GIT_VALUE_OPTIONS:
            if value == "-C" and index + 1 < len(args):
                base.append(args[index + 1])
            index += 2
        else:
            index += 1
    if index >= len(args) or args[index].value != "clean":
        return DeleteCheck()
    rest = args[index + 1 :]
    if any(w.value in ("-n", "--dry-run") or _short_has(w, "n") for w in rest):
        return DeleteCheck()
    pathspecs = _operands(rest, "e")
    for directory in base:
        if directory.value is None or directory.value.startswith("/"):
            danger = _target_danger("git -C", directory, root, recursive=True)
            if danger is not None:
                return DeleteCheck(danger=danger)
    if not pathspecs and not base:
        return DeleteCheck(
            danger="`git clean` without a path deletes every untracked file of the repository"
        )
    check = _each_target("git clean", pathspecs or base, root, recursive=True)
    if check.danger is not None:
        return check
    return DeleteCheck(relative=check.relative or "`git clean`")


def _short_has(word: Word, letter: str) -> bool:
    value = word.value
    return (
        value is not None
        and value.startswith("-")
        and not value.startswith("--")
        and letter in value[1:].split("e", 1)[0]
    )


def _rsync(args: Sequence[Word], root: str | None) -> DeleteCheck:
    """`rsync --delete SRC DEST` empties DEST of everything SRC does not have."""
    if not any(w.value is not None and w.value.startswith("--del") for w in args):
        return DeleteCheck()
    operands = _operands(args, "efB")
    if not operands:
        return DeleteCheck()
    return _each_target("rsync --delete", operands[-1:], root, recursive=True)
