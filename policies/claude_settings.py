"""Claude Code's settings files as another policy source.

Teams that already tune Claude Code per repository keep that tuning in `.claude/settings.json`
(committed), `.claude/settings.local.json` (not committed) and the user's
`~/.claude/settings.json` (`$CLAUDE_CONFIG_DIR/settings.json` when set). Warren reads them at
the levels of its own files (`policies.files`): user, project, local. A repository's two files
are read only once the user trusts the repository (they are part of what trust hashes,
`policies.trust`), and by the same rules as its policy files: no link followed, no FIFO or
device opened for reading, at most 1 MiB (`policies.sources.read_source_text`).

`read_claude_settings` returns the whole file as a `ClaudeSettings` value: the parsed JSON
object, and what Warren maps from it today, its hooks. Claude Code nests them as

    {"hooks": {"PreToolUse": [{"matcher": "Edit|Write",
                               "hooks": [{"type": "command", "command": "...", "timeout": 30}]}]}}

and each `type: "command"` entry becomes one `policies.hooks.Hook` with `matcher_kind =
"regex"` (Claude Code's matcher style), its `timeout` (seconds) as `timeout_s`. A matcher of
`""` or `"*"` becomes None (every call), and so does the matcher of an event other than
PreToolUse, PostToolUse, SessionStart and PreCompact, which Claude Code ignores too (Warren
sends Notification only while a permission ask waits). A hook Warren
does not run (another `type`, such as `prompt`; an event Warren does not have; a file with
`disableAllHooks`; a matcher Python cannot compile) is an `UnsupportedHook`, listed by
`warren policy show`, never dropped silently.

Its `permissions` map to Warren's policy at the file's level (`ClaudePermissions`): `allow`,
`ask` and `deny` rules (the same `Tool(specifier)` syntax, `policies.rules`; Claude Code's
`Task(name)` and `Agent(name)` are `dispatch_agent(name)`), `defaultMode` (Claude Code's
spellings `acceptEdits`, `dontAsk`, `bypassPermissions` or Warren's) and
`additionalDirectories` (more writable roots, under the floor). A rule that does not parse
is an error at its JSON path; a permission key Warren does not have is listed in
`ClaudePermissions.unsupported` (shown, never silently taken). The other top-level keys
(`env`, `model`, ...) stay in `ClaudeSettings.data`.

A file that is not JSON, or whose hooks have the wrong shape, is one `PolicyError` naming the
file and the JSON path (`hooks.PreToolUse[0].hooks[1].timeout`); nothing runs on it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from pydantic import ValidationError

from policies.atomic import read_regular
from policies.claude_names import CLAUDE_MODE_NAMES, warren_mode, warren_rule
from policies.hooks import HOOK_EVENTS, MATCHER_EVENTS, Hook, UnsupportedHook
from policies.rules import RuleSyntaxError, parse_rule
from policies.sources import MAX_SOURCE_BYTES, PolicyError, read_source_text

__all__ = [
    "CLAUDE_LOCAL_SETTINGS",
    "CLAUDE_SETTINGS",
    "ClaudePermissions",
    "ClaudeSettings",
    "claude_config_dir",
    "claude_settings_files",
    "count_declared_hooks",
    "parse_claude_settings",
    "read_claude_settings",
    "user_claude_settings",
]

CLAUDE_SETTINGS: Final = Path(".claude/settings.json")
"""The repository's Claude Code settings, committed (relative to its root)."""
CLAUDE_LOCAL_SETTINGS: Final = Path(".claude/settings.local.json")
"""The user's own Claude Code settings for one repository, not committed."""
_MAX_TIMEOUT_S: Final = 3600


def claude_settings_files(root: Path) -> tuple[Path, Path]:
    """The project and local Claude Code settings files of the repository at `root`."""
    return root / CLAUDE_SETTINGS, root / CLAUDE_LOCAL_SETTINGS


def claude_config_dir(env: Mapping[str, str] | None = None) -> Path:
    """The user's Claude Code directory, as Claude Code finds it: `$CLAUDE_CONFIG_DIR`, else
    `~/.claude` (its settings here; its agents, orchestrator/claude_code/agents.py)."""
    env = os.environ if env is None else env
    if directory := env.get("CLAUDE_CONFIG_DIR"):
        return Path(directory)
    return Path(env.get("HOME") or Path.home()) / ".claude"


def user_claude_settings(env: Mapping[str, str] | None = None) -> Path:
    """The user's Claude Code settings: `$CLAUDE_CONFIG_DIR/settings.json`, else
    `~/.claude/settings.json` (`claude_config_dir`)."""
    return claude_config_dir(env) / "settings.json"


_PERMISSION_KEYS: Final = ("allow", "ask", "deny", "defaultMode", "additionalDirectories")


