"""The `Workflow` tool: the model starts a workflow script that orchestrates many subagents,
in the background, and gets one notification with its result.

Claude Code's `WorkflowInput` (`script`, `name`, `args`, `scriptPath`, `resumeFromRunId`;
`description` and `title` accepted and ignored), with Python scripts instead of JavaScript
(orchestrator/workflows/meta.py says how a JavaScript one is refused). A script the model wrote
is not read-only: it asks in `default` mode (the ask shows its META: name, description,
phases) and is denied headless unless a rule allows it (`Workflow`); a saved workflow (`name`:
the trusted repository's `.warren/workflows/`, the user's `~/.config/warren/workflows/`) runs
unasked, as does one a `Workflow(NAME)` rule allows. Every agent the script starts is decided
on its own, like any `dispatch_agent` call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from orchestrator.errors import ToolError
from orchestrator.tasks.registry import TaskError
from orchestrator.tools.base import Tool, ToolContext, ToolInput, ToolOutput, ToolProgress
from orchestrator.workflows.meta import WorkflowError, read_meta
from policies.claude_names import WORKFLOW_TOOL
from policies.facts import ToolFacts

if TYPE_CHECKING:
    from orchestrator.workflows.runs import WorkflowRuns

__all__ = ["WorkflowInput", "WorkflowTool"]

DESCRIPTION = """\
Runs a workflow: a short Python script that orchestrates many subagents deterministically, in \
the background. Use it ONLY when the user asked for a workflow, or to run a saved workflow the \
user named; otherwise use dispatch_agent. It returns a run id at once; the workflow's result \
(JSON) arrives as one <task-notification> when it ends. Do not poll.

