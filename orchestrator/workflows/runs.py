"""The workflow runs of one session: starting one (in the background, as a task, or in the
foreground for `warren workflow run`), resuming one from its journal, and what `/workflows`
lists.

A run's life: its META is read (`read_meta`, nothing runs), its directory made with its
script (`WorkflowStore.create`), then the script runs in its own sandbox
(orchestrator/workflows/script.py) with a `WorkflowEngine` answering its `agent()` calls, and
its record is saved with the result. In the background the run is a task of the session's
`TaskRegistry` (kind `workflow`): its id goes back at once, and its one notification carries
the result as JSON. A resumed run is a new run (its own id and journal) whose engine answers
from the earlier run's journal; writers the earlier run left unfinished are rolled back first
(orchestrator/workflows/rollback.py).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog
import trio

from orchestrator.events import WorkflowChanged
from orchestrator.tasks.registry import Task, TaskEnd, TaskError, TaskRegistry
from orchestrator.workflows.engine import AgentRunner, ScopeGate, WorkflowEngine, result_json
from orchestrator.workflows.journal import RunRecord, WorkflowStore, WriterStart, new_run_id
from orchestrator.workflows.meta import WorkflowError, WorkflowMeta, read_meta
from orchestrator.workflows.rollback import roll_back
from orchestrator.workflows.script import ScriptSandbox, run_script

__all__ = ["LiveRun", "RunStart", "WorkflowRuns", "saved_workflow"]


@dataclass(frozen=True)
class RunStart:
    """What a run is asked to be: its script and arguments, and where it comes from."""

    source: str
    args: Any = None
    saved: str | None = None
    """The saved workflow's name, when it is one (`/workflow NAME`, `Workflow(name=...)`)."""
    resume: str | None = None
    """The run whose journal answers the calls that match."""


@dataclass
class LiveRun:
    """A run of this session, while and after it runs."""

    record: RunRecord
    engine: WorkflowEngine
    task: Task | None = None
    script_path: Path | None = None


def saved_workflow(name: str, dirs: list[Path]) -> Path | None:
    """The first `NAME.py` of the saved-workflow directories (the trusted repository's
    `.warren/workflows/`, the user's `~/.config/warren/workflows/`), not following a link."""
    if not name.replace("-", "_").isidentifier():
        return None
    for directory in dirs:
        path = directory / f"{name}.py"
        if path.is_file() and not path.is_symlink():
            return path
    return None


