"""The audit log: one JSON line per permission decision, per hook run and per schedule of a
call that involves a write scope (and, later, per sandboxed execution).

Each permission line carries the call's plan (`orchestrator.calls.plan.CallPlan`): its read-only
verdict and reason and the sandbox it runs in, as the pipeline decided them, never re-derived.

It sits next to the session's transcript (`<session>.audit.jsonl`) and is flushed per line, so
a killed run still shows who allowed what, by which rule.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from orchestrator.events import (
    CallScheduled,
    Event,
    HookRan,
    PermissionDecided,
    TaskChanged,
    WorkflowChanged,
)
from policies.mode import PermissionMode

__all__ = ["AuditLog"]


class AuditLog:
    """Opened once the floor is known and the policy loaded; each permission line says the
    mode in force when it was decided (`mode` is the session's live value)."""

    def __init__(self, path: Path, *, mode: PermissionMode, floor: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.mode = mode
        """The session's permission mode, live (policies/mode.py)."""
        self.floor = floor
        """`proven`, `unproven` or `off`."""
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def record(self, kind: str, **fields: Any) -> None:
        line = {"ts": round(time.time(), 3), "kind": kind, **fields}
        self._file.write(json.dumps(line, default=str, separators=(",", ":")) + "\n")
        self._file.flush()

    def __call__(self, event: Event) -> None:
        if isinstance(event, PermissionDecided):
            digest = hashlib.sha256(
                json.dumps(event.input, sort_keys=True, default=str).encode()
            ).hexdigest()[:16]
            self.record(
                "permission",
                tool_use_id=event.tool_use_id,
                tool=event.tool,
                input_digest=digest,
                decision=event.decision,
                rule=event.rule,
                answered_by=event.answered_by,
                mode=self.mode.current,
                floor=self.floor,
                message=event.message,
                read_only=event.read_only,
                read_only_reason=event.read_only_reason,
                sandbox=event.sandbox,
            )
        elif isinstance(event, CallScheduled):
            self.record("schedule", **asdict(event))  # the event is the line, field for field
        elif isinstance(event, HookRan):
            self.record(
                "hook",
                hook_event=event.hook_event,
                command=event.command,
                source=event.source,
                tool_use_id=event.tool_use_id,
                agent_id=event.agent_id,
                exit_code=event.exit_code,
                duration_ms=round(event.duration_s * 1000),
                blocked=event.blocked,
                decision=event.decision,
                error=event.error,
            )
        elif isinstance(event, TaskChanged) and event.phase != "progress":
            self.record(
                "task",
                phase=event.phase,
                task_id=event.task_id,
                task_kind=event.kind,
                description=event.description,
                status=event.status,
                tool_use_id=event.tool_use_id,
                summary=event.summary,
                output_file=event.output_file,
                duration_ms=round(event.duration_s * 1000),
                output_bytes=event.output_bytes,
            )
        elif isinstance(event, WorkflowChanged) and event.status != "waiting":
            self.record("workflow", **asdict(event))  # the event is the line, field for field

    def close(self) -> None:
        self._file.close()
