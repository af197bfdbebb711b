"""A headless run (`warren -p`): wire model, tools, permissions, session and output, then loop.

This is the composition root of one run. Start-up work runs concurrently: importing the
Anthropic SDK (about a second) overlaps gathering the context snapshot.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import structlog
import trio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.audit import AuditLog
from orchestrator.context import ContextSnapshot, gather_context, system_prompt
from orchestrator.errors import ConfigError
from orchestrator.events import (
    AssistantTurn,
    Event,
    EventSink,
    RetryScheduled,
    ToolResultsMessage,
)
from orchestrator.logs import configure_logging
from orchestrator.loop import LoopConfig, RunControl, RunResult, run_loop
from orchestrator.messages import Message
from orchestrator.model.base import ModelClient
from orchestrator.output import OutputFormat, OutputPrinter, ProgressPrinter
from orchestrator.paths import WarrenDirs
from orchestrator.permissions import headless_asker
from orchestrator.pipeline import InProcessRunner, ToolPipeline, ToolRunner
from orchestrator.session_policy import SessionPolicy, load_session_policy
from orchestrator.subagents import SubagentEvent, SubagentRunner, SubagentUpdate, load_agent_types
from orchestrator.terminal_asker import TerminalAsker
from orchestrator.tools.base import ToolContext
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from orchestrator.transcripts import SessionStore, Transcript
from policies.files import Mode

if TYPE_CHECKING:
    from sandbox.probe import FloorReport

__all__ = [
    "FloorNotProven",
    "HeadlessOptions",
    "RunReport",
    "RunnerFactory",
    "SubagentsFactory",
    "run_headless",
]

RunnerFactory = Callable[[ToolContext, SessionPolicy], AbstractAsyncContextManager[ToolRunner]]
"""Opens where tool calls run for one session (the CLI passes the sandboxed tool hosts)."""

SubagentsFactory = Callable[
    [ToolContext, SessionPolicy, ModelClient],
    AbstractAsyncContextManager[tuple[SubagentRunner, ModelClient]],
]
"""Opens the worker pool of one session; yields it with the model the session uses from then on
(a broker over the given one, whose limits the subagents share). The CLI passes
`workers.pool.open_session_subagents`."""

SANDBOX_OFF_WARNING = (
    "warning: --sandbox=off: tool calls run directly on this machine, with your full "
    "permissions, network and secrets; only the permission checks stand between the model "
    "and your system."
)


class FloorNotProven(ConfigError):
    """`--sandbox=required` and the start-up probe could not prove the floor."""

    def __init__(self, report: str) -> None:
        super().__init__(
            "the sandbox floor is not proven on this machine, so no tool may run "
            "(--sandbox=required). The probe said:\n"
            + report
            + "\nFix the problem above (`warren doctor` re-checks), or run with --sandbox=off "
            "to run tools unsandboxed.",
            source="sandbox",
        )


DEFAULT_MODEL = "claude-sonnet-4-6"


class HeadlessOptions(BaseModel):
    """Everything one headless run is configured with (the CLI fills it from flags)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str
    """The user's request."""
    cwd: Path
    """The workspace root: absolute, existing directory."""
    model: str = DEFAULT_MODEL
    """A Claude model name, or `scripted:PATH` to replay a script."""
    output_format: OutputFormat = "text"
    """What goes to stdout: the final text, one JSON result, or one JSON event per line."""
    max_turns: int | None = Field(default=None, ge=1)
    """Model requests in this run; default: the policy's `limits.max_turns`, else 100."""
    max_concurrency: int | None = Field(default=None, ge=1, le=64)
    """Concurrency-safe tool calls at once; default: the policy's `limits.max_concurrency`,
    else 10."""
    permission_mode: Mode | None = None
    """Overrides the policy files' `mode`: `default` (read-only calls run, others ask, which
    headless means deny), `accept-edits`, `plan`, `dont-ask`, `bypass`."""
    no_sandbox_consent: bool = False
    """`--i-know-there-is-no-sandbox`: let `bypass` run without a proven floor."""
    asks: Literal["deny", "terminal"] = "deny"
    """Who answers a call the policy asks about: nobody (deny, with a message saying how to
    allow it), or the user at the terminal (`/dev/tty`)."""
    allowed_tools: frozenset[str] = frozenset()
    """Tools allowed without asking."""
    disallowed_tools: frozenset[str] = frozenset()
    """Tools denied outright."""
    resume: str | None = None
    """Session id to continue."""
    continue_last: bool = False
    """Continue the most recent session started in `cwd`."""
    verbose: bool = False
    """Readable logs and progress on stderr."""
    progress: bool = False
    """Human progress lines (tool calls, results) on stderr."""
    sandbox: Literal["required", "off"] = "required"
    """`required`: prove the floor at start-up and run every tool call in a sandboxed tool
    host, refusing to run otherwise; `off`: run tools in this process, loudly."""

    @model_validator(mode="after")
    def _consistent(self) -> HeadlessOptions:
        if self.resume and self.continue_last:
            raise ValueError("--resume and --continue cannot be used together; pick one")
        both = self.allowed_tools & self.disallowed_tools
        if both:
            raise ValueError(
                f"{', '.join(sorted(both))} is in both --allowed-tools and --disallowed-tools"
            )
        if not self.cwd.is_absolute():
            raise ValueError("cwd must be an absolute path")
        return self


