"""Running the hooks of one event: each under the floor, all at once, merged in one answer.

`HookRunner` is the session's (built by `orchestrator.session.hooks_hook_runner` from the
effective policy, so an untrusted repository's hooks are not even in it). The pipeline, the
loop, the compactor, the session and the terminal asker call its per-event methods; with no
hook for an event each returns `NO_OUTCOME` after one set lookup (tests/bench/bench_hooks.py
measures that path).

Where a hook runs: in a warm tool host of the session's (`WarmHookHost`, a `RunHook` request
to `workers.toolhost`) kept for hooks alone, the read-write one, or the read-only one in `plan`
mode. Not the tool calls' hosts: there a process the model left running could kill a hook or
write into its output, and a hook that errs does not block. The host already
sits in the floor hooks need: the workspace and the policy's writable roots mounted as tools
have them, no network, the home hidden and secrets masked (read deny rules included), a
scrubbed environment, to which `CLAUDE_PROJECT_DIR` and `WARREN_PROJECT_DIR` are added. The
hook is a contained child of the host (`orchestrator.hooks.process`): its `timeout_s` is the
wall-clock limit, its output is capped (`HOOK_OUTPUT_BYTES`; more is a flood), and either
kills everything it started; nothing it starts outlives it. This costs a few milliseconds a
hook instead of a one-shot sandbox's ~40 (tests/bench/bench_hooks.py). Without a warm host
(`warren hooks test`), each hook gets that one-shot sandbox (`sandbox.run.run_sandboxed`)
with the same mounts. A user or managed hook with `sandbox = false`, or any hook when the
user turned the sandbox off, runs as a plain process group with the same timeout and cap.
A hook an SDK host registered (`ConfiguredHook.callback`, orchestrator/claude_code/sdk_control.py)
is not a process: the event goes to the host as a `hook_callback` request and its JSON answer is
read as a command hook's stdout, within the same timeout.

Merging (deterministic, whatever order the hooks finish in): a block from any hook blocks;
permission decisions rank deny > ask > allow; two hooks rewriting the input differently is a
deny naming both; context, reasons and errors keep the policy's hook order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import trio

from orchestrator.calls.plan import CallPlan
from orchestrator.changes.writers import Writer, WriteRecorder
from orchestrator.events import EventSink, HookRan
from orchestrator.hooks.events import (
    HookInput,
    NotificationInput,
    PostToolUseInput,
    PreCompactInput,
    PreToolUseInput,
    SessionEndInput,
    SessionSource,
    SessionStartInput,
    StopInput,
    UserPromptSubmitInput,
)
from orchestrator.hooks.output import (
    HookOutput,
    PermissionVerdict,
    parse_json_output,
    parse_output,
)
from orchestrator.hooks.process import HookCommand, HookProcess, run_hook_command
from policies.claude_names import claude_mode
from policies.files import Hook, HookEvent
from policies.mode import PermissionMode

if TYPE_CHECKING:  # the sandbox is imported when a hook first runs sandboxed
    from orchestrator.hooks.matchers import HookMatcher
    from sandbox.host import SandboxHost
    from sandbox.spec import SandboxSpec

__all__ = [
    "HOOK_OUTPUT_BYTES",
    "NO_OUTCOME",
    "ConfiguredHook",
    "HookCallback",
    "HookOutcome",
    "HookRun",
    "HookRunner",
    "HookSandbox",
    "WarmHookHost",
]

HOOK_OUTPUT_BYTES = 1024 * 1024
"""stdout plus stderr a hook may print; more kills it (a non-blocking error)."""
_SHOWN = 2_000
"""Characters of a hook's stdout/stderr carried in its event (stream-json, audit)."""


class HookCallback(Protocol):
    """A hook that an SDK host runs in its own process (`hook_callback`): given the event's
    input and the call's tool_use_id, it answers with the JSON a command hook would print.

    **Errors:** any `Exception` when the host could not answer: a non-blocking hook error.
    """

    async def __call__(self, input: dict[str, Any], tool_use_id: str | None) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ConfiguredHook:
    """A hook in force: the policy's entry, its file, and its matcher compiled."""

    hook: Hook
    source: str
    matcher: HookMatcher
    callback: HookCallback | None = None
    """Set for a hook an SDK host runs (`hook.command` then only names it)."""

    @property
    def label(self) -> str:
        """How messages name it: `[command]`."""
        return f"[{self.hook.command}]"


