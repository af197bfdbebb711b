"""The workflow script's runtime: the program that runs INSIDE the script's sandbox.

Started as `python -I -S runtime.py` by `orchestrator.workflows.script.run_script`. It imports
the standard library only, never anything of the repository: it is the one program of Warren's
that shares its process with model-written code, so it stays small enough to read whole.

Its only link to the coordinator is a connected socket it finds named in `WARREN_PIPE_FDS`
(`sandbox.run.open_sandboxed_process(private_pipes=True, stdio_socket=...)`): one JSON line
of init (the script's source, `args`, the run id, the line cap), then JSON lines both ways.

    requests   {"op":"agent","id":N,"key":"3.1","prompt":...,"type":...,"schema":...,
                "write_paths":...,"label":...,"phase":...,"model":...}
               {"op":"phase","title":...}  {"op":"log","text":...}
               {"op":"finish","value":...}  {"op":"error","error":"<traceback>"}
    answers    {"id":N,"ok":true,"value":...}  {"id":N,"ok":false,"reason":...}

Why a socket and not pipes: a pipe can be opened again through `/proc/PID/fd/N` by anything
that may look there (the script's own process included); a socket cannot (`ENXIO`). The
process also makes itself undumpable, so the script's children cannot look there, take the
descriptor (`pidfd_getfd`) or read its memory; the descriptors are not inherited. What the
script can still do, in its own process, is write lines of its own: the coordinator treats
every line as untrusted and checks it, so that gives no more than the API does.

The script's own output (print, fd 1 and 2) goes to the sandbox's stderr pipe, which the
coordinator keeps as the workflow's log (a bounded tail); it never touches the protocol. The
sandbox's init holds that pipe too (`/proc/1/fd/1`): whatever runs in the sandbox can write
into the log that way, and only into the log.

Keys: every `agent()` call carries a position that does not depend on the threads' timing.
Each context (the script's top level, a `parallel` thunk, a `pipeline` item's stage) numbers
its calls 0, 1, 2...; a `parallel` or `pipeline` call takes the next number P of its context,
and its thunk i runs in the context `P.i` (a pipeline's item i at stage s in `P.i.s`), so the
first agent call of thunk 2 of the parallel at position 1 is `1.2.0`. Two runs of the same
script with the same answers send the same keys for the same calls, which is what resuming
from a journal relies on. Threads the script starts itself share the top level's counter.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any

SCRIPT_NAME = "<workflow>"
"""The script's file name in tracebacks."""
_MAX_THREADS = 64
"""Threads one `parallel` or `pipeline` call runs its thunks or items in (the calling thread
is one of them); more wait for a free one. The coordinator's pool limits the agents running
at once anyway; this bounds the threads' stacks within the script's memory limit."""
_STACK_BYTES = 2 * 1024 * 1024
"""Stack of each thread: glibc's default (the stack rlimit, often 8 MiB) would put 64
threads past a 512 MB address-space limit."""
_CLOSED_EXIT = 3
"""Exit status when the coordinator closes the connection."""


class AgentFailed(Exception):
    """An `agent()` call that failed (`reason` says why). `parallel` and `pipeline` return it
    as a value in the failed one's place; it is falsy, so `[r for r in results if r]` keeps
    the successes."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __bool__(self) -> bool:
        return False


class _Position:
    """Numbers the calls of one context: `take()` is the key of its next call."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._next = 0
        self._lock = threading.Lock()  # the top level is shared by the script's own threads

    def take(self) -> str:
        with self._lock:
            number = self._next
            self._next += 1
        return f"{self.prefix}.{number}" if self.prefix else str(number)


class _Context(threading.local):
    """The calling thread's position and phase; a thread the script starts itself begins at
    the top level with no phase."""

    def __init__(self, top: _Position) -> None:
        self.position = top
        self.phase: str | None = None


