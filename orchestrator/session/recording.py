"""The session's change sets (orchestrator/changes/): the recorder of every writing turn,
opened with the content store held for the session, and whether the session can write at all
(a session that cannot does not pay for the first whole scan).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from orchestrator.calls.policy import SessionPolicy
from orchestrator.changes import store_gc
from orchestrator.changes.content_store import ContentStore
from orchestrator.changes.recorder import ChangeRecorder, change_log_path
from orchestrator.paths import WarrenDirs
from orchestrator.records.transcripts import Transcript
from orchestrator.session.state import IoGuard
from orchestrator.tools.registry import ToolRegistry

__all__ = ["may_write", "open_change_recorder"]


async def open_change_recorder(
    stack: AsyncExitStack,
    cwd: Path,
    policy: SessionPolicy,
    dirs: WarrenDirs,
    transcript: Transcript,
    io_guard: IoGuard,
) -> ChangeRecorder:
    """The recorder of the session's writing turns, running until `stack` closes: then the
    turn cut short by the session's end is recorded, the recorder closed, the store's hold let
    go and a collection of the store run when one is due (in that order)."""
    stack.callback(store_gc.collect_when_due, dirs.state, dirs.objects, dirs.sessions)
    stack.enter_context(store_gc.hold(dirs.objects))
    changes = ChangeRecorder(
        (cwd, *policy.writable_roots()),
        ContentStore(dirs.objects),
        change_log_path(transcript.path),
        write=lambda step: io_guard.write(step, "change log"),
        index_dir=dirs.state / "scans",
        skip=(dirs.state, dirs.config),
    )
    stack.callback(changes.close)
    stack.callback(changes.end_turn)  # a turn cut short by the session's end
    # After-scans and records off the calls' path; what is queued is done before the two
    # callbacks above run.
    await stack.enter_async_context(changes.running())
    return changes


def may_write(mode: str, registry: ToolRegistry, mcp: bool, roots: Sequence[Path]) -> bool:
    """Whether a call of this session can change the writable roots at all: not in plan mode
    (until the user leaves it: the first writing call then scans, and waits), not with only
    reading tools, not on read-only file systems. The first scan costs a whole tree's read:
    a session that cannot write does not pay it."""
    if mode == "plan":
        return False
    if not mcp and all(tool.facts.family in ("read", "meta") for tool in registry):
        return False
    return any(not _read_only_fs(root) for root in roots)


def _read_only_fs(root: Path) -> bool:
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return True  # a root that is not there: nothing in it to record
