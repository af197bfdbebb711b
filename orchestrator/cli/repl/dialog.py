"""Permission dialogs: what a call will do, shown in full, and the user's answer.

Edit, MultiEdit, Write and NotebookEdit show a coloured unified diff of the change (built from
the call's own input: the coordinator does not read the workspace on a tool's behalf, so a
Write shows its whole new content); Bash shows the whole command and its description; other
tools their input. Everything shown is escaped: the call under review cannot repaint the
dialog. Answers, one key each:

- `y` allows this call;
- `n` denies it and asks for an optional reason for the model; the calls queued after it in
  the same batch are stopped too (`Deny.by_user`);
- `a` always: for an edit, accept-edits mode for the rest of this session; otherwise the rule
  shown in the dialog (a prefix rule for a simple Bash command) is allowed and saved to
  `.warren/policy.local.toml`;
- Esc denies the call and interrupts the turn.

Asks from subagents come through the same asker, one at a time, the dialog's first line
naming the subagent (its id and description).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from orchestrator.calls.permissions import Allow, Ask, Deny
from orchestrator.calls.policy import SessionPolicy
from orchestrator.calls.terminal_asker import remember_always
from orchestrator.text import escape_controls
from orchestrator.tools.base import Tool, ToolInput
from policies.files import PolicyError

__all__ = ["DialogAsker", "change_diff"]

MAX_DIFF_LINES = 400
"""Lines of a diff shown; the rest is counted."""


def change_diff(tool: str, raw: dict[str, Any]) -> list[str] | None:
    """The unified diff lines of an edit tool's call, from its input; None for other tools."""
    path = str(raw.get("file_path") or raw.get("notebook_path") or "")
    match tool:
        case "Edit":
            pairs = [(str(raw.get("old_string", "")), str(raw.get("new_string", "")))]
        case "MultiEdit":
            pairs = [
                (str(edit.get("old_string", "")), str(edit.get("new_string", "")))
                for edit in raw.get("edits") or []
                if isinstance(edit, dict)
            ]
        case "Write":
            pairs = [("", str(raw.get("content", "")))]
        case "NotebookEdit":
            pairs = [("", str(raw.get("new_source", "")))]
        case _:
            return None
    lines: list[str] = []
    for old, new in pairs:
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), fromfile=path, tofile=path, lineterm="", n=3
        )
        chunk = list(diff)
        lines.extend(chunk[2:] if lines else chunk)  # one header for the file
    return lines


def _diff_text(lines: list[str]) -> Text:
    text = Text()
    for line in lines[:MAX_DIFF_LINES]:
        shown = escape_controls(line)
        if line.startswith(("+++", "---")):
            text.append(shown + "\n", style="bold")
        elif line.startswith("+"):
            text.append(shown + "\n", style="green")
        elif line.startswith("-"):
            text.append(shown + "\n", style="red")
        elif line.startswith("@@"):
            text.append(shown + "\n", style="cyan")
        else:
            text.append(shown + "\n")
    if len(lines) > MAX_DIFF_LINES:
        text.append(f"… {len(lines) - MAX_DIFF_LINES} more lines\n", style="dim")
    return text


