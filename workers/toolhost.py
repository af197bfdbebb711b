"""The tool host: a long-lived worker process that runs the main agent's tool calls.

The coordinator never touches the workspace on a tool's behalf; it starts two of these under
the OS floor (`workers.toolhost_runner`) — one with the workspace writable, one with it mounted
read-only — and sends them calls over the wire protocol (`workers.protocol`):

    python -m workers.toolhost --role read_write --workspace /repo [--cwd DIR]
        [--extra-root DIR]... [--session-id ID] [--tools MODULE:FUNCTION]

Each call runs in its own task, so `Cancel` stops one call and read-only calls overlap. The
session's sandboxed hooks run here too (`RunHook`), as contained children of the host, so
they cost a process spawn rather than a sandbox of their own (`orchestrator.hooks.runner`). The
host keeps one `ToolContext` for its lifetime (the persistent shell is one of its resources).
Its `ReadLedger` is a replica of the coordinator's: calls carry the coordinator's changes in,
and answers carry back what the host's tools recorded or forgot (`_JournalLedger`).

The protocol owns the real stdin and stdout. At start-up both are moved to private descriptors
and fd 0 / fd 1 become /dev/null / stderr, so a stray `print` or a child process can neither
corrupt the stream nor swallow coordinator input. Logs are JSON lines on stderr.

The host exits 0 on `Shutdown`, end of stdin or SIGTERM, after cancelling running calls and
closing the context's resources (bounded).

Its logs are written by `HostLog`, not structlog: importing structlog (with rich, pygments and
asyncio) added 5 MB to each of a session's two hosts (tests/workers/test_worker_imports.py
pins what a host imports on its way to `Ready`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import trio

from orchestrator.aio import closing_iter
from orchestrator.errors import ToolError
from orchestrator.hooks.process import HookCommand, run_hook_command
from orchestrator.tools.base import ReadLedger, ToolContext, ToolOutput
from orchestrator.tools.bash import MAX_OUTPUT_CHARS, SHELL_RESOURCE
from orchestrator.tools.registry import ToolRegistry, builtin_tools
from orchestrator.tools.shell import PersistentShell, shell_environment
from workers import host_protocol as wire
from workers.entry import (
    exit_now,
    load_tools_factory,
    make_undumpable,
    serve_until_sigterm,
    take_protocol,
)

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DEFAULT_TOOLS",
    "HostLog",
    "ToolHost",
    "host_tools",
    "main",
]

DEFAULT_TOOLS = "workers.toolhost:host_tools"
"""The `--tools` factory used when none is given: the built-in tools."""

CLOSE_TIMEOUT_S = 10.0
"""Seconds the host gives its context's resources (the persistent shell) to close on exit."""