@dataclass
class RunReport:
    result: RunResult
    session_id: str
    transcript: Path
    model: str


def _make_model(name: str, cwd: Path) -> ModelClient:
    if name.startswith("scripted:"):
        from orchestrator.model.scripted import ScriptedModel

        path = Path(name.removeprefix("scripted:")).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        return ScriptedModel.from_file(path, variables={"workspace": str(cwd)})
    from orchestrator.model.anthropic import AnthropicModel

    return AnthropicModel(model=name)


async def _warm_up_sdk(name: str) -> None:
    """Import the SDK in a thread while other start-up work runs."""
    if not name.startswith("scripted:"):
        from orchestrator.model.anthropic import warm_up

        await warm_up()


@dataclass
class _Fanout:
    sinks: list[EventSink] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)


def _transcript_sink(transcript: Transcript) -> EventSink:
    def write(event: Event) -> None:
        match event:
            case AssistantTurn(turn=turn):
                transcript.message(turn.message)
            case ToolResultsMessage(message=message):
                transcript.message(message)
            case RetryScheduled():
                transcript.write(
                    {
                        "type": "retry",
                        "attempt": event.attempt,
                        "delay_s": event.delay_s,
                        "error": event.error,
                    }
                )
            case _:
                pass

    return write


async def run_headless(
    options: HeadlessOptions,
    *,
    dirs: WarrenDirs | None = None,
    stdout: IO[str] | None = None,
    extra_sinks: list[EventSink] | None = None,
    tools: Callable[[], ToolRegistry] | None = None,
    model: ModelClient | None = None,
    runner_factory: RunnerFactory | None = None,
    subagents_factory: SubagentsFactory | None = None,
    on_subagent: Callable[[SubagentUpdate], None] | None = None,
    install_signal_handler: bool = True,
) -> RunReport:
    """Run one headless session to its terminal reason.

    **Cancellation:** SIGINT (Ctrl-C) interrupts the run (`interrupted`, resumable transcript);
    a second SIGINT cancels at once.
    `tools` and `model` replace the built-in tool set and the model named in `options`
    (tests and embedders). `runner_factory` opens the sandboxed tool hosts; it is required
    unless `options.sandbox` is `off`.

    **Errors:** `FloorNotProven` when the sandbox is required but unproven; `ConfigError` for
    a bad model script, policy, session or directory. Model and tool failures are terminal
    reasons, never exceptions.
    """
    dirs = dirs or WarrenDirs.from_env()
    out = stdout or sys.stdout
    store = SessionStore(dirs.sessions)
    cwd = options.cwd.resolve()
    if not cwd.is_dir():
        raise ConfigError(f"{cwd} is not a directory", source="--cwd")

    history: list[Message] = []
    if options.resume or options.continue_last:
        session_id = options.resume or store.latest_for(cwd)
        if session_id is None:
            raise ConfigError(f"no earlier session in {cwd} to continue", source="--continue")
        from orchestrator.errors import SessionError

        try:
            loaded = store.load(session_id)
        except SessionError as exc:
            raise ConfigError(str(exc), source="--resume") from exc
        history = list(loaded.messages)
        transcript = store.open(session_id)
        transcript.write({"type": "resume", "skipped_lines": loaded.skipped_lines})
    else:
        transcript = store.create(cwd=cwd, model=options.model)
    log_sink = configure_logging(
        log_file=dirs.logs / f"{transcript.session_id}.log", verbose=options.verbose
    )
    log = structlog.get_logger().bind(session_id=transcript.session_id)
    audit = AuditLog(
        transcript.path.with_suffix(".audit.jsonl"),
        mode=options.permission_mode or "(policy)",
        floor="unproven",
    )
    try:
        snapshot, floor = await _start_up(options, cwd)
        floor_state = _floor_state(options, floor, runner_factory)
        if floor is not None:
            audit.record(
                "floor",
                proven=floor.proven,
                bwrap=floor.bwrap_path,
                bwrap_version=floor.bwrap_version,
                bwrap_source=floor.bwrap_source,
                notes=list(floor.notes),
            )
        audit.floor = floor_state
        policy = load_session_policy(
            cwd,
            floor_proven=floor_state == "proven",
            permission_mode=options.permission_mode,
            allowed_tools=options.allowed_tools,
            disallowed_tools=options.disallowed_tools,
            no_sandbox_consent=options.no_sandbox_consent,
        )
        audit.mode = policy.mode
        model = model or _make_model(options.model, cwd)
        registry = (
            tools()
            if tools is not None
            else builtin_tools(bash_classifier=policy.bash_classifier())
        )
        printer = OutputPrinter(options.output_format, transcript.session_id, out)
        sinks = _Fanout([_transcript_sink(transcript), audit, printer, *(extra_sinks or [])])
        if options.progress or options.verbose:
            sinks.sinks.append(ProgressPrinter(sys.stderr))
        ctx = ToolContext(
            workspace=cwd,
            cwd=cwd,
            session_id=transcript.session_id,
            extra_roots=policy.writable_roots(),
            read_deny=policy.read_deny_rules(),
        )
        opened: AbstractAsyncContextManager[ToolRunner] = (
            runner_factory(ctx, policy)
            if runner_factory is not None and options.sandbox == "required"
            else _in_process(ctx)
        )
        subagents: AbstractAsyncContextManager[tuple[SubagentRunner | None, ModelClient]] = (
            subagents_factory(ctx, policy, model)
            if subagents_factory is not None
            and options.sandbox == "required"
            and policy.limit("max_subagents") != 0
            else _no_subagents(model)
        )
        permission = policy.permission_fn()
        asker = TerminalAsker(policy) if options.asks == "terminal" else headless_asker
        prompt = Message.user_text(options.prompt)
        transcript.message(prompt)
        control = RunControl()
        log.info("run started", model=model.model, cwd=str(cwd), resumed=bool(history))
        try:
            async with (
                opened as runner,
                subagents as (pool, model),
                trio.open_nursery() as nursery,
            ):
                if pool is not None:
                    from orchestrator.tools.dispatch_agent import DispatchAgentTool

                    dispatch = DispatchAgentTool(
                        runner=pool,
                        agent_types=load_agent_types(
                            cwd,
                            trusted=policy.effective.trust == "trusted",
                            config_dir=dirs.config,
                            known_tools=registry.names(),
                        ),
                        tools=registry,
                        permission=permission,
                        asker=asker,
                        assessor=policy.assessor(),
                        sidechain_root=dirs.sessions,
                        on_update=_subagent_sink(printer, audit, on_subagent),
                    )
                    registry = ToolRegistry([*registry, dispatch])
                printer.init(
                    cwd=str(cwd),
                    model=model.model,
                    tools=registry.names(),
                    transcript=str(transcript.path),
                    permission_mode=policy.mode,
                    sandbox=floor_state,
                )
                pipeline = ToolPipeline(
                    runner=runner,
                    tools=registry,
                    ctx=ctx,
                    permission=permission,
                    asker=asker,
                    assessor=policy.assessor(),
                    emit=sinks,
                    default_timeout_s=float(policy.limit("tool_timeout_s") or 300.0),
                )
                if install_signal_handler:
                    nursery.start_soon(_interrupt_on_sigint, control)
                result = await run_loop(
                    model=model,
                    messages=[*history, prompt],
                    pipeline=pipeline,
                    config=LoopConfig(
                        system=system_prompt(snapshot),
                        max_turns=options.max_turns or _policy_int(policy, "max_turns", 100),
                        max_concurrency=options.max_concurrency
                        or _policy_int(policy, "max_concurrency", 10),
                    ),
                    emit=sinks,
                    control=control,
                )
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                await ctx.aclose()
                await model.aclose()
        printer.finish(result)
        transcript.write(
            {
                "type": "result",
                "reason": result.reason,
                "num_turns": result.num_turns,
                "usage": result.usage.model_dump(),
                "total_cost_usd": result.cost_usd,
            }
        )
        log.info("run finished", reason=result.reason, turns=result.num_turns)
        return RunReport(result, transcript.session_id, transcript.path, model.model)
    finally:
        transcript.close()
        audit.close()
        log_sink.close()


