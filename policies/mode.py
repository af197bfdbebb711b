"""The session's permission mode: one live value with one setter.

The mode changes while a session runs: the REPL's `/permissions MODE`, its dialog's "always"
for edits (`accept-edits`), an SDK host's `set_permission_mode`. Everything that acts on the
mode (the policy engine's decisions, the hooks' sandbox and their input, the audit log, the
REPL's status line) holds this object and reads `current` when it needs the mode, so none of
them can keep a stale copy (the bug this fixed: after `/permissions plan` hooks still ran in
a writable sandbox and the audit log still said the old mode; tests/orchestrator/
test_live_mode_e2e.py). `set` is the only way to change it, and refuses what the floor does
not allow.
"""

from __future__ import annotations

from policies.claude_names import CLAUDE_MODE_NAMES, warren_mode
from policies.files import MODES, Mode

__all__ = ["ModeRefused", "PermissionMode"]


class ModeRefused(ValueError):
    """A mode that is not one, or `bypass` where the floor is not proven (the message says
    which, for the user or the SDK host that asked)."""


class PermissionMode:
    """The mode in force: read `current`; change it with `set`."""

    __slots__ = ("_current", "_floor_proven")

    def __init__(self, mode: Mode, *, floor_proven: bool) -> None:
        """`mode`: the mode the session starts in (already checked against the floor by the
        policy engine, which also honours `--i-know-there-is-no-sandbox` at start-up);
        `floor_proven`: whether a later switch to `bypass` may be made."""
        self._current: Mode = mode
        self._floor_proven = floor_proven

    @property
    def current(self) -> Mode:
        return self._current

    def set(self, name: str) -> Mode:
        """Switch to the mode `name` names, in Warren's spelling or Claude Code's; the mode
        now in force.

        **Errors:** `ModeRefused` for a name that is no mode, or `bypass` without a proven
        floor (a switch never takes the consent flag's way round the floor).
        """
        mode = warren_mode(name)
        if mode is None or mode not in MODES:
            raise ModeRefused(
                f"no mode {name!r}; the modes are {', '.join(MODES)} "
                f"(Claude Code's spellings: {', '.join(CLAUDE_MODE_NAMES.values())})"
            )
        if mode == "bypass" and not self._floor_proven:
            raise ModeRefused("bypass needs a proven sandbox floor (see `warren doctor`)")
        self._current = mode
        return self._current

    def __repr__(self) -> str:
        return f"PermissionMode({self._current!r})"