class _Channel:
    """The connection to the coordinator: whole lines written under one lock, one reader
    thread handing each answer to the caller waiting for it."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self._in = fd_in
        self._out = fd_out
        self.max_line = 1 << 20
        """The coordinator's cap on a line (the init line says it)."""
        self._lock = threading.Lock()
        """Held while a line is written, so lines never interleave."""
        self._ids = 0
        self._waiting: dict[int, list[Any]] = {}  # id -> [event, answer]
        self._waiting_lock = threading.Lock()
        self._buffer = bytearray()

    def read_line(self) -> bytes:
        """The next line from the coordinator; the process ends when there is none."""
        scanned = 0
        while (end := self._buffer.find(b"\n", scanned)) < 0:
            scanned = len(self._buffer)
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                os._exit(_CLOSED_EXIT)
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    def encode(self, message: dict[str, Any], what: str) -> bytes:
        line = json.dumps(message, ensure_ascii=False, allow_nan=False).encode() + b"\n"
        if len(line) > self.max_line:
            raise ValueError(f"{what} is {len(line)} bytes as JSON; at most {self.max_line}")
        return line

    def send(self, line: bytes) -> None:
        with self._lock:
            self._write(line)

    def _write(self, line: bytes) -> None:
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self._out, view) :]
        except OSError:
            os._exit(_CLOSED_EXIT)

    def ask(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        """Send a request and wait for its answer."""
        slot: list[Any] = [threading.Event(), None]
        with self._waiting_lock:
            self._ids += 1
            number = self._ids
            self._waiting[number] = slot
        try:
            self.send(self.encode({**message, "id": number}, what))
        except BaseException:
            with self._waiting_lock:
                del self._waiting[number]
            raise
        slot[0].wait()
        answer: dict[str, Any] = slot[1]
        return answer

    def answers(self) -> None:
        """The reader thread: each answer to its caller, until the coordinator is gone."""
        try:
            while True:
                answer = json.loads(self.read_line())
                with self._waiting_lock:
                    slot = self._waiting.pop(answer["id"], None)
                if slot is not None:
                    slot[1] = answer
                    slot[0].set()
        except Exception:  # the coordinator broke the protocol: no answer can come any more
            os._exit(_CLOSED_EXIT)

    def end(self, message: dict[str, Any], status: int) -> None:
        """Send the last message and end the process at once, whatever thread calls."""
        line = self.encode(message, "the message")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self._lock.acquire()  # held until the end: no line after this one
        self._write(line)
        os._exit(status)


class _Api:
    """The functions the script sees, over one channel."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._context = _Context(_Position(""))

    def agent(
        self,
        prompt: str,
        *,
        type: str | None = None,
        schema: dict[str, Any] | None = None,
        write_paths: Iterable[str] | None = None,
        label: str | None = None,
        phase: str | None = None,
        model: str | None = None,
    ) -> Any:
        """Run one subagent; its final text, or with `schema` its checked object. Raises
        `AgentFailed` when it fails."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise TypeError("agent() needs a prompt: a non-empty string")
        for name, value in (("type", type), ("label", label), ("phase", phase), ("model", model)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"agent()'s {name} must be a string or None")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError("agent()'s schema must be a dict (a JSON schema) or None")
        paths = None if write_paths is None else list(write_paths)
        if paths is not None and not all(isinstance(p, str) for p in paths):
            raise TypeError("agent()'s write_paths must be a list of strings or None")
        context = self._context
        request = {
            "op": "agent",
            "key": context.position.take(),
            "prompt": prompt,
            "type": type,
            "schema": schema,
            "write_paths": paths,
            "label": label,
            "phase": context.phase if phase is None else phase,
            "model": model,
        }
        answer = self._channel.ask(request, "agent()'s request")
        if answer.get("ok"):
            return answer.get("value")
        raise AgentFailed(str(answer.get("reason") or "the agent failed"))

    def parallel(self, thunks: Iterable[Callable[[], Any]]) -> list[Any]:
        """Call each thunk at once, in threads; their results in input order, a failed
        agent's `AgentFailed` as its result. Another exception is raised once all ended."""
        work = list(thunks)
        if not all(callable(thunk) for thunk in work):
            raise TypeError("parallel() takes a list of functions without arguments")
        prefix, phase = self._context.position.take(), self._context.phase
        results: list[Any] = [None] * len(work)
        errors: list[BaseException | None] = [None] * len(work)

        def run(i: int) -> None:
            try:
                results[i] = self._within(f"{prefix}.{i}", phase, work[i])
            except AgentFailed as failed:
                results[i] = failed
            except BaseException as exc:
                errors[i] = exc

        _fan_out(len(work), run)
        _raise_first(errors)
        return results

    def pipeline(self, items: Iterable[Any], *stages: Callable[[Any], Any]) -> list[Any]:
        """Each item through every stage in turn, the items at once: an item goes on to its
        next stage as soon as its last one is done. Each item's last result, in input
        order; an item whose stage failed (raised or returned `AgentFailed`) stops there
        with it."""
        work = list(items)
        if not all(callable(stage) for stage in stages):
            raise TypeError("pipeline() takes the items, then functions of one argument")
        prefix, phase = self._context.position.take(), self._context.phase
        results: list[Any] = list(work)
        errors: list[BaseException | None] = [None] * len(work)

        def run(i: int) -> None:
            for s, stage in enumerate(stages):
                try:
                    results[i] = self._within(f"{prefix}.{i}.{s}", phase, stage, results[i])
                except AgentFailed as failed:
                    results[i] = failed
                except BaseException as exc:
                    errors[i] = exc
                    return
                if isinstance(results[i], AgentFailed):
                    return

        _fan_out(len(work), run)
        _raise_first(errors)
        return results

    def _within(self, prefix: str, phase: str | None, body: Callable[..., Any], *args: Any) -> Any:
        """`body(*args)` in the context `prefix` (its own numbering, starting in `phase`),
        then back to the thread's own context (the calling thread runs thunks too)."""
        context = self._context
        saved = context.position, context.phase
        context.position, context.phase = _Position(prefix), phase
        try:
            return body(*args)
        finally:
            context.position, context.phase = saved

    def phase(self, title: str) -> None:
        """Start a phase: the calling context's agents belong to it from now on."""
        if not isinstance(title, str):
            raise TypeError("phase() takes a string")
        self._context.phase = title
        self._channel.send(self._channel.encode({"op": "phase", "title": title}, "the title"))

    def log(self, text: object) -> None:
        """A line for the user, in the workflow's progress."""
        message = {"op": "log", "text": str(text)}
        self._channel.send(self._channel.encode(message, "log()'s text"))

    def finish(self, value: Any = None) -> None:
        """The workflow's result; ends the script at once, from any thread."""
        try:
            self._channel.encode({"op": "finish", "value": value}, "finish()'s value")
        except TypeError as exc:
            raise TypeError(f"finish() needs a JSON-serialisable value: {exc}") from None
        self._channel.end({"op": "finish", "value": value}, 0)


def _fan_out(count: int, body: Callable[[int], None]) -> None:
    """`body(i)` for each i < count, at once: in up to `_MAX_THREADS` threads, the calling
    one among them (so a thread that cannot be started only slows the work down)."""
    lock = threading.Lock()
    indices = iter(range(count))

    def worker() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            body(i)

    threads = []
    for _ in range(min(count, _MAX_THREADS) - 1):
        thread = threading.Thread(target=worker, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no more threads: the ones started (and this one) do it
            break
        threads.append(thread)
    worker()
    for thread in threads:
        thread.join()


def _raise_first(errors: list[BaseException | None]) -> None:
    """Raise the first error in input order, if any (after every thunk ended)."""
    raised = next((error for error in errors if error is not None), None)
    if raised is not None:
        raise raised


def _protocol_fds() -> tuple[int, int]:
    """The connection's two descriptors, off fd 0 and 1 and not inherited. Without
    `WARREN_PIPE_FDS` (run by hand), they are fd 0 and 1, moved away; print() then goes
    to stderr."""
    named = os.environ.pop("WARREN_PIPE_FDS", None)
    if named:
        fd_in, fd_out = (int(part) for part in named.split(","))
    else:
        fd_in, fd_out = os.dup(0), os.dup(1)
        os.dup2(2, 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    for fd in (fd_in, fd_out):
        os.set_inheritable(fd, False)
    return fd_in, fd_out


def _undumpable() -> None:
    """PR_SET_DUMPABLE 0: no other process of the sandbox may open this one's /proc entries,
    take its descriptors or read its memory (see the module docstring)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _traceback(error: BaseException) -> str:
    """The script's traceback, without this file's frames."""
    report = traceback.TracebackException.from_exception(error)
    seen: set[int] = set()
    pending = [report]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        frames = [frame for frame in current.stack if frame.filename != __file__]
        current.stack = traceback.StackSummary.from_list(frames)
        pending += [link for link in (current.__cause__, current.__context__) if link]
    return "".join(report.format())


def _run(channel: _Channel, init: dict[str, Any]) -> None:
    """Run the script; its end (finish, return, exception) is the process's end."""
    source = init["source"]
    linecache.cache[SCRIPT_NAME] = (len(source), None, source.splitlines(True), SCRIPT_NAME)
    api = _Api(channel)
    scope: dict[str, Any] = {
        "__name__": "__main__",
        "agent": api.agent,
        "parallel": api.parallel,
        "pipeline": api.pipeline,
        "phase": api.phase,
        "log": api.log,
        "finish": api.finish,
        "args": init.get("args"),
        "AgentFailed": AgentFailed,
    }
    try:
        exec(compile(source, SCRIPT_NAME, "exec", dont_inherit=True), scope)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            channel.end({"op": "error", "error": f"the script called sys.exit({exc.code!r})"}, 1)
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            scope.clear()  # what the script held, freed for the traceback's sake
        try:
            text = _traceback(exc)
        except MemoryError:
            text = f"{type(exc).__name__}: {exc}\n"
        room = channel.max_line // 8  # JSON escapes may grow it
        if len(text) > room:
            text = "[...]\n" + text[-room:]
        channel.end({"op": "error", "error": text}, 1)
    channel.end({"op": "finish", "value": None}, 0)


def main() -> None:
    fd_in, fd_out = _protocol_fds()
    _undumpable()
    threading.stack_size(_STACK_BYTES)
    channel = _Channel(fd_in, fd_out)
    init = json.loads(channel.read_line())
    channel.max_line = int(init["max_line"])
    threading.Thread(target=channel.answers, daemon=True).start()
    _run(channel, init)


if __name__ == "__main__":
    main()