async def _start_up(
    options: HeadlessOptions, cwd: Path
) -> tuple[ContextSnapshot, FloorReport | None]:
    """Everything a run needs before its first request, at once: the SDK import (about a
    second), the context snapshot, and the floor probe (unless the sandbox is off)."""
    snapshot: ContextSnapshot | None = None
    floor: FloorReport | None = None

    async def context() -> None:
        nonlocal snapshot
        snapshot = await gather_context(cwd)

    async def probe() -> None:
        nonlocal floor
        from sandbox.probe import probe_floor

        floor = await probe_floor()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_warm_up_sdk, options.model)
        nursery.start_soon(context)
        if options.sandbox == "required":
            nursery.start_soon(probe)
    assert snapshot is not None
    return snapshot, floor


def _floor_state(
    options: HeadlessOptions, floor: FloorReport | None, runner_factory: RunnerFactory | None
) -> Literal["proven", "off"]:
    """`off` (said loudly), or `proven`; an unproven floor under `required` stops the run."""
    if options.sandbox == "off":
        sys.stderr.write(SANDBOX_OFF_WARNING + "\n")
        return "off"
    assert floor is not None
    if not floor.proven:
        raise FloorNotProven(floor.render())
    if runner_factory is None:
        raise ConfigError("no sandboxed tool runner was wired in", source="sandbox")
    return "proven"


def _policy_int(policy: SessionPolicy, name: str, default: int) -> int:
    value = policy.limit(name)
    return int(value) if value is not None else default


@asynccontextmanager
async def _no_subagents(
    model: ModelClient,
) -> AsyncIterator[tuple[SubagentRunner | None, ModelClient]]:
    yield None, model


def _subagent_sink(
    printer: OutputPrinter,
    audit: AuditLog,
    extra: Callable[[SubagentUpdate], None] | None,
) -> Callable[[SubagentUpdate], None]:
    """Subagents' events: tagged lines in stream-json, their permission decisions in the
    session's audit log, and whatever the embedder wants (`on_subagent`)."""

    def report(update: SubagentUpdate) -> None:
        printer.subagent(update)
        if isinstance(update, SubagentEvent):
            audit(update.event)
        if extra is not None:
            extra(update)

    return report


@asynccontextmanager
async def _in_process(ctx: ToolContext) -> AsyncIterator[ToolRunner]:
    yield InProcessRunner()


async def _interrupt_on_sigint(control: RunControl) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            if control.interrupted:
                raise KeyboardInterrupt
            control.interrupt()
