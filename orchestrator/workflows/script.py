"""Running a workflow's script in a sandbox of its own and serving its requests.

The script is model-written Python. It runs in `runtime.py` (this folder) inside the
read-only floor (workspace read-only, network off, secrets masked, private /tmp) with CPU,
memory and wall-time limits (`[limits] workflow_cpu_s`, `workflow_memory_mb`,
`workflow_time_s`); its only power is the API over one connection to `run_script`, which
turns each request into a call of the `ScriptHost` (the workflow engine: subagents, phases,
the journal) and answers it. The engine builds the sandbox with `script_sandbox` from what
its session has.

Everything that comes over the connection is untrusted: the script shares its process with
the runtime, so it can write any line it likes. A line that is not what the runtime sends (not
JSON, an unknown op, a field of the wrong type, an id or key used twice, longer than
`MAX_LINE_BYTES`) ends the workflow as failed: the runtime checks every argument before it
sends, so such a line means the script went around it. Requests are served concurrently, each
`agent` in its own task: the host limits how many agents run at once, not this module.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import trio

from orchestrator.errors import WarrenError

if TYPE_CHECKING:
    from orchestrator.limits import Limits
    from sandbox.host import SandboxHost
    from sandbox.run import SandboxProcess
    from sandbox.spec import SandboxSpec

__all__ = [
    "MAX_LINE_BYTES",
    "OUTPUT_BYTES",
    "AgentCall",
    "AgentFailedError",
    "ScriptEnd",
    "ScriptHost",
    "ScriptSandbox",
    "run_script",
    "script_sandbox",
]

MAX_LINE_BYTES = 8 * 1024 * 1024
"""Bytes of one request line (a prompt, a schema, the finished result); a longer one fails
the workflow. The runtime refuses to send one, with this number in its message."""
OUTPUT_BYTES = 64 * 1024
"""Bytes of the script's own output (print, stderr) kept: the last ones."""
_SETTLE_S = 5.0
"""Seconds the script's process has to exit, and its output to end, once the conversation
is over (it exits by itself at once after its last message)."""
_RUNTIME = Path(__file__).with_name("runtime.py")
_KEY = re.compile(r"\d{1,9}(?:\.\d{1,9}){0,63}")
"""A position key as the runtime makes them (`runtime.py`'s module docstring)."""
_SCRATCH_BYTES = 64 * 1024 * 1024
"""The script's private /tmp and /dev/shm (each), and the largest file it may write there."""


@dataclass(frozen=True)
class AgentCall:
    """One `agent()` call of the script, checked. `key` is its position in the script's
    order of calls (the same in every run of the same script with the same answers)."""

    key: str
    prompt: str
    type: str | None
    schema: dict[str, Any] | None
    write_paths: list[str] | None
    label: str | None
    phase: str | None
    """The phase given, else the phase of the calling context when it called."""
    model: str | None


class AgentFailedError(WarrenError):
    """Raised by a `ScriptHost` to fail one `agent()` call: the script gets `AgentFailed`
    with `reason`, and goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ScriptHost(Protocol):
    """What serves a script's requests (the workflow engine)."""

    async def agent(self, call: AgentCall) -> Any:
        """The call's answer (JSON-serialisable: text, or the object its schema checked).

        **Errors:** `AgentFailedError` fails this call only; any other exception fails the
        workflow. **Cancellation:** the call is cancelled when the workflow ends."""
        ...

    def phase(self, title: str) -> None:
        """The script started a phase."""
        ...

    def log(self, text: str) -> None:
        """The script logged a line."""
        ...


@dataclass(frozen=True)
class ScriptEnd:
    """How a script ended."""

    status: Literal["finished", "failed"]
    result: Any
    """`finish()`'s value (None when the script returned without calling it)."""
    error: str | None
    """Why it failed: the script's traceback, a limit that stopped it, a broken protocol."""
    output: str
    """The script's own printed output, its last `OUTPUT_BYTES`."""


@dataclass(frozen=True)
class ScriptSandbox:
    """Where a script runs: a complete spec (`script_sandbox` makes it) and the host facts
    (detected at the start when None)."""

    spec: SandboxSpec
    host: SandboxHost | None = None


def script_sandbox(
    floor: SandboxSpec,
    roots: Sequence[Path],
    limits: Limits,
    *,
    host: SandboxHost | None = None,
    denied: tuple[str, ...] = (),
) -> ScriptSandbox:
    """The script's sandbox from a session's parts: `floor`, the policy's additions to the
    floor (`SessionPolicy.sandbox_spec()`: masks, protected paths, home allowances); `roots`,
    the workspace and extra roots, all read-only; `limits`, the session's (`workflow_*`);
    `denied`, workspace files the read deny rules cover (`sandbox.guard.find_denied`,
    escaped). Nothing in it is writable but its private /tmp, which is small."""
    from sandbox.spec import WorkspaceRoot

    workspaces = tuple(WorkspaceRoot(path=root, mode="ro") for root in roots)
    spec = floor.model_copy(
        update={
            "workspaces": workspaces or floor.workspaces,
            "extra_deny_read": floor.extra_deny_read + denied,
            "network": "off",
            "allow_unix_sockets": False,
            "env": floor.env.model_copy(
                # glibc's per-thread malloc arenas each reserve 64 MiB of address space
                update={"values": {**floor.env.values, "MALLOC_ARENA_MAX": "2"}}
            ),
            "limits": floor.limits.model_copy(
                update={
                    "cpu_time_s": limits.workflow_cpu_s,
                    "memory_bytes": limits.workflow_memory_mb * 1024 * 1024,
                    "wall_time_s": limits.workflow_time_s,
                    "tmp_bytes": _SCRATCH_BYTES,
                    "file_size_bytes": _SCRATCH_BYTES,
                }
            ),
        }
    )
    return ScriptSandbox(spec.read_only(), host)