@dataclass(frozen=True)
class ClaudePermissions:
    """A settings file's `permissions`, in Warren's terms."""

    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    """Rules in Warren's syntax (each parsed; `Task(x)` written `dispatch_agent(x)`)."""
    mode: str | None = None
    """`defaultMode` as Warren spells it (`accept-edits`, ...); None when unset."""
    additional_directories: tuple[str, ...] = ()
    """More writable roots, as written (relative to the workspace, `~/`, or absolute)."""
    unsupported: tuple[str, ...] = ()
    """Keys of `permissions` Warren does not have (`disableBypassPermissionsMode`, ...)."""


@dataclass(frozen=True)
class ClaudeSettings:
    """One Claude Code settings file, parsed."""

    file: str
    """Its path, as hooks and errors name it."""
    data: Mapping[str, Any]
    """The whole JSON object as read (read-only at the top). What Warren does not map yet
    (`permissions`, ...) is read from here by the readers to come."""
    hooks: tuple[Hook, ...] = ()
    """Its `type: "command"` hooks for the events Warren has, in file order."""
    unsupported: tuple[UnsupportedHook, ...] = ()
    """The hooks it declares that Warren does not run, with why."""
    permissions: ClaudePermissions = ClaudePermissions()
    """Its `permissions`, mapped."""


def read_claude_settings(path: Path, *, beneath: Path | None = None) -> ClaudeSettings | None:
    """Read and map one settings file; None when it does not exist.

    `beneath` is the repository for its own files (nothing followed through a link), None for
    the user's file (which may be a link, as dotfile managers make them).

    **Errors:** `PolicyError` naming the file (and the line, or the JSON path).
    """
    text = read_source_text(path, beneath=beneath)
    return None if text is None else parse_claude_settings(text, file=str(path))


