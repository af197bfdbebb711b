"""What every policy source shares: its one error, how its file is read, and the base of
the tables it declares.

Warren's own policy files (`policies.files`, TOML) and Claude Code's settings files
(`policies.claude_settings`, JSON) are both read by the coordinator on the host, and both may
lie in a repository someone else controls. So both are read here, by the rules of
`policies.atomic` (no link followed in a repository, no FIFO or device opened for reading, at
most `MAX_SOURCE_BYTES`), and both fail the same way: one `PolicyError` naming the file and,
when known, the line and the key. Every table they declare (`[limits]`, a hook,
`[mcp.servers.NAME]`, `[pool]`) is a `PolicyTable`, and a number of seconds or a limit in one
is refused unless `finite`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Final, assert_never

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from policies.atomic import read_regular

__all__ = [
    "MAX_SOURCE_BYTES",
    "PolicyError",
    "PolicyTable",
    "Seconds",
    "finite",
    "read_source_text",
]

MAX_SOURCE_BYTES: Final = 1 << 20
"""A policy or settings file larger than this is refused unread."""


class PolicyError(Exception):
    """A policy that cannot be used. Nothing runs on it.

    `file` is the path of the policy file (or `command line`, `built-in`), `line` the 1-based
    line when known, `key` the dotted key (`permissions.allow[2]`, or a JSON path such as
    `hooks.PreToolUse[0].hooks[1].timeout`) when known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        where = ":".join(part for part in (file, str(line) if line else None) if part)
        text = ": ".join(part for part in (where, key, message) if part)
        super().__init__(text)
        self.message = message
        self.file = file
        self.line = line
        self.key = key


class PolicyTable(BaseModel):
    """Base of every table a policy source declares: an unknown key is an error (a misspelt
    rule never goes unnoticed), and nothing is changed once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def finite(value: float) -> float:
    """A validator for a table's number: TOML and JSON can write `nan` and `inf`, which no
    limit or timeout means."""
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Seconds = Annotated[float, Field(gt=0, le=3600), AfterValidator(finite)]
"""A time limit of a hook or an MCP server: more than 0 and at most an hour."""


def read_source_text(path: Path, *, beneath: Path | None = None) -> str | None:
    """The text of one policy source; None when it does not exist.

    With `beneath` (the repository, for its files) no link is followed, below it or as the
    file; without, the file may be a link (the user's own files). Either way a FIFO, a device
    or a file over `MAX_SOURCE_BYTES` is an error, never a read that hangs.

    **Errors:** `PolicyError` naming the file (a link, not a regular file, too large,
    unreadable, not UTF-8 with the line of the first bad byte).
    """
    try:
        found = read_regular(
            path, limit=MAX_SOURCE_BYTES, beneath=beneath, follow_links=beneath is None
        )
    except OSError as exc:
        raise PolicyError(f"cannot read the file: {exc.strerror or exc}", file=str(path)) from None
    match found.state:
        case "missing":
            return None
        case "file":
            raw = found.content
        case "link":
            raise PolicyError(
                "it, or a directory on the way to it, is a symbolic link; Warren does not "
                "follow links in a repository (make it a regular file)",
                file=str(path),
            )
        case "not a regular file":
            raise PolicyError("cannot read the file: not a regular file", file=str(path))
        case "too large":
            raise PolicyError(
                f"cannot read the file: larger than {MAX_SOURCE_BYTES} bytes", file=str(path)
            )
        case unreachable:
            assert_never(unreachable)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise PolicyError("the file is not valid UTF-8", file=str(path), line=line) from None
