"""The session's `HookRunner`, from its effective policy.

Only the hooks the merge let through are here: an untrusted repository's never are
(`policies.files.merge_policy` leaves them out), so nothing a repository wrote runs until the
user trusts it. Each hook's matcher is compiled against the policy engine, anchored at the
directory of the file that defines it (as that file's rules are).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.calls.policy import SessionPolicy
from orchestrator.changes.writers import WriteRecorder
from orchestrator.events import EventSink
from orchestrator.hooks.matchers import build_matcher
from orchestrator.hooks.runner import ConfiguredHook, HookRunner, HookSandbox, WarmHookHost

__all__ = ["build_hook_runner", "configured_hooks", "hook_sandbox"]


def configured_hooks(policy: SessionPolicy) -> tuple[ConfiguredHook, ...]:
    """The hooks in force, in policy order (lowest level first), matchers compiled."""
    effective = policy.effective
    anchors = {layer.source: layer.anchor for layer in effective.layers}
    return tuple(
        ConfiguredHook(
            hook,
            source,
            build_matcher(
                hook.matcher,
                # Claude Code's settings say how their matcher reads (policies/hooks.py).
                kind=getattr(hook, "matcher_kind", None),
                engine=policy.engine,
                anchor=anchors.get(source),
            ),
        )
        for hook, source in effective.hooks
    )


def hook_sandbox(policy: SessionPolicy, warm: WarmHookHost | None = None) -> HookSandbox:
    """The floor for hooks: the tool hosts' additions (masks, protected paths, home
    allowances) and the policy's read deny rules; `warm`: the tool hosts themselves, where
    hooks then run."""
    return HookSandbox(policy.sandbox_spec(), read_denied=policy.read_denied(), warm=warm)


def build_hook_runner(
    policy: SessionPolicy,
    *,
    workspace: Path,
    sandboxed: bool,
    session_id: str = "",
    transcript_path: str = "",
    extra_roots: Sequence[Path] = (),
    emit: EventSink | None = None,
    warm: WarmHookHost | None = None,
    host_hooks: Sequence[ConfiguredHook] = (),
    recorder: WriteRecorder | None = None,
) -> HookRunner:
    """The runner for one session; `sandboxed` False (the user turned the sandbox off) runs
    every hook as a plain process. `warm`: the session's sandboxed tool hosts, where hooks
    run; without them each hook gets a one-shot sandbox. `host_hooks`: an SDK host's
    callbacks, after the policy's hooks. `recorder`: the session's change sets, which record
    what a hook that may write changed."""
    hooks = configured_hooks(policy)
    return HookRunner(
        (*hooks, *host_hooks),
        workspace=workspace,
        session_id=session_id,
        transcript_path=transcript_path,
        permission_mode=policy.permission_mode,
        extra_roots=extra_roots,
        sandbox=hook_sandbox(policy, warm) if sandboxed and hooks else None,
        emit=emit,
        recorder=recorder,
    )
