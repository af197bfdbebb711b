"""What a simple command really runs, spelled for deny and ask rules.

`deny = ["Bash(git clean:*)"]` must also deny `git -C . clean`, `/usr/bin/git clean`,
`timeout 5 git clean`, `xargs git clean` and `sh -c 'git clean -fd'`. The bash analyser
(`policies.bash_analysis`) turns each simple command into its argv values (quotes removed,
`None` for a word not known before it runs) and asks `command_views` for the argvs a rule
should be matched against: the program by its base name, git without its global options,
and what every wrapper (`env`, `timeout`, `nice`, `nohup`, `command`, `builtin`, `exec`,
`sudo`, `xargs`, ...) and `find -exec` runs. Wrappers are looked through leniently: every
later word that could start the wrapped command starts a view, so a wrapper option the code
does not know cannot hide a command. Scripts (`sh -c SCRIPT`, `eval ARGS`) are returned for
the analyser to parse; one that is not literal is a view of `(None,)`: it could be anything.

The engine matches views with `None` as a wildcard for the rest of the line
(`policies.engine`): over-matching a deny costs a question or a refusal, missing one runs
what the user forbade. Pure functions; tests/policies/test_deny_wrappers.py.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from policies.catalogue import name_set

__all__ = ["CommandView", "ViewsFound", "command_views"]

CommandView = tuple[str | None, ...]
"""An argv: the program's base name first; `None` for a word not known before it runs."""


_WRAPPERS: Final = name_set(
    "env timeout nice nohup stdbuf time command builtin exec sudo doas xargs setsid ionice"
    " chrt taskset unbuffer flock chroot nsenter watch strace ltrace catchsegv"
)
_SHELLS: Final = name_set("sh bash zsh dash ksh mksh fish busybox")
_LOOKED_INTO: Final = _WRAPPERS | _SHELLS | {"eval", "find", "git"}
_SHELL_C = re.compile(r"-[a-zA-Z]*c[a-zA-Z]*")
_FIND_EXEC: Final = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
# git's global options that take the next word as their value (`git -C dir clean`).
_GIT_VALUE_OPTIONS: Final = frozenset(
    {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env", "--super-prefix"}
)
_MAX_VIEWS = 64


@dataclass(slots=True)
class ViewsFound:
    """The views of one simple command, and the scripts it runs that the caller must parse."""

    views: list[CommandView] = field(default_factory=list)
    scripts: list[str | None] = field(default_factory=list)
    """`sh -c` and `eval` scripts, in order; `None` where the script is not literal."""


def command_views(values: Sequence[str | None]) -> ViewsFound:
    """The argvs a deny or ask rule should see for the simple command `values`."""
    found = ViewsFound()
    head = values[0] if values else None
    if head is not None and "/" not in head and head not in _LOOKED_INTO:
        found.views.append(tuple(values))  # the common case: the command is its own view
        return found
    pending: list[tuple[tuple[str | None, ...], bool]] = [(tuple(values), False)]
    while pending and len(found.views) < _MAX_VIEWS:
        argv, from_xargs = pending.pop()
        if not argv:
            continue
        head = argv[0]
        if head is None:
            found.views.append((None,))  # `$CMD ...`: could run anything
            continue
        name = posixpath.basename(head) or head
        view: CommandView = (name, *argv[1:])
        if from_xargs:
            view = (*view, None)  # xargs appends words read from its input
        if name == "git":
            view = _without_git_globals(view)
        found.views.append(view)
        if name in _WRAPPERS:
            xargs = from_xargs or name == "xargs"
            for index in range(1, len(argv)):
                word = argv[index]
                if word is None:
                    pending.append(((None,), False))
                    break
                if not word.startswith("-") and "=" not in word:
                    pending.append((argv[index:], xargs))
        elif name in _SHELLS:
            for index, word in enumerate(argv[1:-1], start=1):
                if word is not None and _SHELL_C.fullmatch(word):
                    found.scripts.append(argv[index + 1])
                    break
                if word is None:
                    found.scripts.append(None)
                    break
        elif name == "eval":
            rest = argv[1:]
            found.scripts.append(None if None in rest else " ".join(w for w in rest if w))
        elif name == "find":
            for index, word in enumerate(argv):
                if word in _FIND_EXEC:
                    end = index + 1
                    while end < len(argv) and argv[end] not in (";", "+"):
                        end += 1
                    pending.append((argv[index + 1 : end], False))
    return found


def _without_git_globals(view: CommandView) -> CommandView:
    """`git -C . --no-pager -c k=v clean -fd` is `git clean -fd` to a rule."""
    index = 1
    while index < len(view):
        word = view[index]
        if word is None:
            return ("git", None)  # `git -C . $SUB`: anything from here
        if not word.startswith("-"):
            break
        index += 2 if word in _GIT_VALUE_OPTIONS else 1
    return ("git", *view[index:])