class DialogAsker:
    """The REPL's `Asker`: a dialog per ask, one at a time.

    `pause()` gives the terminal to the dialog (stops the live display and the Esc watcher);
    `interrupt()` stops the current turn (Esc in the dialog).

    **Cancellation:** the dialog's key read stops at once and the call is not run.
    """

    def __init__(
        self,
        policy: SessionPolicy,
        console: Console,
        *,
        pause: Callable[[], AbstractAsyncContextManager[None]],
        interrupt: Callable[[], None],
        read_key: Callable[[Callable[[str], bool]], Awaitable[str]],
        read_line: Callable[[str], Awaitable[str]],
        notify: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self._policy = policy
        self._console = console
        self._pause = pause
        self._interrupt = interrupt
        self._read_key = read_key
        self._read_line = read_line
        self._notify = notify
        self._lock = trio.Lock()

    async def __call__(self, tool: Tool[Any], input: ToolInput, ask: Ask) -> Allow | Deny:
        async with self._lock, self._pause():
            raw = input.model_dump(mode="json", by_alias=True, exclude_none=True)
            edit = tool.facts.family == "edit"
            always = self._always(tool, raw, edit)
            self._console.print(self._render(tool, input, raw, ask, always))
            async with trio.open_nursery() as nursery:
                if self._notify is not None:
                    nursery.start_soon(
                        self._notify, f"Warren needs your permission to use {tool.name}"
                    )
                keys = {"y", "n", "esc", *(["a"] if always else [])}
                key = await self._read_key(lambda k: k in keys)
            match key:
                case "y":
                    self._console.print(Text("  → allowed", "green"))
                    return Allow(rule="user: yes")
                case "a" if edit:
                    self._policy.permission_mode.set("accept-edits")
                    self._console.print(
                        Text("  → allowed; edits in the workspace run without asking for the "
                             "rest of this session (accept-edits)", "green")
                    )  # fmt: skip
                    return Allow(rule="user: always (accept-edits for this session)")
                case "a":
                    allowed = remember_always(self._policy, tool, raw)
                    self._console.print(Text(f"  → {escape_controls(allowed.rule or '')}", "green"))
                    return allowed
                case "n":
                    reason = (await self._read_line("  reason for the model (optional) > ")).strip()
                    self._console.print(Text("  → denied", "red"))
                    why = f" The user said: {reason}" if reason and reason != "\x04" else ""
                    return Deny(
                        f"The user denied this {tool.name} call.{why} Do not retry it as is; "
                        "adjust your approach or ask what they want.",
                        rule="user: no",
                        by_user=True,
                    )
                case _:  # Esc, Ctrl-C, or the terminal is gone
                    self._console.print(Text("  → denied; stopping the turn", "red"))
                    self._interrupt()
                    return Deny(
                        f"The user denied this {tool.name} call and interrupted the turn.",
                        rule="user: esc",
                        by_user=True,
                    )

    def _always(self, tool: Tool[Any], raw: dict[str, Any], edit: bool) -> str | None:
        """What `a` means for this call, or None when nothing narrow enough can be stored."""
        if edit:
            return "accept edits for the rest of this session"
        try:
            rule = self._policy.engine.suggest_rule(tool.name, raw, facts=tool.facts)
        except PolicyError:
            return None
        return f"always allow {rule} here (saved to .warren/policy.local.toml)"

    def _render(
        self,
        tool: Tool[Any],
        input: ToolInput,
        raw: dict[str, Any],
        ask: Ask,
        always: str | None,
    ) -> RenderableType:
        try:
            use = tool.render_use(input)
        except Exception:
            use = tool.name
        body: list[RenderableType] = []
        command_field = tool.facts.command_field
        diff = change_diff(tool.name, raw)
        if diff is not None:
            body.append(_diff_text(diff))
        elif command_field is not None and isinstance(raw.get(command_field), str):
            body.append(Text(escape_controls(raw[command_field], keep_lines=True), "bold"))
            description = raw.get("description")
            if isinstance(description, str) and description:
                body.append(Text(escape_controls(description), "dim"))
        else:
            shown = json.dumps(raw, indent=2, ensure_ascii=False)
            body.append(Text(escape_controls(shown, keep_lines=True)))
        body.append(Text(f"why: {escape_controls(ask.reason, keep_lines=True)}", "dim"))
        body.append(_options(always))
        if ask.agent:
            body.insert(0, Text(f"asked by {escape_controls(ask.agent)}", "bold cyan"))
        return Panel(
            Group(*body),
            title=Text(f"Allow {escape_controls(use)[:120]}?", "bold"),
            title_align="left",
            border_style="yellow",
        )


def _options(always: str | None) -> Text:
    options: Iterable[tuple[str, str]] = [
        ("y", "yes"),
        ("n", "no, and tell the model why"),
        *([("a", always)] if always else []),
        ("esc", "no, and stop the turn"),
    ]
    text = Text()
    for key, what in options:
        text.append(f"[{key}]", style="bold cyan")
        text.append(f" {escape_controls(what)}   ")
    return text