@dataclass(frozen=True, slots=True)
class HookRun:
    """One hook's run and what it said."""

    hook: ConfiguredHook
    exit_code: int | None
    """None when it never finished (timeout, flood, could not start)."""
    stdout: str
    stderr: str
    duration_s: float
    output: HookOutput


@dataclass(frozen=True, slots=True)
class HookOutcome:
    """The merged answer of every hook of one event."""

    runs: tuple[HookRun, ...] = ()
    blocked: bool = False
    """Exit 2 or `decision: block` from any hook."""
    reasons: tuple[str, ...] = ()
    """Block reasons, one per blocking hook, in policy order."""
    permission: PermissionVerdict | None = None
    """PreToolUse: deny > ask > allow over every hook (a block counts as deny)."""
    permission_reason: str | None = None
    updated_input: dict[str, Any] | None = None
    context: tuple[str, ...] = ()
    """`additionalContext` (or plain stdout where the event takes it), in policy order."""
    stop: bool = False
    """A hook said `continue: false`: the run ends `hook_blocked`."""
    stop_reason: str | None = None
    deciders: tuple[str, ...] = ()
    """Labels of the hooks that blocked or decided (for the audit log's rule)."""

    @property
    def reason_text(self) -> str:
        return "\n".join(self.reasons)


NO_OUTCOME = HookOutcome()
_RANK: dict[PermissionVerdict, int] = {"allow": 0, "ask": 1, "deny": 2}


def merge(runs: Sequence[HookRun]) -> HookOutcome:
    """Merge in the given (policy) order; see the module docstring."""
    reasons: list[str] = []
    context: list[str] = []
    permission: PermissionVerdict | None = None
    permission_reason: str | None = None
    rewrites: list[tuple[HookRun, dict[str, Any]]] = []
    stop_reasons: list[str] = []
    stop = False
    for run in runs:
        out = run.output
        if out.error is not None:
            continue
        if out.blocked:
            reasons.append(f"{run.hook.label}: {out.reason}" if out.reason else run.hook.label)
        verdict = "deny" if out.blocked else out.permission
        if verdict is not None and (permission is None or _RANK[verdict] > _RANK[permission]):
            permission, permission_reason = verdict, out.reason
        if out.updated_input is not None:
            rewrites.append((run, out.updated_input))
        if out.context:
            context.append(out.context)
        if out.stop:
            stop = True
            if out.stop_reason:
                stop_reasons.append(out.stop_reason)
    updated: dict[str, Any] | None = None
    if rewrites:
        first_run, updated = rewrites[0]
        for other_run, other in rewrites[1:]:
            if other != updated:
                permission = "deny"
                permission_reason = (
                    f"Two hooks rewrote this call's input differently: {first_run.hook.label} "
                    f"and {other_run.hook.label}; the call was not run."
                )
                updated = None
                break
    return HookOutcome(
        runs=tuple(runs),
        blocked=bool(reasons),
        reasons=tuple(reasons),
        permission=permission,
        permission_reason=permission_reason,
        updated_input=updated if permission != "deny" else None,
        context=tuple(context),
        stop=stop,
        stop_reason="; ".join(stop_reasons) or None,
        deciders=tuple(
            run.hook.label
            for run in runs
            if run.output.error is None and (run.output.permission or run.output.blocked)
        ),
    )


@runtime_checkable
class WarmHookHost(Protocol):
    """A sandbox that is already running and runs hook commands on request: the session's
    tool hosts (`workers.toolhost_runner.SandboxedToolRunner`)."""

    async def run_hook(self, hook: HookCommand, *, writable: bool) -> HookProcess:
        """Run `/bin/sh -c hook.command` in the read-write sandbox (`writable`) or the
        read-only one, with its `env` added to the sandbox's environment; killed with
        everything it started at its `timeout_s` or past its `output_bytes` of output."""
        ...