async def run_script(
    source: str, args: Any, host: ScriptHost, sandbox: ScriptSandbox, *, run_id: str
) -> ScriptEnd:
    """Run `source` (a workflow script whose META was read: `meta.read_meta`) with `args`
    in `sandbox`, serving its requests with `host`, until it finishes, fails or its process
    ends.

    **Cancellation:** the sandbox (everything the script started) is killed and reaped,
    shielded and bounded (`sandbox.run.open_sandboxed_process`), then `Cancelled` propagates.

    **Errors:** `TypeError` when `args` is not JSON-serialisable; `SandboxError` or `OSError`
    when the sandbox cannot start. The script's own failures are a `ScriptEnd`.
    """
    from sandbox.run import open_sandboxed_process

    init = _line({"source": source, "args": args, "run_id": run_id, "max_line": MAX_LINE_BYTES})
    argv = [sys.executable, "-I", "-S", str(_RUNTIME)]
    output = _Tail(OUTPUT_BYTES)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        async with open_sandboxed_process(
            sandbox.spec,
            argv,
            host=sandbox.host,
            private_pipes=True,
            stdio_socket=theirs.fileno(),
        ) as proc:
            theirs.close()  # the sandbox holds the only copies of its end now
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
            conversation = _Conversation(stream, host)
            async with trio.open_nursery() as nursery:
                if proc.stderr is not None:
                    nursery.start_soon(output.drain, proc.stderr)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(init)  # a process that died at once: read its end
                await conversation.run()
                await stream.aclose()  # the runtime leaves at once if it has not yet
                with trio.move_on_after(_SETTLE_S):
                    await proc.wait()
                    await output.ended.wait()
                nursery.cancel_scope.cancel()
    return _ending(conversation.outcome, proc, sandbox.spec, output.text())


@dataclass(frozen=True)
class _Outcome:
    status: Literal["finished", "failed"]
    result: Any = None
    error: str | None = None


class _ProtocolError(Exception):
    """A line the runtime would not have sent."""