The script is plain, synchronous Python. Its first statement is a literal \
META = {"name": "...", "description": "...", "phases": ["...", ...]}. It may use:
- agent(prompt, *, type=None, schema=None, write_paths=None, label=None, phase=None, \
model=None): runs one subagent (type: an agent type of dispatch_agent; default general) and \
returns its final text, or with a JSON schema (an object schema) its validated object. A failed \
agent raises AgentFailed (it has .reason). Writers need write_paths; writers with disjoint \
write_paths run at once.
- parallel(thunks): runs zero-argument callables (lambda: agent(...)) concurrently; results in \
input order, a failed one as a falsy AgentFailed value.
- pipeline(items, *stages): each item through stage1(item), stage2(result), ... as soon as \
its previous stage is done; each item's last result (failures as AgentFailed values).
- phase(title), log(text), args (the invocation's args), finish(value) (the JSON result; \
ends the script).
The script runs in a sandbox with no files to write, no network and no tools: its only power \
is this API. Example:
META = {"name": "review", "description": "Review each package", "phases": ["Review"]}
phase("Review")
FINDINGS = {"type": "object", "properties": {"issues": {"type": "array", "items": \
{"type": "string"}}}, "required": ["issues"]}
found = parallel([lambda p=p: agent(f"Review {p}", schema=FINDINGS) for p in args["packages"]])
finish({p: f["issues"] for p, f in zip(args["packages"], found) if f})

resumeFromRunId: the run id of an earlier run of this workspace to resume: its finished agent \
calls are answered from its journal (keyed by position and by prompt and options) up to the \
first call that was edited; the rest run again."""


class WorkflowInput(ToolInput):
    script: str | None = Field(
        default=None,
        description="The workflow script (Python; its first statement a literal META dict).",
    )
    name: str | None = Field(default=None, description="The name of a saved workflow to run.")
    args: Any = Field(
        default=None,
        description="The script's `args`, verbatim (pass lists and objects as JSON values).",
    )
    scriptPath: str | None = Field(
        default=None,
        description="The script of an earlier run (the scriptPath its result gave): run it again.",
    )
    resumeFromRunId: str | None = Field(
        default=None, description="An earlier run's id: resume it from its journal."
    )
    description: str | None = Field(default=None, description="Ignored: use META.")
    title: str | None = Field(default=None, description="Ignored: use META.")

    @model_validator(mode="after")
    def _source(self) -> WorkflowInput:
        if not (self.script or self.name or self.scriptPath or self.resumeFromRunId):
            raise ValueError(
                "give script (a workflow script), name (a saved workflow) or resumeFromRunId"
            )
        return self


class WorkflowTool(Tool[WorkflowInput]):
    name: ClassVar[str] = WORKFLOW_TOOL
    facts: ClassVar[ToolFacts] = ToolFacts(family="agent", runs_in_coordinator=True)
    input_model: ClassVar[type[ToolInput]] = WorkflowInput
    description: ClassVar[str] = DESCRIPTION

    def __init__(self, runs: Callable[[], WorkflowRuns]) -> None:
        """`runs`: the session's runs, made when first asked for (not at start-up)."""
        self._make_runs = runs

    @property
    def _runs(self) -> WorkflowRuns:
        return self._make_runs()

    def is_read_only(self, input: WorkflowInput) -> bool:
        """A saved workflow is the user's (or the trusted repository's): it runs unasked; a
        script the model wrote asks (its agents are decided one by one either way)."""
        return _saved_only(input)

    def is_concurrency_safe(self, input: WorkflowInput) -> bool:
        return True  # it only starts a task

    def timeout_s(self, input: WorkflowInput) -> float | None:
        return 60.0

    def _source(self, input: WorkflowInput) -> tuple[str, str | None]:
        """The script to run and the saved workflow's name.

        **Errors:** `WorkflowError` for a script that cannot be found or read."""
        if input.scriptPath:
            return self._script_at(input.scriptPath), None
        if input.script:
            return input.script, None
        if input.name:
            return self._runs.saved(input.name), input.name
        assert input.resumeFromRunId is not None
        record = self._runs.earlier(input.resumeFromRunId)
        return self._runs.store.script(record.run_id), None

    def _script_at(self, raw: str) -> str:
        """Only a script Warren kept for an earlier run (its `scriptPath`): the coordinator
        reads no other file for the model."""
        path = Path(raw)
        root = self._runs.store.root
        if path.name != "script.py" or path.parent.parent != root or path.is_symlink():
            raise WorkflowError(
                f"scriptPath must be the scriptPath an earlier run's result gave (under {root})"
            )
        try:
            self._runs.store.run_dir(path.parent.name)
            return path.read_text()
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise WorkflowError(f"the script at {raw} cannot be read: {exc}") from None

    async def validate(self, input: WorkflowInput, ctx: ToolContext) -> str | None:
        try:
            source, _ = self._source(input)
            read_meta(source)
        except WorkflowError as exc:
            return str(exc)
        return None

    async def call(
        self, input: WorkflowInput, ctx: ToolContext
    ) -> AsyncIterator[ToolProgress | ToolOutput]:
        from orchestrator.tools.base import CURRENT_TOOL_USE_ID
        from orchestrator.workflows.runs import RunStart

        try:
            source, saved = self._source(input)
            live = self._runs.start(
                RunStart(source, input.args, saved=saved, resume=input.resumeFromRunId),
                tool_use_id=CURRENT_TOOL_USE_ID.get(),
            )
        except (WorkflowError, TaskError) as exc:
            raise ToolError(str(exc)) from None
        record = live.record
        lines = [
            f'Workflow "{record.name}" started in the background as run {record.run_id} '
            f"(task {record.run_id}).",
            f"scriptPath: {live.script_path}",
            "Its result arrives as a <task-notification> when it ends; do not wait or poll. "
            "Until then, do not change files in the directories its writers write (their "
            "write_paths). TaskStop stops it; resumeFromRunId resumes it later.",
        ]
        if record.resumed_from:
            lines.insert(1, f"Resuming run {record.resumed_from}: its finished agents are reused.")
        yield ToolOutput("\n".join(lines), summary=f"workflow {record.run_id} started")

    def render_use(self, input: WorkflowInput) -> str:
        """What the ask shows: the script's META (name, description, phases)."""
        try:
            meta = read_meta(self._source(input)[0])
        except WorkflowError as exc:
            return f"Workflow({input.name or 'script'}: {exc})"
        phases = " -> ".join(meta.phases) if meta.phases else "no phases"
        saved = f"saved workflow {input.name}, " if input.name else ""
        return f"Workflow({saved}{meta.name}: {meta.description} [phases: {phases}])"


def _saved_only(input: WorkflowInput) -> bool:
    return bool(input.name) and not (input.script or input.scriptPath or input.resumeFromRunId)