@dataclass
class HookSandbox:
    """The floor hooks run under: the session's sandbox spec (masks, protected paths, home
    allowances), the host, and the policy's read deny rules (the workspace files they cover
    are masked, found once on first use). With `warm` set (a session's tool hosts), hooks run
    there and the rest only describes the floor those hosts were started with."""

    spec: SandboxSpec
    host: SandboxHost | None = None
    read_denied: Callable[[str], bool] | None = None
    warm: WarmHookHost | None = None
    _denied: tuple[str, ...] | None = field(default=None, repr=False)

    async def sandbox_host(self) -> SandboxHost:
        """The host facts (bwrap, cgroups), found on first use and kept."""
        if self.host is None:
            from sandbox.host import detect_host

            self.host = await detect_host()
        return self.host

    async def denied(self, roots: Sequence[Path]) -> tuple[str, ...]:
        if self.read_denied is None:
            return ()
        if self._denied is None:
            import glob

            from sandbox.guard import find_denied

            found = await trio.to_thread.run_sync(find_denied, list(roots), self.read_denied)
            self._denied = tuple(glob.escape(str(p)) for p in found)
        return self._denied


class HookRunner:
    """The session's hooks, by event (see the module docstring)."""

    def __init__(
        self,
        hooks: Sequence[ConfiguredHook] = (),
        *,
        workspace: Path,
        session_id: str = "",
        transcript_path: str = "",
        permission_mode: PermissionMode | None = None,
        extra_roots: Sequence[Path] = (),
        sandbox: HookSandbox | None = None,
        emit: EventSink | None = None,
        output_bytes: int = HOOK_OUTPUT_BYTES,
        recorder: WriteRecorder | None = None,
    ) -> None:
        """`sandbox` None runs every hook unsandboxed (the user turned the sandbox off);
        `recorder`: the session's change sets, told of every hook that may write."""
        self.hooks = tuple(hooks)
        self._by_event: dict[str, tuple[ConfiguredHook, ...]] = {}
        for configured in self.hooks:
            event = configured.hook.event
            self._by_event[event] = (*self._by_event.get(event, ()), configured)
        self.workspace = workspace
        self.extra_roots = tuple(extra_roots)
        self.session_id = session_id
        self.transcript_path = transcript_path
        self.recorder = recorder
        self.permission_mode = permission_mode or PermissionMode("default", floor_proven=False)
        """The session's mode, live: read at each hook (plan mode runs hooks read-only)."""
        self.sandbox = sandbox
        self.emit: EventSink = emit or (lambda event: None)
        self.output_bytes = output_bytes
        self.stop_requested: str | None = None
        """Set when a hook said `continue: false` (its `stopReason`): the loop ends the run
        `hook_blocked` at the next step. The session clears it before each run."""

    def has(self, event: HookEvent) -> bool:
        return event in self._by_event

    def _common(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "transcript_path": self.transcript_path,
            "cwd": str(self.workspace),
            # Claude Code's spelling (`acceptEdits`): hook scripts are written for it.
            "permission_mode": claude_mode(self.permission_mode.current),
        }

    def _call_fields(self, plan: CallPlan) -> dict[str, Any]:
        """The fields of a tool call's event (PreToolUse, PostToolUse)."""
        return {
            **self._common(),
            "tool_name": plan.block.name,
            "tool_input": _raw_input(plan),
            "tool_use_id": plan.block.id,
        }

    # -- per event --------------------------------------------------------------------------

    async def pre_tool_use(self, plan: CallPlan, *, agent_id: str | None = None) -> HookOutcome:
        """`agent_id`: the subagent that made the call (orchestrator/agents/hooks.py)."""
        if "PreToolUse" not in self._by_event:
            return NO_OUTCOME
        input = PreToolUseInput(**self._call_fields(plan), agent_id=agent_id)
        return await self.run(input, plan=plan)

    async def post_tool_use(
        self, plan: CallPlan, response: Any, *, agent_id: str | None = None
    ) -> HookOutcome:
        if "PostToolUse" not in self._by_event:
            return NO_OUTCOME
        input = PostToolUseInput(
            **self._call_fields(plan), tool_response=response, agent_id=agent_id
        )
        return await self.run(input, plan=plan)

    async def user_prompt_submit(self, prompt: str) -> HookOutcome:
        if "UserPromptSubmit" not in self._by_event:
            return NO_OUTCOME
        return await self.run(UserPromptSubmitInput(**self._common(), prompt=prompt))

    async def stop(
        self, *, active: bool, agent_id: str | None = None, agent_transcript: str | None = None
    ) -> HookOutcome:
        """`agent_id` (and its sidechain `agent_transcript`): a subagent's end, SubagentStop."""
        event: HookEvent = "SubagentStop" if agent_id is not None else "Stop"
        if event not in self._by_event:
            return NO_OUTCOME
        input = StopInput(
            **self._common(),
            stop_hook_active=active,
            subagent=agent_id is not None,
            agent_id=agent_id,
            agent_transcript_path=agent_transcript,
        )
        return await self.run(input)

    async def session_start(self, source: SessionSource) -> HookOutcome:
        if "SessionStart" not in self._by_event:
            return NO_OUTCOME
        return await self.run(SessionStartInput(**self._common(), source=source), name=source)

    async def session_end(self, reason: str = "other") -> HookOutcome:
        if "SessionEnd" not in self._by_event:
            return NO_OUTCOME
        return await self.run(SessionEndInput(**self._common(), reason=reason))

    async def notification(self, message: str) -> HookOutcome:
        if "Notification" not in self._by_event:
            return NO_OUTCOME
        return await self.run(NotificationInput(**self._common(), message=message))

    async def pre_compact(
        self, trigger: Literal["auto", "manual", "reactive"], instructions: str | None
    ) -> HookOutcome:
        if "PreCompact" not in self._by_event:
            return NO_OUTCOME
        input = PreCompactInput(
            **self._common(), trigger=trigger, custom_instructions=instructions or ""
        )
        return await self.run(input, name=trigger)

    # -- running ----------------------------------------------------------------------------

    def matching(
        self, event: HookEvent, *, plan: CallPlan | None = None, name: str | None = None
    ) -> list[ConfiguredHook]:
        out = []
        for configured in self._by_event.get(event, ()):
            matcher = configured.matcher
            if plan is not None and not matcher.matches_call(plan):
                continue
            if name is not None and not matcher.matches_name(name):
                continue
            out.append(configured)
        return out

    async def run(
        self, input: HookInput, *, plan: CallPlan | None = None, name: str | None = None
    ) -> HookOutcome:
        """Run every hook of `input`'s event that matches, concurrently; merge their answers.

        **Cancellation:** running hooks are killed and reaped, then `Cancelled` propagates.
        **Errors:** none: a hook that cannot start, crashes or times out is a `HookRun` with
        a non-blocking `error`.
        """
        selected = self.matching(input.hook_event_name, plan=plan, name=name)
        if not selected:
            return NO_OUTCOME
        data = input.payload()
        payload = json.dumps(data, default=str).encode()
        runs: list[HookRun | None] = [None] * len(selected)

        async def one(index: int, configured: ConfiguredHook) -> None:
            if configured.callback is not None:
                runs[index] = await self._call_back(configured, configured.callback, data)
            else:
                runs[index] = await self._recorded(input.hook_event_name, configured, payload)

        async with trio.open_nursery() as nursery:
            for index, configured in enumerate(selected):
                nursery.start_soon(one, index, configured)
        done = [run for run in runs if run is not None]
        tool_use_id = plan.block.id if plan is not None else None
        for run in done:
            self.emit(_event(input.hook_event_name, run, tool_use_id, input.agent_id))
        outcome = merge(done)
        if outcome.stop and self.stop_requested is None:
            self.stop_requested = (
                outcome.stop_reason
                or f"A {input.hook_event_name} hook stopped the run (continue: false)."
            )
        return outcome

    async def _recorded(
        self, event: str, configured: ConfiguredHook, payload: bytes
    ) -> HookRun:
        """`_run_one`, and, when the hook may write the workspace (anything but a sandboxed
        hook in plan mode), what it changed recorded as its own in the current turn's change
        set, so `warren undo` puts it back with the rest of the turn."""
        recorder = self.recorder
        sandboxed = self.sandbox is not None and configured.hook.sandbox
        if recorder is None or (sandboxed and self.permission_mode.current == "plan"):
            return await self._run_one(configured, payload)
        hook_id = f"hook_{secrets.token_hex(6)}"
        label = " ".join(configured.hook.command.split())
        await recorder.before_call(hook_id, Writer(hook_id, f"{event} hook", label[:60]))
        try:
            return await self._run_one(configured, payload)
        finally:
            with trio.CancelScope(shield=True):
                await recorder.after_call(hook_id)

    async def _run_one(self, configured: ConfiguredHook, payload: bytes) -> HookRun:
        hook = configured.hook
        started = time.monotonic()
        env = {"CLAUDE_PROJECT_DIR": str(self.workspace), "WARREN_PROJECT_DIR": str(self.workspace)}
        command = HookCommand(
            hook.command, payload, env, self.workspace, hook.timeout_s, self.output_bytes
        )
        try:
            if self.sandbox is None or not hook.sandbox:
                whole = dataclasses.replace(command, env={**os.environ, **env})
                done = await run_hook_command(whole, contain=False)
            elif self.sandbox.warm is not None:
                writable = self.permission_mode.current != "plan"
                done = await self.sandbox.warm.run_hook(command, writable=writable)
            else:
                done = await self._one_shot(hook, payload, env)
        except Exception as exc:  # a spec the host cannot build, a spawn failure
            done = HookProcess(None, b"", b"", f"could not start: {exc}")
        stdout = done.stdout.decode("utf-8", "replace")
        stderr = done.stderr.decode("utf-8", "replace")
        if done.problem is not None:
            output = HookOutput(error=done.problem)
        else:
            assert done.exit_code is not None
            output = parse_output(done.exit_code, stdout, stderr)
        duration = time.monotonic() - started
        return HookRun(configured, done.exit_code, stdout, stderr, duration, output)

    async def _call_back(
        self, configured: ConfiguredHook, callback: HookCallback, data: dict[str, Any]
    ) -> HookRun:
        """A host's hook: its answer read as a command hook's JSON stdout; no answer within
        the hook's timeout, or an error from the host, is a non-blocking error."""
        started = time.monotonic()
        tool_use_id = data.get("tool_use_id")
        answer: dict[str, Any] | None = None
        output = HookOutput(error=f"timed out after {configured.hook.timeout_s:g} s")
        with trio.move_on_after(configured.hook.timeout_s):
            try:
                answer = await callback(
                    json.loads(json.dumps(data, default=str)),
                    tool_use_id if isinstance(tool_use_id, str) else None,
                )
            except Exception as exc:  # the host answered with an error, or is gone
                output = HookOutput(error=f"the SDK host's hook failed: {exc}")
            else:
                output = parse_json_output(answer)
        stdout = "" if answer is None else json.dumps(answer, default=str)
        duration = time.monotonic() - started
        return HookRun(configured, None if answer is None else 0, stdout, "", duration, output)

    async def _one_shot(self, hook: Hook, payload: bytes, env: dict[str, str]) -> HookProcess:
        """The hook in a sandbox of its own: where no warm tool host is wired in
        (`warren hooks test`, a session whose tools run in process)."""
        from sandbox.run import run_sandboxed
        from sandbox.spec import WorkspaceRoot

        assert self.sandbox is not None
        base = self.sandbox.spec
        mode: Literal["ro", "rw"] = "ro" if self.permission_mode.current == "plan" else "rw"
        roots = (self.workspace, *self.extra_roots)
        denied = await self.sandbox.denied(roots)
        spec = base.model_copy(
            update={
                "workspaces": tuple(WorkspaceRoot(path=r, mode=mode) for r in roots),
                "extra_deny_read": base.extra_deny_read + denied,
                "env": base.env.model_copy(update={"values": {**base.env.values, **env}}),
                "limits": base.limits.model_copy(
                    update={"wall_time_s": hook.timeout_s, "output_bytes": self.output_bytes}
                ),
            }
        )
        done = await run_sandboxed(
            spec,
            ["/bin/sh", "-c", hook.command],
            cwd=self.workspace,
            stdin=payload,
            host=await self.sandbox.sandbox_host(),
        )
        problem = None
        if done.timed_out:
            problem = f"timed out after {hook.timeout_s:g} s and was stopped"
        elif done.killed_by_limit == "output":
            problem = f"printed more than {self.output_bytes} bytes and was stopped"
        elif done.killed_by_limit is not None:
            problem = done.limit_message(spec.limits) or "was stopped by a sandbox limit"
        return HookProcess(done.exit_code, done.stdout, done.stderr, problem)


def _raw_input(plan: CallPlan) -> dict[str, Any]:
    if plan.input is not None:
        return plan.input.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(plan.block.input)


def _event(
    event: HookEvent, run: HookRun, tool_use_id: str | None, agent_id: str | None
) -> HookRan:
    out = run.output
    return HookRan(
        hook_event=event,
        command=run.hook.hook.command,
        source=run.hook.source,
        exit_code=run.exit_code,
        duration_s=run.duration_s,
        blocked=out.blocked,
        decision=out.permission,
        error=out.error,
        stdout=run.stdout[:_SHOWN],
        stderr=run.stderr[:_SHOWN],
        tool_use_id=tool_use_id,
        agent_id=agent_id,
    )