class _Conversation:
    """Reads the script's requests and answers them, each `agent` in a task of its own."""

    def __init__(self, stream: trio.SocketStream, host: ScriptHost) -> None:
        self._stream = stream
        self._host = host
        self._send_lock = trio.Lock()
        self._ids: set[int] = set()
        self._keys: set[str] = set()
        self._buffer = bytearray()
        self._calls: trio.Nursery | None = None
        self.outcome: _Outcome | None = None
        """None when the connection ended without a last message (the process ended)."""

    async def run(self) -> None:
        async with trio.open_nursery() as calls:
            self._calls = calls
            outcome = await self._serve()
            if self.outcome is None:
                self.outcome = outcome
            calls.cancel_scope.cancel()

    async def _serve(self) -> _Outcome | None:
        while True:
            try:
                line = await self._next_line()
                if line is None:
                    return None
                outcome = self._dispatch(_request(line))
            except _ProtocolError as exc:
                return _Outcome("failed", error=f"the workflow script broke its protocol: {exc}")
            except Exception as exc:  # the host's phase() or log() failed
                return _Outcome("failed", error=f"the workflow's host failed: {exc!r}")
            if outcome is not None:
                return outcome

    async def _next_line(self) -> bytes | None:
        """The next line, or None at the end of the connection. **Errors:** `_ProtocolError`
        past `MAX_LINE_BYTES`."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_LINE_BYTES:
                raise _ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes")
            try:
                chunk = await self._stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        if len(line) > MAX_LINE_BYTES:
            raise _ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes")
        return line

    def _dispatch(self, request: dict[str, Any]) -> _Outcome | None:
        match request["op"]:
            case "agent":
                number, call = self._agent_call(request)
                assert self._calls is not None
                self._calls.start_soon(self._answer, number, call)
            case "phase":
                self._host.phase(_text(request, "title"))
            case "log":
                self._host.log(_text(request, "text"))
            case "finish":
                return _Outcome("finished", result=request.get("value"))
            case "error":
                return _Outcome("failed", error=_text(request, "error"))
            case other:
                raise _ProtocolError(f"an unknown request {str(other)[:100]!r}")
        return None

    def _agent_call(self, request: dict[str, Any]) -> tuple[int, AgentCall]:
        unknown = set(request) - {"op", "id", *AgentCall.__dataclass_fields__}
        if unknown:
            raise _ProtocolError(f"agent request with unknown fields {sorted(unknown)[:5]}")
        number, key = request.get("id"), request.get("key")
        if type(number) is not int or number in self._ids:
            raise _ProtocolError(f"agent request with a bad or repeated id {number!r}")
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key in self._keys:
            raise _ProtocolError(f"agent request with a bad or repeated key {str(key)[:100]!r}")
        paths = request.get("write_paths")
        if paths is not None and not (
            isinstance(paths, list) and all(isinstance(p, str) for p in paths)
        ):
            raise _ProtocolError("agent request whose write_paths is not a list of strings")
        schema = request.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise _ProtocolError("agent request whose schema is not an object")
        self._ids.add(number)
        self._keys.add(key)
        call = AgentCall(
            key=key,
            prompt=_text(request, "prompt"),
            type=_optional_text(request, "type"),
            schema=schema,
            write_paths=paths,
            label=_optional_text(request, "label"),
            phase=_optional_text(request, "phase"),
            model=_optional_text(request, "model"),
        )
        return number, call

    async def _answer(self, number: int, call: AgentCall) -> None:
        """Ask the host, answer the script; a host that fails otherwise than with
        `AgentFailedError` fails the workflow."""
        try:
            value = await self._host.agent(call)
            answer = _line({"id": number, "ok": True, "value": value})
        except AgentFailedError as failed:
            answer = _line({"id": number, "ok": False, "reason": failed.reason})
        except Exception as exc:
            self._fail(f"the workflow's agent call {call.key} failed in the host: {exc!r}")
            return
        async with self._send_lock:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._stream.send_all(answer)

    def _fail(self, error: str) -> None:
        if self.outcome is None:
            self.outcome = _Outcome("failed", error=error)
        assert self._calls is not None
        self._calls.cancel_scope.cancel()


def _request(line: bytes) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except ValueError:
        raise _ProtocolError(f"a line that is not JSON: {line[:100]!r}") from None
    if not isinstance(request, dict) or not isinstance(request.get("op"), str):
        raise _ProtocolError(f"a line that is no request: {line[:100]!r}")
    return request


def _text(request: dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str):
        raise _ProtocolError(f"{request['op']} request whose {name} is not a string")
    return value


def _optional_text(request: dict[str, Any], name: str) -> str | None:
    return None if request.get(name) is None else _text(request, name)


def _line(message: dict[str, Any]) -> bytes:
    """One JSON line. **Errors:** `TypeError`/`ValueError` for a value JSON cannot carry."""
    return json.dumps(message, ensure_ascii=False, allow_nan=False).encode() + b"\n"


class _Tail:
    """The last `limit` bytes of a stream, read to its end."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._data = bytearray()
        self._dropped = 0
        self.ended = trio.Event()

    async def drain(self, stream: trio.abc.ReceiveStream) -> None:
        try:
            while chunk := await stream.receive_some(1 << 16):
                self._data += chunk
                excess = len(self._data) - self._limit
                if excess > 0:
                    del self._data[:excess]
                    self._dropped += excess
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.ended.set()

    def text(self) -> str:
        text = self._data.decode(errors="replace")
        return f"[{self._dropped} earlier bytes dropped]\n{text}" if self._dropped else text


def _ending(
    outcome: _Outcome | None, proc: SandboxProcess, spec: SandboxSpec, output: str
) -> ScriptEnd:
    """The `ScriptEnd` of a conversation and the process's exit."""
    if outcome is None:
        return ScriptEnd("failed", None, _died(proc, spec), output)
    error = outcome.error
    if error is not None and error.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError"):
        memory = spec.limits.memory_bytes
        limit = f"its {memory // (1024 * 1024)} MB" if memory else "the memory there is"
        error = f"the workflow script used more than {limit} of memory\n{error}"
    return ScriptEnd(outcome.status, outcome.result, error, output)


def _died(proc: SandboxProcess, spec: SandboxSpec) -> str:
    """Why the script's process ended without its last message: the limit that stopped
    it, else its exit status."""
    limits = spec.limits
    memory = (limits.memory_bytes or 0) // (1024 * 1024)
    match proc.killed_by_limit:
        case "cpu_time":
            return f"the workflow script used more than its {limits.cpu_time_s} s of CPU time"
        case "memory":
            return f"the workflow script used more than its {memory} MB of memory"
        case "wall_time":
            return f"the workflow script ran longer than its {limits.wall_time_s:g} s"
        case "processes":
            return f"the workflow script started more than {limits.processes} processes"
        case "file_size":
            return f"the workflow script wrote a file larger than {limits.file_size_bytes} bytes"
        case "output":
            return "the workflow script wrote too much output"
        case None:
            code = proc.returncode
            if code is not None and code > 128:
                return f"the workflow script's process was killed by signal {code - 128}"
            return f"the workflow script's process ended without finishing (exit status {code})"