class HostLog:
    """The host's log: one JSON object per line on stderr (`event`, `level`, `timestamp`, the
    role and the fields given), which the coordinator relays into its own log
    (`workers.child`)."""

    def __init__(self, role: str) -> None:
        self.role = role

    def info(self, event: str, **fields: Any) -> None:
        self._write(event, "info", fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._write(event, "warning", fields)

    def exception(self, event: str, **fields: Any) -> None:
        """`event` at level error, with the traceback of the exception being handled."""
        self._write(event, "error", {**fields, "exception": traceback.format_exc()})

    def _write(self, event: str, level: str, fields: dict[str, Any]) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        record = {"event": event, "level": level, "timestamp": stamp, "role": self.role, **fields}
        try:
            sys.stderr.write(json.dumps(record, default=str) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a log that cannot be written must not stop the host
            pass


def host_tools(role: wire.HostRole) -> ToolRegistry:
    """The built-in tools as a host of `role` runs them.

    The coordinator routes a call to the read-only host only when the call is classified
    read-only, so there every Bash command is read-only (it runs one-shot, concurrently), and
    in the read-write host none is (it runs in the persistent shell, one at a time).
    """
    if role == "read_only":
        return builtin_tools(bash_classifier=lambda _command: True)
    return builtin_tools()


class _JournalLedger(ReadLedger):
    """The host's replica of the coordinator's ledger, journaling what this host's tools do.

    Changes from the coordinator arrive through `apply` and are not journaled; `record` and
    `forget` (the tools) are, and every answer drains the journal. Concurrent calls share the
    journal, so one call's answer may carry another's entries: harmless, since the coordinator
    applies every answer, in order, to the same ledger.
    """

    def __init__(self) -> None:
        super().__init__()
        self._journal: dict[Path, int | None] = {}

    def record(self, path: Path) -> None:
        key, mtime = path.resolve(), os.stat(path).st_mtime_ns
        self.apply({key: mtime}, ())
        self._journal[key] = mtime

    def forget(self, path: Path) -> None:
        key = path.resolve()
        self.apply({}, (key,))
        self._journal[key] = None

    def take_changes(self) -> wire.LedgerDelta:
        journal, self._journal = self._journal, {}
        if not journal:
            return _NO_CHANGES
        return wire.LedgerDelta(
            recorded={str(p): m for p, m in journal.items() if m is not None},
            forgotten=[str(p) for p, m in journal.items() if m is None],
        )

    def take_delta(self, delta: wire.LedgerDelta) -> None:
        if delta:
            self.apply({Path(p): m for p, m in delta.recorded.items()}, map(Path, delta.forgotten))


_NO_CHANGES = wire.LedgerDelta()


class ToolHost:
    """Serves one coordinator: reads messages, runs calls in tasks, writes answers.

    `send` writes one encoded line to the coordinator; the host serialises its calls.
    """

    def __init__(
        self,
        *,
        role: wire.HostRole,
        tools: ToolRegistry,
        ctx: ToolContext,
        send: Callable[[bytes], Awaitable[None]],
    ) -> None:
        self.role = role
        self.tools = tools
        self.ctx = ctx
        self.ledger = _JournalLedger()
        ctx.read_ledger = self.ledger
        # The Bash tool's own resource, made here (it starts nothing until used) so the host
        # can carry its state between hosts; same arguments as BashTool's factory.
        self.shell = ctx.resource(
            SHELL_RESOURCE,
            lambda: PersistentShell(
                cwd=ctx.cwd, env=shell_environment(), output_limit=MAX_OUTPUT_CHARS
            ),
        )
        self._shell_reported = _shell_state(self.shell)
        self._send_bytes = send
        self._send_lock = trio.Lock()
        self._calls: dict[str, trio.CancelScope] = {}
        self._serving: trio.CancelScope | None = None
        self._log = HostLog(role)

    async def serve(self, reader: wire.LineReader) -> None:
        """Answer messages until `Shutdown` or end of input, then close the context.

        **Cancellation:** running calls are cancelled; the context is still closed (shielded,
        at most `CLOSE_TIMEOUT_S`).
        """
        try:
            async with trio.open_nursery() as nursery:
                self._serving = nursery.cancel_scope
                await self._send(
                    wire.Ready(
                        version=wire.PROTOCOL_VERSION,
                        pid=os.getpid(),
                        role=self.role,
                        workspace=str(self.ctx.workspace),
                        tools=self.tools.names(),
                    )
                )
                await self._receive(reader, nursery)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                await self.ctx.aclose()
            self._log.info("tool host stopped")

    async def _receive(self, reader: wire.LineReader, nursery: trio.Nursery) -> None:
        while (line := await reader.next()) is not None:
            if isinstance(line, wire.Oversized):
                detail = f"line of {line.size} bytes exceeds the {wire.MAX_LINE_BYTES}-byte cap"
                self._log.warning("oversized line skipped", size=line.size)
                await self._send(wire.Malformed(detail=detail))
                continue
            message = wire.decode_host_line(line)
            match message:
                case wire.RunTool():
                    self.ledger.take_delta(message.ledger)
                    if message.shell is not None:
                        _adopt_shell_state(self.shell, message.shell)
                    scope = trio.CancelScope()
                    self._calls[message.id] = scope
                    nursery.start_soon(self._run, message, scope)
                case wire.ValidateTool():
                    self.ledger.take_delta(message.ledger)
                    nursery.start_soon(self._validate, message)
                case wire.RunHook():
                    scope = trio.CancelScope()
                    self._calls[message.id] = scope
                    nursery.start_soon(self._hook, message, scope)
                case wire.Cancel(id=call_id):
                    if (running := self._calls.get(call_id)) is not None:
                        running.cancel()
                case wire.Shutdown():
                    self._log.info("shutdown requested")
                    return
                case wire.ProtocolError(detail=detail, call_id=call_id):
                    self._log.warning("malformed line", detail=detail, line=message.line_prefix)
                    await self._send(wire.Malformed(detail=detail, id=call_id))
                case _:
                    detail = f"a tool host does not accept {message.type!r} messages"
                    await self._send(wire.Malformed(detail=detail))
        self._log.info("end of input")

    async def _validate(self, message: wire.ValidateTool | wire.RunTool) -> bool:
        """Answer whether the call is valid (`Validated`); True when it is."""
        refusal = error = None
        try:
            tool = self._tool(message.tool)
            refusal = await tool.validate(tool.parse_input(message.input), self.ctx)
        except Exception as exc:
            error = _exception_text(exc)
        await self._send(
            wire.Validated(
                id=message.id, refusal=refusal, error=error, ledger=self.ledger.take_changes()
            )
        )
        return refusal is None and error is None

    async def _run(self, message: wire.RunTool, scope: trio.CancelScope) -> None:
        outcome: wire.ToolOutcome = "no_output"
        output: ToolOutput | None = None
        try:
            with scope:
                if message.check and not await self._validate(message):
                    return  # refused: the `Validated` was the answer
                try:
                    tool = self._tool(message.tool)
                    input = tool.parse_input(message.input)
                    async with closing_iter(tool.call(input, self.ctx)) as events:
                        async for event in events:
                            if isinstance(event, ToolOutput):
                                outcome, output = "output", event
                                break
                            await self._send(
                                wire.ToolProgress(
                                    id=message.id,
                                    text=event.text,
                                    data=event.data.decode("latin-1"),
                                )
                            )
                except ToolError as exc:
                    outcome, output = "tool_error", ToolOutput(exc.message, is_error=True)
                except Exception as exc:
                    self._log.exception("tool call failed", tool=message.tool)
                    outcome = "output"
                    output = ToolOutput(
                        f"{message.tool} failed unexpectedly: {_exception_text(exc)}. "
                        "This is likely a bug in the tool; try a different approach.",
                        is_error=True,
                    )
            if scope.cancelled_caught and output is None:
                outcome = "cancelled"
        finally:
            self._calls.pop(message.id, None)
        await self._send(self._result(message.id, outcome, output))

    async def _hook(self, message: wire.RunHook, scope: trio.CancelScope) -> None:
        """Run a hook's command as a contained child of this host: it inherits the host's
        sandbox (the floor hooks run under), never its protocol descriptors (not inheritable)
        nor its `/proc` entries (the host is not dumpable: `workers.entry`)."""
        result = wire.HookResult(id=message.id, exit_code=None, problem="was cancelled")
        try:
            with scope:
                try:
                    hook = HookCommand(
                        message.command,
                        message.stdin.encode(),
                        {**os.environ, **message.env},
                        Path(message.cwd),
                        message.timeout_s,
                        message.output_bytes,
                    )
                    done = await run_hook_command(hook, contain=True)
                except OSError as exc:
                    result = result.model_copy(update={"problem": f"could not start: {exc}"})
                else:
                    result = wire.HookResult(
                        id=message.id,
                        exit_code=done.exit_code,
                        stdout=done.stdout.decode("utf-8", "replace"),
                        stderr=done.stderr.decode("utf-8", "replace"),
                        problem=done.problem,
                    )
        finally:
            self._calls.pop(message.id, None)
        await self._send(result)

    def _result(
        self, call_id: str, outcome: wire.ToolOutcome, output: ToolOutput | None
    ) -> wire.ToolResult:
        ledger = self.ledger.take_changes()
        shell = None
        if self.role == "read_write":
            state = _shell_state(self.shell)
            if state != self._shell_reported:
                shell = self._shell_reported = state
        if output is None:
            return wire.ToolResult(id=call_id, outcome=outcome, ledger=ledger, shell=shell)
        return wire.ToolResult(
            id=call_id,
            outcome=outcome,
            content=output.content,
            is_error=output.is_error,
            summary=output.summary,
            ledger=ledger,
            shell=shell,
        )

    def _tool(self, name: str) -> Any:
        tool = self.tools.get(name)
        if tool is None:
            raise ToolError(
                f"The {self.role} tool host has no tool named {name}; it has: "
                f"{', '.join(self.tools.names())}."
            )
        return tool

    async def _send(self, message: pydantic.BaseModel) -> None:
        line = wire.encode(message)
        if len(line) > wire.MAX_LINE_BYTES and isinstance(message, wire.ToolResult):
            line = wire.encode(
                message.model_copy(
                    update={
                        "content": f"The result was too large to return ({len(line)} bytes "
                        "encoded). Ask for less at once (a smaller range or a filter).",
                        "is_error": True,
                        "summary": None,
                    }
                )
            )
        # Shielded: a line cut short by a cancelled call would corrupt every later one.
        with trio.CancelScope(shield=True):
            try:
                async with self._send_lock:
                    await self._send_bytes(line)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # The coordinator is gone; nobody is left to answer.
                self._log.info("coordinator gone; stopping")
                if self._serving is not None:
                    self._serving.cancel()


def rehearse() -> None:
    """A host's first-call work, done once by a template before it forks hosts
    (`workers.zygote --serves toolhost`), so that every host it forks starts with it done:
    the wire decoder (a pydantic adapter built on the first line read), the encoders of
    what a host sends, and a Read's parsing, validation and read of a file (this module's
    own source). On the calling thread only: a template must not have started a thread
    when it forks (trio's `to_thread`, which a Read's call uses, would leave one)."""
    here = Path(__file__).resolve()
    ctx = ToolContext(workspace=here.parent, cwd=here.parent, session_id="rehearsal")

    async def discard(_: bytes) -> None:
        return None

    host = ToolHost(role="read_only", tools=host_tools("read_only"), ctx=ctx, send=discard)
    asked = {"file_path": str(here), "limit": 5}
    for message in (
        wire.RunTool(id="r", tool="Read", input=asked, check=True),
        wire.ValidateTool(id="r", tool="Read", input=asked),
        wire.Cancel(id="r"),
        wire.Shutdown(),
    ):
        wire.decode_host_line(wire.encode(message).rstrip(b"\n"))
    read = host._tool("Read")

    async def first_calls() -> None:
        input = read.parse_input(asked)
        refusal = await read.validate(input, ctx)
        output = read.run(input, ctx)
        await host._send(wire.Validated(id="r", refusal=refusal, ledger=host.ledger.take_changes()))
        await host._send(wire.ToolProgress(id="r", text="rehearsal"))
        await host._send(host._result("r", "output", output))
        await ctx.aclose()

    trio.run(first_calls)


def _shell_state(shell: PersistentShell) -> wire.ShellState:
    return wire.ShellState(cwd=str(shell.cwd), snapshot=shell.snapshot)


def _adopt_shell_state(shell: PersistentShell, state: wire.ShellState) -> None:
    """Make `shell`'s one-shot runs start where the read-write host's shell is."""
    shell.adopt_state(cwd=Path(state.cwd), snapshot=state.snapshot)


def _exception_text(exc: Exception) -> str:
    if isinstance(exc, ToolError):
        return exc.message
    if isinstance(exc, pydantic.ValidationError):
        return f"invalid input: {exc.error_count()} problem(s): {exc.errors(include_url=False)}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class _Args:
    """The host's command line (see the module's docstring)."""

    role: wire.HostRole
    workspace: Path
    cwd: Path | None = None
    extra_root: list[Path] = field(default_factory=list)
    session_id: str = "local"
    tools: str = DEFAULT_TOOLS
    read_deny: str = "[]"


_FLAGS = {
    "--role": "role",
    "--workspace": "workspace",
    "--cwd": "cwd",
    "--extra-root": "extra_root",
    "--session-id": "session_id",
    "--tools": "tools",
    "--read-deny": "read_deny",
}
_PATHS = ("workspace", "cwd", "extra_root")
_ROLES = ("read_write", "read_only")


def _parse_args(argv: Sequence[str] | None) -> _Args:
    """The host's arguments. The argv the coordinator builds (`HostLaunch.of_module`: each
    flag then its value) is read without argparse, whose import (with gettext) is 0.3 MB PSS
    of every host (tests/workers/test_worker_imports.py); anything else (`--help`,
    `--flag=value`, an abbreviation, a mistake) goes to argparse, which reads it or says what
    is wrong. Both read an argv the same (tests/workers/test_toolhost_args.py)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return _read_flags(args) or _parse_with_argparse(args)


def _read_flags(args: list[str]) -> _Args | None:
    """`args` as `_parse_with_argparse` reads them, when they are only known flags each followed
    by a value argparse cannot take for an option; None otherwise."""
    values: dict[str, Any] = {"extra_root": []}
    if len(args) % 2:
        return None
    for flag, value in zip(args[::2], args[1::2], strict=True):
        name = _FLAGS.get(flag)
        if name is None or value.startswith("-"):
            return None
        if name == "role" and value not in _ROLES:  # argparse checks every occurrence
            return None
        item = Path(value) if name in _PATHS else value
        values[name] = [*values[name], item] if name == "extra_root" else item
    if values.get("role") not in _ROLES or "workspace" not in values:
        return None
    return _Args(**values)


def _parse_with_argparse(args: list[str]) -> _Args:
    import argparse  # here, not at import: see `_parse_args`

    parser = argparse.ArgumentParser(prog="python -m workers.toolhost", description=__doc__)
    parser.add_argument("--role", choices=_ROLES, required=True)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--cwd", type=Path, default=None)
    parser.add_argument("--extra-root", type=Path, action="append", default=[])
    parser.add_argument("--session-id", default="local")
    parser.add_argument("--tools", default=DEFAULT_TOOLS)
    parser.add_argument("--read-deny", default="[]", help="JSON [[specifier, anchor], ...]")
    return _Args(**vars(parser.parse_args(args)))


async def _serve(args: _Args, proto_in: int, proto_out: int) -> None:
    workspace = args.workspace.resolve()
    roots: Iterable[Path] = (p.resolve() for p in args.extra_root)
    ctx = ToolContext(
        workspace=workspace,
        cwd=(args.cwd or workspace).resolve(),
        session_id=args.session_id,
        extra_roots=tuple(roots),
        read_deny=tuple((str(s), str(a)) for s, a in json.loads(args.read_deny)),
    )
    role: wire.HostRole = args.role
    out = trio.lowlevel.FdStream(proto_out)
    host = ToolHost(
        role=role, tools=load_tools_factory(args.tools)(role), ctx=ctx, send=out.send_all
    )
    await serve_until_sigterm(
        host.serve, proto_in, on_sigterm=lambda: HostLog(role).info("SIGTERM: stopping")
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m workers.toolhost`; returns the exit status."""
    make_undumpable()  # before anything else: see workers.entry
    args = _parse_args(argv)
    proto_in, proto_out = take_protocol(args.role)
    HostLog(args.role).info("tool host starting", pid=os.getpid())
    trio.run(_serve, args, proto_in, proto_out)
    return 0


if __name__ == "__main__":
    exit_now(main())
