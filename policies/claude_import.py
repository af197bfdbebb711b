"""`warren policy import`: Claude Code's settings files written out as Warren's policy files.

Warren reads `.claude/settings*.json` as they are (`policies.claude_settings`), so importing
is never needed to honour them; it is for a team that wants one policy in Warren's format,
with comments. Each file goes to the Warren file of its level:

    .claude/settings.json         ->  .warren/policy.toml
    .claude/settings.local.json   ->  .warren/policy.local.toml

The target is edited with tomlkit, so its comments and layout stay: rules join the
`[permissions]` arrays (a rule already there is not repeated), `defaultMode` becomes `mode`
unless the file sets one (Warren's own setting wins, as it does when both are read),
`additionalDirectories` join `[sandbox] writable_roots`, and each hook becomes a `[[hooks]]`
table with `matcher_kind = "regex"` (Claude Code's matcher style). Hooks Warren does not run
and permission keys it does not have are listed, not written. The result is parsed before it
replaces the file atomically, never through a link in the repository; a file that cannot be
edited safely is an error and nothing changes. A changed project policy needs trusting again
(`policies.trust`), which the report says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.atomic import write_atomic
from policies.claude_settings import ClaudeSettings, claude_settings_files, read_claude_settings
from policies.files import PolicyFile, parse_policy_text, read_for_edit, toml_string
from policies.sources import PolicyError
from policies.trust import project_policy_files

__all__ = ["ImportResult", "import_claude_settings"]


@dataclass(frozen=True)
class ImportResult:
    """What one settings file gave its Warren file."""

    source: Path
    target: Path
    written: tuple[str, ...]
    """One line per thing added (`allow Bash(make:*)`, `mode accept-edits`, ...)."""
    skipped: tuple[str, ...]
    """One line per thing not written, with why."""


def import_claude_settings(workspace: Path, *, dry_run: bool = False) -> list[ImportResult]:
    """Import the repository's Claude Code settings files into its Warren policy files.

    **Errors:** `PolicyError` naming the file (a broken settings or policy file, a link, an
    edit that would not read back the same); files written before it stay written.
    """
    workspace = workspace.resolve()
    results = []
    pairs = zip(claude_settings_files(workspace), project_policy_files(workspace), strict=True)
    for source, target in pairs:
        settings = read_claude_settings(source, beneath=workspace)
        if settings is None:
            continue
        results.append(_import_one(settings, source, target, workspace, dry_run=dry_run))
    return results


def _import_one(
    settings: ClaudeSettings, source: Path, target: Path, workspace: Path, *, dry_run: bool
) -> ImportResult:
    import tomlkit

    text = read_for_edit(target, workspace)
    before = parse_policy_text(text, file=str(target)) if text.strip() else PolicyFile()
    document = tomlkit.parse(text)
    if not text.strip():
        document.add(tomlkit.comment(f"Imported from {source.relative_to(workspace)}"))
        document.add(tomlkit.nl())
    written: list[str] = []
    skipped: list[str] = []
    permissions = settings.permissions
    if permissions.mode is not None:
        if before.mode is None:
            document["mode"] = permissions.mode
            written.append(f"mode {permissions.mode}")
        elif before.mode != permissions.mode:
            skipped.append(f"defaultMode {permissions.mode}: the file keeps mode {before.mode}")
    have = before.permissions
    for kind, rules, existing in (
        ("allow", permissions.allow, have.allow),
        ("ask", permissions.ask, have.ask),
        ("deny", permissions.deny, have.deny),
    ):
        new = [rule for rule in rules if rule not in existing]
        if new:
            array = _array(document, ("permissions", kind), target)
            for rule in new:
                array.append(rule)
                written.append(f"{kind} {rule}")
    roots = [
        d for d in permissions.additional_directories if d not in before.sandbox.writable_roots
    ]
    if roots:
        array = _array(document, ("sandbox", "writable_roots"), target)
        for root in roots:
            array.append(root)
            written.append(f"writable_root {root}")
    for hook in settings.hooks:
        if hook in before.hooks:
            continue
        tables = document.get("hooks")
        if tables is None:
            tables = tomlkit.aot()
            document.append("hooks", tables)
        table = tomlkit.table()
        for key, value in hook.model_dump(exclude_defaults=True, mode="json").items():
            table[key] = value
        table["matcher_kind"] = "regex"
        tables.append(table)
        written.append(f"hook {hook.event} {hook.command}")
    skipped += [f"hook {u.event} {u.text or u.type}: {u.reason}" for u in settings.unsupported]
    skipped += [f"permissions.{key}: Warren has no such setting" for key in permissions.unsupported]
    updated = tomlkit.dumps(document)
    after = parse_policy_text(updated, file=str(target))
    _check_read_back(before, after, settings, target)
    if written and not dry_run:
        try:
            write_atomic(target, updated.encode("utf-8"), beneath=workspace)
        except OSError as exc:
            raise PolicyError(str(exc), file=str(target)) from None
    return ImportResult(source, target, tuple(written), tuple(skipped))


def _array(document: Any, path: tuple[str, str], target: Path) -> Any:
    """The array at `table.key` of `document`, made (multi-line) when missing."""
    import tomlkit
    from tomlkit.items import Array, InlineTable, Table

    table_name, key = path
    table = document.get(table_name)
    if table is None:
        table = tomlkit.table()
        document.add(table_name, table)
        table = document[table_name]
    if not isinstance(table, Table | InlineTable):
        raise PolicyError(
            "is not a table; add the settings by hand", file=str(target), key=table_name
        )
    array = table.get(key)
    if array is None:
        table.add(key, tomlkit.array().multiline(True))
        array = table[key]
    if not isinstance(array, Array):
        raise PolicyError(
            "is not an array; add the settings by hand", file=str(target), key=f"{table_name}.{key}"
        )
    return array


def _check_read_back(
    before: PolicyFile, after: PolicyFile, settings: ClaudeSettings, target: Path
) -> None:
    """The edited file reads back as before plus what the settings add, or nothing is
    written (tomlkit can misplace an edit in an unusual layout)."""
    wanted = settings.permissions
    ok = (
        set(after.permissions.allow) == {*before.permissions.allow, *wanted.allow}
        and set(after.permissions.ask) == {*before.permissions.ask, *wanted.ask}
        and set(after.permissions.deny) == {*before.permissions.deny, *wanted.deny}
        and after.mode == (before.mode or wanted.mode)
        and after.limits == before.limits
        and all(hook in after.hooks for hook in (*before.hooks, *settings.hooks))
    )
    if not ok:
        raise PolicyError(
            f"cannot add {settings.file}'s settings automatically; add them by hand "
            f"(for example {toml_string('Bash(make:*)')} in [permissions] allow)",
            file=str(target),
        )
