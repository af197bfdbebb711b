"""Permission asks answered by the user at the terminal (`/dev/tty`).

Used by `warren -p` when a person is at the terminal; headless runs without one deny asks
instead (`permissions.headless_asker`). Questions are asked one at a time, however many calls
run in parallel. Answers: `y` allows this call, `n` denies it (an optional reason goes to the
model), `a` allows it and stores a "don't ask again" rule in the repository's local policy
(`.warren/policy.local.toml`): for Bash a prefix rule only for a simple command, otherwise the
exact command (`policies.engine.PolicyEngine.remember`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import trio

from orchestrator.calls.permissions import Allow, Ask, Deny
from orchestrator.calls.policy import SessionPolicy
from orchestrator.text import escape_controls
from orchestrator.tools.base import Tool, ToolInput
from policies.files import PolicyError, save_remembered_rule
from policies.trust import TrustStore

__all__ = ["TerminalAsker", "remember_always"]


class TerminalAsker:
    """An `Asker` that prompts on a terminal device.

    **Cancellation:** a cancelled run stops waiting at once; the blocked read is abandoned
    to its thread and its answer, if any, ignored.
    """

    def __init__(
        self,
        policy: SessionPolicy,
        *,
        tty: Path = Path("/dev/tty"),
        notify: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        """`notify`: told (the session's Notification hooks) each time the user is asked,
        while the question waits; it never delays or answers it."""
        self._policy = policy
        self._tty = tty
        self._lock = trio.Lock()
        self._notify = notify

    async def __call__(self, tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
        async with self._lock:
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            try:
                async with trio.open_nursery() as nursery:
                    if self._notify is not None:
                        nursery.start_soon(
                            self._notify, f"Warren needs your permission to use {tool.name}"
                        )
                    answer, reason = await trio.to_thread.run_sync(
                        self._prompt, tool, input, ask, abandon_on_cancel=True
                    )
            except OSError as exc:
                return Deny(
                    f"Permission to use {tool.name} could not be asked ({exc}); "
                    "the call was not run.",
                    rule="terminal unavailable",
                )
            match answer:
                case "y":
                    return Allow(rule="user: yes")
                case "a":
                    return self._remember(tool, raw)
                case _:
                    why = f" The user said: {reason}" if reason else ""
                    return Deny(
                        f"The user denied this {tool.name} call.{why} Do not retry it as is; "
                        "adjust your approach or ask what they want.",
                        rule="user: no",
                        by_user=True,
                    )

    def _remember(self, tool: Tool[Any], raw: dict[str, Any]) -> Allow:
        return remember_always(self._policy, tool, raw)

    def _prompt(self, tool: Tool[Any], input: ToolInput, ask: Ask) -> tuple[str, str]:
        # Two handles: a terminal is not seekable, which a text-mode "r+" file requires.
        with (
            self._tty.open("w", encoding="utf-8") as term,
            self._tty.open("r", encoding="utf-8") as answers,
        ):
            try:
                use = tool.render_use(input)
            except Exception:
                use = f"{tool.name}({json.dumps(input.model_dump(mode='json'))[:200]})"
            # Everything shown comes from the model or the repository: escaped, so the
            # command under review cannot repaint the prompt (test_terminal_asker pins it).
            shown = escape_controls(use, keep_lines=True)
            why = escape_controls(ask.reason, keep_lines=True)
            who = f" ({escape_controls(ask.agent)} asks)" if ask.agent else ""
            _write(term, f"\nWarren asks: allow {shown}?{who}\n  why: {why}\n")
            while True:
                _write(term, "  [y] yes  [n] no  [a] always (don't ask again here) > ")
                line = answers.readline()
                if not line:
                    return "n", "no answer (end of input)"
                choice = line.strip().lower()
                if choice in ("y", "yes"):
                    return "y", ""
                if choice in ("a", "always"):
                    return "a", ""
                if choice in ("n", "no"):
                    _write(term, "  reason for the model (optional) > ")
                    return "n", answers.readline().strip()


def remember_always(policy: SessionPolicy, tool: Tool[Any], raw: dict[str, Any]) -> Allow:
    """An "always" answer: the call's rule allowed for the session and saved to the
    repository's local policy (`.warren/policy.local.toml`); the call allowed either way."""
    engine = policy.engine
    try:
        rule = engine.remember(tool.name, raw, facts=tool.facts)
    except PolicyError:
        return Allow(rule="user: yes (no rule can cover just this call)")
    try:
        path = save_remembered_rule(engine.workspace, rule, trust_store=TrustStore.from_env())
    except (OSError, PolicyError) as exc:
        return Allow(rule=f"user: always {rule} (this session only: {exc})")
    return Allow(rule=f"user: always {rule} (saved to {path})")


def _write(term: IO[str], text: str) -> None:
    term.write(text)
    term.flush()