def parse_claude_settings(text: str, *, file: str) -> ClaudeSettings:
    """Parse one settings file's text and map its hooks. Raises one located `PolicyError`."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise PolicyError(
            f"JSON syntax error: {exc.msg} (column {exc.colno})", file=file, line=exc.lineno
        ) from None
    except ValueError as exc:  # NaN / Infinity, which JSON does not have
        raise PolicyError(f"JSON syntax error: {exc}", file=file) from None
    except RecursionError:
        raise PolicyError("nested too deeply to read", file=file) from None
    if not isinstance(data, dict):
        raise PolicyError("the settings must be a JSON object", file=file)
    hooks, unsupported = _map_hooks(data, file)
    permissions = _map_permissions(data, file)
    return ClaudeSettings(file, MappingProxyType(data), hooks, unsupported, permissions)


def _map_permissions(data: Mapping[str, Any], file: str) -> ClaudePermissions:
    value = data.get("permissions")
    if value is None:
        return ClaudePermissions()
    if not isinstance(value, dict):
        raise PolicyError(
            'must be an object such as {"allow": [...], "deny": [...]}',
            file=file,
            key="permissions",
        )
    rules: dict[str, tuple[str, ...]] = {}
    for kind in ("allow", "ask", "deny"):
        texts = value.get(kind, [])
        if not isinstance(texts, list):
            raise PolicyError(
                'must be a list of rules such as "Bash(make:*)"',
                file=file,
                key=_key("permissions", kind),
            )
        out: list[str] = []
        for index, text in enumerate(texts):
            where = _key("permissions", kind, index)
            if not isinstance(text, str):
                raise PolicyError("must be a rule string", file=file, key=where)
            rule = warren_rule(text)
            try:
                parse_rule(rule)
            except RuleSyntaxError as exc:
                raise PolicyError(str(exc), file=file, key=where) from None
            out.append(rule)
        rules[kind] = tuple(out)
    mode = value.get("defaultMode")
    if mode is not None and (not isinstance(mode, str) or warren_mode(mode) is None):
        raise PolicyError(
            f"{json.dumps(mode)} is not a mode Warren has; write one of "
            f"{', '.join(CLAUDE_MODE_NAMES.values())}",
            file=file,
            key="permissions.defaultMode",
        )
    directories = value.get("additionalDirectories", [])
    if not isinstance(directories, list) or not all(
        isinstance(d, str) and d.strip() for d in directories
    ):
        raise PolicyError(
            "must be a list of directory paths",
            file=file,
            key="permissions.additionalDirectories",
        )
    return ClaudePermissions(
        allow=rules["allow"],
        ask=rules["ask"],
        deny=rules["deny"],
        mode=None if mode is None else warren_mode(mode),
        additional_directories=tuple(directories),
        unsupported=tuple(sorted(k for k in value if k not in _PERMISSION_KEYS)),
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def count_declared_hooks(path: Path, *, beneath: Path) -> int | None:
    """How many hooks an untrusted repository's settings file declares, for the notice that
    they will not run; None when there is no file.

    Never an error and never more than a look: the file is read as trust hashing reads it
    (`read_regular`, no link, bounded) and nothing in it is used. A link, a FIFO or a file
    that does not parse counts 0.
    """
    try:
        found = read_regular(path, limit=MAX_SOURCE_BYTES, beneath=beneath)
    except OSError:
        return 0
    if found.state == "missing":
        return None
    if found.state != "file":
        return 0
    try:
        data = json.loads(found.content)
    except (ValueError, RecursionError):
        return 0
    events = data.get("hooks") if isinstance(data, dict) else None
    if not isinstance(events, dict):
        return 0
    count = 0
    for groups in events.values():
        for group in groups if isinstance(groups, list) else ():
            inner = group.get("hooks") if isinstance(group, dict) else None
            count += len(inner) if isinstance(inner, list) else 0
    return count


# -- mapping --


def _key(*parts: str | int) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_]+", part):
            out += ("." if out else "") + part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _map_hooks(
    data: Mapping[str, Any], file: str
) -> tuple[tuple[Hook, ...], tuple[UnsupportedHook, ...]]:
    events = data.get("hooks")
    if events is None:
        return (), ()
    if not isinstance(events, dict):
        raise PolicyError(
            "must be an object from event names to lists of {matcher, hooks}",
            file=file,
            key="hooks",
        )
    disabled = data.get("disableAllHooks", False)
    if not isinstance(disabled, bool):
        raise PolicyError("must be true or false", file=file, key="disableAllHooks")
    hooks: list[Hook] = []
    unsupported: list[UnsupportedHook] = []
    for event, groups in events.items():
        if not isinstance(groups, list):
            raise PolicyError(
                "must be a list of {matcher, hooks} objects", file=file, key=_key("hooks", event)
            )
        for index, group in enumerate(groups):
            where = ("hooks", event, index)
            if not isinstance(group, dict):
                raise PolicyError(
                    "must be an object with `matcher` and `hooks`", file=file, key=_key(*where)
                )
            matcher = group.get("matcher")
            if matcher is not None and not isinstance(matcher, str):
                raise PolicyError(
                    "must be a string (a tool name, `Edit|Write`, or a regular expression)",
                    file=file,
                    key=_key(*where, "matcher"),
                )
            entries = group.get("hooks")
            if not isinstance(entries, list):
                raise PolicyError(
                    'must be a list of hooks such as {"type": "command", "command": "..."}',
                    file=file,
                    key=_key(*where, "hooks"),
                )
            for number, entry in enumerate(entries):
                key = _key(*where, "hooks", number)
                hook, why = _map_one(event, matcher, entry, file, key)
                if why is None and disabled:
                    why = "`disableAllHooks` is set in this file"
                if hook is not None and why is None:
                    hooks.append(hook)
                    continue
                assert isinstance(entry, dict) and why is not None
                kind = str(entry.get("type"))
                text = entry.get("command" if kind == "command" else "prompt")
                unsupported.append(
                    UnsupportedHook(
                        event=event,
                        matcher=matcher,
                        type=kind,
                        text=text if isinstance(text, str) else "",
                        reason=why,
                        source=file,
                        key=key,
                    )
                )
    return tuple(hooks), tuple(unsupported)


def _map_one(
    event: str, matcher: str | None, entry: Any, file: str, key: str
) -> tuple[Hook | None, str | None]:
    """One `hooks[]` entry: (the hook, None), or (None, why Warren does not run it).

    **Errors:** `PolicyError` at `key` for a wrong shape.
    """
    if not isinstance(entry, dict):
        raise PolicyError(
            'must be an object such as {"type": "command", "command": "..."}', file=file, key=key
        )
    kind = entry.get("type")
    if not isinstance(kind, str):
        raise PolicyError('must be "command" (or "prompt")', file=file, key=f"{key}.type")
    timeout = entry.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= _MAX_TIMEOUT_S
    ):
        raise PolicyError(
            f"must be a number of seconds, more than 0 and at most {_MAX_TIMEOUT_S}",
            file=file,
            key=f"{key}.timeout",
        )
    text_field = "command" if kind == "command" else "prompt"
    text = entry.get(text_field)
    if kind == "command" and (not isinstance(text, str) or not text.strip()):
        raise PolicyError("must be a non-empty shell command", file=file, key=f"{key}.command")
    if text is not None and not isinstance(text, str):
        raise PolicyError("must be a string", file=file, key=f"{key}.{text_field}")
    if event not in HOOK_EVENTS:
        return None, f"Warren has no {event} event"
    if kind != "command":
        return None, f'type "{kind}" hooks are not supported (only "command")'
    assert isinstance(text, str)
    if not matcher or matcher == "*" or event not in MATCHER_EVENTS:
        matcher = None  # matches everything; Claude Code ignores the matcher of other events
    try:
        hook = Hook.model_validate(
            {
                "event": event,
                "command": text,
                "matcher_kind": "regex",
                "matcher": matcher,
                "timeout_s": 60.0 if timeout is None else float(timeout),
            }
        )
    except ValidationError as exc:
        # The shape was checked above; what is left is a matcher Python cannot compile (a
        # JavaScript-only regular expression): Claude Code's hook, which Warren cannot read.
        problem = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        return None, f"the matcher is {problem}"
    return hook, None
