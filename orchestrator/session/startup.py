"""Everything a session needs before its first request: the floor proven (or a known one
reused), the policy loaded under it, the workspace's context snapshot gathered in a read-only
sandbox, and the Anthropic SDK imported meanwhile.

Nothing of the repository is read or run on the host here (issue 9): the snapshot is
gathered under the loaded policy, in a sandbox; the policy files are read as data.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import trio

from orchestrator.calls.policy import SessionPolicy, load_session_policy
from orchestrator.conversation.context import (
    ContextSandbox,
    ContextSnapshot,
    MemorySources,
    context_spec,
    gather_context,
)
from orchestrator.errors import ConfigError
from orchestrator.model.base import ModelClient
from orchestrator.paths import WarrenDirs
from orchestrator.session.config import FloorNotProven, RunnerFactory, SessionConfig

if TYPE_CHECKING:
    from sandbox.probe import FloorReport, KnownFloor
    from sandbox.spare import SpareSource

__all__ = ["SANDBOX_OFF_WARNING", "StartedUp", "floor_state", "start_up"]

SANDBOX_OFF_WARNING = (
    "warning: --sandbox=off: tool calls run directly on this machine, with your full "
    "permissions, network and secrets; only the permission checks stand between the model "
    "and your system."
)


async def start_up(
    config: SessionConfig,
    cwd: Path,
    dirs: WarrenDirs,
    runner: RunnerFactory | None,
    known_floor: KnownFloor | None = None,
    model: ModelClient | None = None,
    spares: SpareSource | None = None,
) -> StartedUp:
    """Everything a run needs before its first request. The SDK import (about a second) runs
    while the floor probe, the policy and then the context snapshot follow one another: the
    snapshot is workspace content, gathered in a read-only sandbox under the loaded policy
    (issue 9: nothing from the repository is read or run on the host). A `known_floor` of
    the same host stands in for the probe (`sandbox.probe.reuse_floor`), and its host for
    detecting one when this process's environment would find the same (`reuse_known`); the
    `model`'s SDK client is made meanwhile, in a thread. With the warm server's `spares`,
    the snapshot's sandbox is a spare started ahead of the session when one matches
    (`orchestrator.conversation.context.ContextSandbox`)."""
    started: list[StartedUp] = []
    failure: list[Exception] = []

    async def probe_then_context() -> None:
        try:
            floor: FloorReport | None = None
            host = None
            if config.sandbox == "required":
                from sandbox.host import detect_host
                from sandbox.probe import probe_floor, reuse_floor, reuse_known

                reused = reuse_known(known_floor)
                if reused is not None:
                    host, floor = reused
                else:
                    try:
                        host = await detect_host()
                    except Exception:  # the probe reports a missing bwrap itself
                        host = None
                    if host is not None:
                        floor = reuse_floor(known_floor, host)
                    if floor is None:
                        floor = await probe_floor(host=host)
            state = floor_state(config, floor, runner)
            policy = load_session_policy(
                cwd,
                floor_proven=state == "proven",
                permission_mode=config.permission_mode,
                allowed_tools=config.allowed_tools,
                disallowed_tools=config.disallowed_tools,
                no_sandbox_consent=config.no_sandbox_consent,
                add_dirs=config.add_dirs,
                settings=config.settings,
                setting_sources=config.setting_sources,
                mcp_configs=config.mcp_configs,
            )
            for notice in (
                policy.effective.untrusted_hooks_notice(),
                policy.effective.untrusted_servers_notice(),
            ):
                if notice:
                    sys.stderr.write(notice + "\n")  # once per start-up (issues 12, 14)
            memory = MemorySources.for_session(
                cwd,
                config_dir=dirs.config,
                deny=policy.read_deny_patterns(),
                writable_roots=policy.writable_roots(),
            )
            sandbox = (
                ContextSandbox(
                    context_spec(
                        memory.root, deny_read=policy.deny_read(), home_allow=policy.home_allow()
                    ),
                    host,
                    spares,
                )
                if state == "proven"
                else None
            )
            snapshot = await gather_context(cwd, sandbox=sandbox, memory=memory)
            # Before any call is classified: git is not auto-approved where a repository of
            # the workspace configures a driver's program (issue 33).
            policy.engine.analyser.git_risk = snapshot.git_risk
            started.append(StartedUp(snapshot, floor, state, policy))
        except Exception as exc:  # re-raised below, outside the nursery (no ExceptionGroup)
            failure.append(exc)

    async def warm_up_sdk() -> None:
        if not config.model.startswith("scripted:"):
            from orchestrator.model.anthropic import AnthropicModel, warm_up

            if isinstance(model, AnthropicModel):
                await model.warm_up()
            else:
                await warm_up()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(warm_up_sdk)
        nursery.start_soon(probe_then_context)
    if failure:
        raise failure[0]
    return started[0]


@dataclass(frozen=True)
class StartedUp:
    snapshot: ContextSnapshot
    floor: FloorReport | None
    floor_state: Literal["proven", "off"]
    policy: SessionPolicy


def floor_state(
    config: SessionConfig, floor: FloorReport | None, runner: RunnerFactory | None
) -> Literal["proven", "off"]:
    """`off` (said loudly), or `proven`; an unproven floor under `required` stops the run."""
    if config.sandbox == "off":
        sys.stderr.write(SANDBOX_OFF_WARNING + "\n")
        return "off"
    assert floor is not None
    if not floor.proven:
        raise FloorNotProven(floor.render())
    if runner is None:
        raise ConfigError("no sandboxed tool runner was wired in", source="sandbox")
    return "proven"