class WorkflowRuns:
    """A session's workflow runs (see the module docstring)."""

    def __init__(
        self,
        *,
        store: WorkflowStore,
        workspace: Path,
        session_id: str,
        runner: Callable[[str], AgentRunner],
        sandbox: Callable[[], Awaitable[ScriptSandbox]],
        emit: Callable[[WorkflowChanged], None],
        tasks: TaskRegistry | None,
        saved_dirs: list[Path],
        cap: int,
        max_agents: int,
        keeper: Callable[[str, tuple[Path, ...]], WriterStart] | None,
        objects: Path,
    ) -> None:
        """`runner(name)`: the agents of a run of workflow `name` (`PipelineAgents`).
        `sandbox`: where scripts run (made when a run starts: the read deny rules' masks as the
        workspace is then). `saved_dirs`: where saved workflows are, in order.
        `cap`: agents at once; `max_agents`: per run. `keeper`: keeps a scoped writer's scope
        before it runs (`rollback.keep_scope`), in the content store at `objects`, from which
        a resume rolls back the writers a stopped run left unfinished."""
        self.store = store
        self.workspace = workspace
        self.session_id = session_id
        self._runner = runner
        self._sandbox = sandbox
        self._emit = emit
        self._tasks = tasks
        self.saved_dirs = saved_dirs
        self._cap = cap
        self._max_agents = max_agents
        self._keeper = keeper
        self._objects = objects
        self.live: dict[str, LiveRun] = {}
        self._gate = ScopeGate()
        """One for the session: two runs' writers are held to disjoint scopes too."""

    # -- where scripts come from --

    def saved(self, name: str) -> str:
        """The text of saved workflow `name`.

        **Errors:** `WorkflowError` naming where it was looked for."""
        path = saved_workflow(name, self.saved_dirs)
        if path is None:
            where = ", ".join(str(d) for d in self.saved_dirs) or "nowhere (no directory)"
            raise WorkflowError(f"there is no saved workflow {name!r} (looked in {where})")
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkflowError(f"the saved workflow {name!r} cannot be read: {exc}") from None

    def saved_names(self) -> list[str]:
        names: set[str] = set()
        for directory in self.saved_dirs:
            try:
                names.update(p.stem for p in directory.glob("*.py") if p.is_file())
            except OSError:
                continue
        return sorted(names)

    def find(self, run_id: str) -> RunRecord:
        """A run of this workspace, as it is now (this session's live one, else its record).

        **Errors:** `WorkflowError` for an unknown run, or one of another workspace."""
        live = self.live.get(run_id)
        if live is not None:
            return live.record
        try:
            record = self.store.load(run_id)
        except (OSError, ValueError) as exc:
            raise WorkflowError(f"there is no workflow run {run_id!r} here ({exc})") from None
        if Path(record.workspace) != self.workspace:
            raise WorkflowError(
                f"workflow run {run_id} belongs to {record.workspace}, not this workspace"
            )
        return record

    def earlier(self, run_id: str) -> RunRecord:
        """A run of this workspace to resume.

        **Errors:** `WorkflowError` as `find`, or for a run still running (here, or in a
        live process)."""
        record = self.find(run_id)
        live = self.live.get(run_id)
        running_here = live is not None and live.task is not None and live.task.running
        if running_here or (
            record.status == "running" and _alive(record.pid, record.pid_started)
        ):
            raise WorkflowError(
                f"workflow run {run_id} is still running; stop it first (TaskStop or /tasks)"
            )
        return record

    # -- running --

    def prepare(self, start: RunStart) -> tuple[LiveRun, WorkflowMeta]:
        """A new run's record, directory and engine (nothing runs yet).

        **Errors:** `WorkflowError` for a script whose META is missing or wrong."""
        meta = read_meta(start.source)
        earlier = None if start.resume is None else self.earlier(start.resume)
        record = RunRecord(
            run_id=new_run_id(),
            name=start.saved or meta.name,
            description=meta.description,
            phases=list(meta.phases),
            workspace=str(self.workspace),
            session_id=self.session_id,
            args=start.args,
            resumed_from=None if earlier is None else earlier.run_id,
            pid_started=psutil.Process().create_time(),
        )
        script_path = self.store.create(record, start.source)
        kwargs: dict[str, Any] = dict(
            record=record,
            store=self.store,
            runner=self._runner(record.name),
            emit=self._emit,
            cap=self._cap,
            max_agents=self._max_agents,
            keeper=self._keeper,
            gate=self._gate,
        )
        engine = (
            WorkflowEngine(**kwargs)
            if earlier is None
            else WorkflowEngine.resuming(self.store.entries(earlier.run_id), **kwargs)
        )
        live = LiveRun(record, engine, script_path=script_path)
        self.live[record.run_id] = live
        return live, meta

    async def run(self, live: LiveRun, source: str) -> RunRecord:
        """Run a prepared run to its end (its record saved with the result).

        **Cancellation:** the script's sandbox and the agents in flight are stopped; the
        record says `stopped` (resume it later)."""
        record = live.record
        try:
            if record.resumed_from is not None:
                await trio.to_thread.run_sync(self._roll_back, record.resumed_from)
            sandbox = await self._sandbox()
            end = await run_script(source, record.args, live.engine, sandbox, run_id=record.run_id)
        except BaseException:
            record.status = "stopped"
            self._save(record)
            raise
        record.status = "completed" if end.status == "finished" else "failed"
        record.result, record.error = end.result, end.error
        self._save(record)
        return record

    def _roll_back(self, earlier: str) -> None:
        for writer in self.store.unfinished_writers(earlier):
            roll_back(self.workspace, writer, self._objects)
            self.store.writer_ended(earlier, writer.key)

    def _save(self, record: RunRecord) -> None:
        import time

        record.ended = time.time()
        try:
            self.store.save(record)
        except OSError as exc:
            structlog.get_logger().warning(
                "workflow record not saved", run_id=record.run_id, error=str(exc)
            )

    def start(self, start: RunStart, *, tool_use_id: str | None = None) -> LiveRun:
        """A run started as a background task of the session; its `LiveRun` at once.

        **Errors:** `WorkflowError` (its META, an unknown run to resume); `TaskError` when no
        task may start."""
        if self._tasks is None:
            raise TaskError("background tasks are not available in this session")
        live, meta = self.prepare(start)

        async def body(task: Task) -> TaskEnd:
            record = await self.run(live, start.source)
            return _task_end(record, live.engine)

        try:
            live.task = self._tasks.start(
                "workflow",
                f"{meta.name}: {meta.description}"[:120],
                body,
                id=live.record.run_id,
                tool_use_id=tool_use_id,
            )
        except TaskError:
            self.live.pop(live.record.run_id, None)
            raise
        live.engine.task_id = live.task.id
        return live

    def runs(self) -> list[RunRecord]:
        """This workspace's runs, newest first (a live one as it is now)."""
        found = [r for r in self.store.runs() if Path(r.workspace) == self.workspace]
        return [self.live[r.run_id].record if r.run_id in self.live else r for r in found]


def _task_end(record: RunRecord, engine: WorkflowEngine) -> TaskEnd:
    counts = engine.counts()
    done = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no agents"
    if record.status == "completed":
        return TaskEnd(
            "completed",
            f'Workflow "{record.name}" ({record.run_id}) completed: {done}',
            result_json(record.result),
        )
    return TaskEnd(
        "failed",
        f'Workflow "{record.name}" ({record.run_id}) failed: {done}',
        record.error or "the script failed",
    )


def _alive(pid: int, started: float) -> bool:
    """Whether process `pid`, started at `started`, still runs (not a later one given the
    same pid: pids are reused)."""
    if pid == os.getpid():
        return False  # this process: the run is one of ours or ended with a crash of it
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
