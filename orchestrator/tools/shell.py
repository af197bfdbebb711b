"""The persistent bash shell behind the Bash tool, and one-shot runs for read-only calls.

The model works like a person at a terminal (`cd src`, `export X=1`, `source .venv/bin/activate`),
so the working directory, exported variables and functions carry over from one Bash call to
the next. A command may also hang, ignore SIGTERM, print gigabytes, leave background jobs or
kill the shell; none of that may hang the session, exhaust memory or leave processes behind.

How one command runs (`PersistentShell.run`):

* bash runs in its own session with job control on (`set -m`), reading calls of a small driver
  function from its stdin. The driver starts each command as a background job: a subshell that
  leads its own process group, so a timeout can kill the command's whole group while the shell
  lives on. The subshell sources the command from a file, with stdin from /dev/null, and on exit
  writes its state (exported variables, functions, cwd) to a file the shell then loads: that is
  how `cd` and `export` persist although the command ran in a child.
* The driver reports `B <id> <pgid>` once the command started and `E <id> <status> <cwd>` once
  bash has reaped it, on a dedicated pipe (the status fd) that commands never see. Completion is
  that record, never end-of-file on the output, so a background job (`sleep 100 &`) that holds
  the output open does not keep the call alive (tests/orchestrator/test_shell.py).
* stdout and stderr go to two per-command FIFOs, read concurrently into bounded head/tail
  buffers (`OutputCapture`). We hold a write end of each FIFO ourselves, so they never report
  end-of-file; after the end record we drain what is buffered and close them. A background job
  that writes later gets EPIPE: output after the call returns is not shown.
* Timeout or cancellation: SIGTERM to the command's group, `KILL_GRACE_S` for it to go, SIGKILL
  (`sandbox.process.groups`), then wait for the end record. A shell that does not answer (or
  died) is killed with its whole session, and the next call starts a fresh one in the last
  known cwd; the result says that shell state was reset.

`PersistentShell.run_oneshot` runs a command in a fresh bash that first loads the state the
persistent shell had after its last command: concurrently running read-only calls cannot share
one shell, and must not wait for each other.

Nothing a one-shot starts outlives it, not even what left its process group (`setsid`, a
double fork, `nohup`). Where only one-shots run (the read-only tool host and agent worker),
this process is the child subreaper of them all and kills their orphans when a call ends
(`sandbox.process.orphans`). Elsewhere the command runs in a subshell of a bash that is a child
subreaper (prctl PR_SET_CHILD_SUBREAPER, made so by a perl shim or between fork and exec:
`sandbox.process.subreaper`), so every orphan of the command is handed to that bash instead of
escaping to the sandbox's init. When the command ends the outer bash kills whatever it holds,
until nothing is left; on a timeout or cancellation we kill the outer bash's whole subtree
ourselves (`sandbox.process.tree.kill_tree`). (A pid namespace per one-shot would do the same
in the kernel, but the sandbox forbids nested user namespaces, so a process inside it cannot
make one; a cgroup is not available inside either.)
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from orchestrator.errors import ToolError
from orchestrator.text import join_elided, truncate_middle
from sandbox.process.child import KILL_GRACE_S
from sandbox.process.groups import stop_session, terminate_group
from sandbox.process.orphans import Adoption, adoption
from sandbox.process.subreaper import become_subreaper, kills_leftovers, subreaper_shim
from sandbox.process.tree import kill_tree

__all__ = [
    "OutputCapture",
    "PersistentShell",
    "ShellRun",
    "StreamingRun",
    "shell_environment",
]

_END_WAIT_S = 2.0
"""After SIGKILL, how long the shell may take to reap the command before it is replaced."""

_READ_CHUNK = 1 << 16
_EXIT_POLL_S = 0.25
"""How often a background command's reader, waiting for output, looks whether its bash has
exited (a job it left may hold the pipe open)."""
_DRAIN_LIMIT = 1 << 22
"""Bytes read after the end record: more than a pipe holds, so everything the command wrote,
yet bounded so a background job that keeps writing cannot hold the call."""

_STATE_OK = "#warren-state-ok"
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))

_PLAIN_ENV = {
    "GIT_EDITOR": "true",
    "GIT_TERMINAL_PROMPT": "0",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "LESS": "-FRX",
    "TERM": "dumb",
}
"""Nothing may wait for a human: no editor, no pager, no prompt, no terminal features."""

_DROPPED_ENV = (
    "BASH_ENV",  # sourced by every non-interactive bash: would run before each command
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "CDPATH",  # makes `cd dir` print and land somewhere unexpected
    "FORCE_COLOR",
    "CLICOLOR_FORCE",
)

# The driver the persistent shell runs. {sfd} is the status fd, {dir} the private directory of
# per-command files. Names start with __warren_ to stay out of the commands' way.
_DRIVER = r"""
set -m
__warren_sfd={sfd}
__warren_dir={dir}
__warren_save() {{
    set -o posix
    unset -f __warren_run __warren_save
    {{ export -p; declare -f; printf 'cd -- %q 2>/dev/null\n' "$PWD"; echo '{ok}'; }} \
        >"$__warren_base.state" 2>/dev/null
}}
__warren_run() {{
    local __warren_base="$__warren_dir/$1" __warren_pid __warren_status
    local -a __warren_lines __warren_names
    (
        exec {{__warren_sfd}}>&-
        trap __warren_save EXIT
        set --
        unset -v __warren_pid __warren_status __warren_lines __warren_names
        . "$__warren_base.cmd"
    ) </dev/null >"$__warren_base.out" 2>"$__warren_base.err" &
    __warren_pid=$!
    printf 'B\t%s\t%s\0' "$1" "$__warren_pid" >&"$__warren_sfd"
    wait "$__warren_pid"
    __warren_status=$?
    if [[ -f $__warren_base.state ]]; then
        mapfile -t __warren_lines <"$__warren_base.state"
        if [[ ${{__warren_lines[-1]-}} == '{ok}' ]]; then
            compgen -e >"$__warren_base.names"
            mapfile -t __warren_names <"$__warren_base.names"
            unset -v "${{__warren_names[@]}}"
            . "$__warren_base.state"
        fi
    fi
    printf 'E\t%s\t%s\t%s\0' "$1" "$__warren_status" "$PWD" >&"$__warren_sfd"
}}
"""


def shell_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every shell starts with: `base` (default: ours), made non-interactive.

    Variables that would make bash run code before each command or force colour are dropped.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROPPED_ENV}
    env.update(_PLAIN_ENV)
    return env


class OutputCapture:
    """A bounded head and tail of a byte stream, counting what fell out of the middle.

    `text()` equals `truncate_middle(whole_output, limit)` for UTF-8 output, but a command
    printing 50 MB costs us a few times `limit` bytes, not 50 MB: the counts of dropped
    characters and lines let the note say exactly how much is missing.
    """

    def __init__(self, limit: int) -> None:
        """`limit`: characters `text()` keeps."""
        self.limit = limit
        # Four bytes for each character of the larger half, plus one character cut in two.
        self._head_limit = self._tail_limit = 4 * (limit - limit // 2 + 1)
        self._head = bytearray()
        self._tail = bytearray()
        self._newlines = 0
        self._last_byte = b""
        self._dropped_bytes = 0
        self._dropped_chars = 0
        self._dropped_lines = 0

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._newlines += data.count(b"\n")
        self._last_byte = data[-1:]
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        excess = len(self._tail) - self._tail_limit
        if excess > 0:
            dropped = bytes(self._tail[:excess])
            del self._tail[:excess]
            self._dropped_bytes += excess
            self._dropped_lines += dropped.count(b"\n")
            # UTF-8 characters are counted by their lead bytes, so one cut in two is counted once.
            self._dropped_chars += len(dropped.translate(None, _CONTINUATION_BYTES))

    @property
    def line_count(self) -> int:
        """Lines of the whole stream, a last one without a newline included."""
        return self._newlines + (1 if self._last_byte not in (b"", b"\n") else 0)

    def text(self) -> str:
        """The stream decoded, at most `limit` characters plus the note where the middle went."""
        limit = self.limit
        if not self._dropped_bytes:
            return truncate_middle(bytes(self._head + self._tail).decode(errors="replace"), limit)
        head = self._head.decode(errors="replace")
        tail = bytes(self._tail).lstrip(_CONTINUATION_BYTES).decode(errors="replace")
        keep_head = min(len(head), limit // 2)
        keep_tail = min(len(tail), limit - keep_head)
        removed = self._dropped_chars + (len(head) - keep_head) + (len(tail) - keep_tail)
        removed_lines = (
            self._dropped_lines
            + head.count("\n", keep_head)
            + tail.count("\n", 0, len(tail) - keep_tail)
        )
        return join_elided(head[:keep_head], tail[len(tail) - keep_tail :], removed, removed_lines)


@dataclass(frozen=True)
class ShellRun:
    """What one command did, with its output already capped for the model."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The command's status (128+N when killed by signal N); None when the shell died under it."""
    cwd: Path
    """The shell's working directory after the command."""
    timed_out: bool = False
    shell_reset: bool = False
    """The shell died or stopped answering and was replaced: exports and functions are lost."""
    stdout_lines: int = 0
    stderr_lines: int = 0


@dataclass
class _Job:
    """One command in the persistent shell: its files, its FIFOs and what the shell reported."""

    id: str
    dir: Path
    out: OutputCapture
    err: OutputCapture
    fds: list[int] = field(default_factory=list)
    pgid: int | None = None
    status: int | None = None
    cwd: Path | None = None
    shell_gone: bool = False
    restarted: bool = False
    """It ran in a new shell because the old one was found dead."""

    @property
    def ended(self) -> bool:
        return self.status is not None or self.shell_gone

    def path(self, suffix: str) -> Path:
        return self.dir / f"{self.id}.{suffix}"

    def open(self, command: str) -> tuple[int, int]:
        """Write the command file and open both FIFOs; return their read ends (stdout, stderr)."""
        self.path("cmd").write_bytes(_encode(command))
        readers = []
        for suffix in ("out", "err"):
            fifo = self.path(suffix)
            os.mkfifo(fifo, 0o600)
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.fds.append(reader)
            # Our own writer: the FIFO never reports end-of-file, neither before the command
            # opens it nor after background jobs close it. Completion is the end record.
            self.fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
            readers.append(reader)
        return readers[0], readers[1]

    def state(self) -> str | None:
        """The state the command left, if it finished writing it."""
        try:
            text = self.path("state").read_text(errors="surrogateescape")
        except OSError:
            return None
        return text if text.rstrip("\n").endswith(_STATE_OK) else None

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        for suffix in ("cmd", "out", "err", "state", "names"):
            self.path(suffix).unlink(missing_ok=True)


class _StatusChannel:
    """NUL-terminated, tab-separated records from the driver on the status fd."""

    def __init__(self, fd: int) -> None:
        self._stream = trio.lowlevel.FdStream(fd)
        self._buffer = b""

    async def next(self) -> list[str] | None:
        """The next record's fields, or None when the shell is gone."""
        while b"\0" not in self._buffer:
            data = await self._stream.receive_some(4096)
            if not data:
                return None
            self._buffer += data
        record, _, self._buffer = self._buffer.partition(b"\0")
        return record.decode(errors="surrogateescape").split("\t", 3)

    async def aclose(self) -> None:
        await self._stream.aclose()


@dataclass
class _OneShot:
    """A started one-shot bash, and how to stop it."""

    proc: trio.Process
    script: Path
    cwd: Path
    adopted: Adoption | None
    grace: float
    stopped: bool = False

    async def stop(self, *, killed: bool) -> None:
        """Kill what the command left running; with `killed` (a timeout, a cancellation, a
        stop), the command too, with everything it started wherever it went. Shield it.
        Once is enough: a second call without `killed` does nothing."""
        if self.stopped and not killed:
            return
        self.stopped = True
        if killed:
            await kill_tree(self.proc.pid, self.grace)
        # On timeout or cancellation the command itself; otherwise its background jobs.
        await terminate_group(self.proc.pid, self.grace)
        with trio.move_on_after(self.grace):
            await self.proc.wait()
        if self.adopted is not None:  # a bash that would not die is swept with the rest
            self.adopted.ended(self.proc.pid)
            await self.adopted.sweep(self.proc.pid)
        self.script.unlink(missing_ok=True)


class StreamingRun:
    """A command whose output is read as it comes (`PersistentShell.streaming`), then its
    exit code."""

    def __init__(self, started: _OneShot, fd: int) -> None:
        self._started = started
        self._fd = fd
        self.exit_code: int | None = None
        """The command's status once `read` has returned None (128+N: killed by signal N;
        -1: not known)."""

    @property
    def pid(self) -> int:
        """The one-shot bash's pid (it leads its own session)."""
        return self._started.proc.pid

    async def read(self) -> bytes | None:
        """The next bytes the command printed, or None once it has ended and all it printed
        was read. No deadline: the caller's cancel scope stops the wait (and leaving the
        block of `PersistentShell.streaming` kills the command).

        A job the command left in the background does not hold the run open by holding the
        pipe: once the command's bash has exited, what it left running is stopped, what it
        printed is read, and the run ends.
        """
        if self.exit_code is not None:
            return None
        proc = self._started.proc
        while True:
            try:
                data = os.read(self._fd, _READ_CHUNK)
            except BlockingIOError:
                if proc.poll() is not None:
                    await self._started.stop(killed=False)
                    return self._last()
                with trio.move_on_after(_EXIT_POLL_S):
                    await trio.lowlevel.wait_readable(self._fd)
                continue
            if data:
                if not self._started.stopped and proc.poll() is not None:
                    await self._started.stop(killed=False)  # its jobs printing on
                return data
            with trio.move_on_after(self._started.grace):  # end of output: the bash is ending
                await proc.wait()
            await self._started.stop(killed=False)
            return self._last()

    def _last(self) -> bytes | None:
        """What is still buffered (up to `_DRAIN_LIMIT` bytes), and the status set."""
        code = self._started.proc.returncode
        self.exit_code = -1 if code is None else (128 - code if code < 0 else code)
        capture = _Bytes()
        _drain(self._fd, capture)
        return capture.data or None


class _Bytes:
    """What `_drain` feeds, kept whole (`_drain` is bounded)."""

    def __init__(self) -> None:
        self.data = b""

    def feed(self, data: bytes) -> None:
        self.data += data

class PersistentShell:
    """One bash per session whose cwd, exported variables and functions persist across calls.

    Created cheaply (nothing starts until the first `run`); a session-scoped resource closed by
    `aclose`. Not for concurrent use: `run` calls are serialised; concurrent read-only calls use
    `run_oneshot`.
    """

    def __init__(
        self,
        *,
        cwd: Path,
        env: Mapping[str, str],
        output_limit: int,
        kill_grace_s: float = KILL_GRACE_S,
    ) -> None:
        """`output_limit`: characters kept of each of stdout and stderr (head and tail)."""
        self._initial_cwd = cwd
        self._cwd = cwd
        self._env = dict(env)
        self._limit = output_limit
        self._grace = kill_grace_s
        self._lock = trio.Lock()
        self._dir: Path | None = None
        self._proc: trio.Process | None = None
        self._stdin: trio.abc.SendStream | None = None
        self._status: _StatusChannel | None = None
        self._snapshot = ""
        """The state script of the last completed command: what one-shot runs start from."""
        self._git_lines: str | None = None
        self._counter = 0
        self._closed = False
        self._shim: list[str] | None = None
        """The one-shots' subreaper shim, looked up at the first one-shot (`subreaper_shim`)."""

    @property
    def cwd(self) -> Path:
        """The shell's working directory after the last command (or where it will start)."""
        return self._cwd

    @property
    def snapshot(self) -> str:
        """A bash script recreating the exported variables, functions and cwd the shell had
        after its last completed command: what one-shot runs start from ("" before any)."""
        return self._snapshot

    def adopt_state(self, *, cwd: Path, snapshot: str) -> None:
        """Make later one-shot runs start from another shell's `cwd` and `snapshot`.

        For a shell used only for one-shot runs (a read-only host following the read-write
        host's shell); a running persistent bash keeps its own state.
        """
        self._cwd = cwd
        self._snapshot = snapshot

    @property
    def pid(self) -> int | None:
        """The running bash's pid (it leads its own session), if it has started."""
        return None if self._proc is None else self._proc.pid

    async def syntax_error(self, command: str) -> str | None:
        """bash's own parser on `command` (`bash -n`, nothing runs): its complaint, or None.

        **Errors:** `ToolError` if bash cannot be started.
        """
        try:
            result = await trio.run_process(
                ["bash", "--noprofile", "--norc", "-n"],
                stdin=_encode(command),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=self._env,
            )
        except OSError as exc:
            raise ToolError(f"Could not start bash: {exc}") from exc
        if result.returncode == 0:
            return None
        message = result.stderr.decode(errors="replace").strip()
        return message.replace("bash: ", "", 1) or f"bash -n exited with {result.returncode}"

    async def run(self, command: str, *, timeout_s: float) -> ShellRun:
        """Run `command` in the persistent shell; its cwd and exports carry over to the next.

        **Cancellation:** the command's process group is killed (SIGTERM, then SIGKILL after
        the grace period) before `Cancelled` propagates; the shell is left usable or replaced.

        **Errors:** `ToolError` if bash cannot be started.
        """
        async with self._lock:
            self._check_open()
            await self._ensure_started()
            self._counter += 1
            job = _Job(
                id=str(self._counter),
                dir=self._workdir(),
                out=self._capture(),
                err=self._capture(),
            )
            try:
                return await self._run_job(job, command, timeout_s)
            finally:
                job.close()

    async def set_cwd(self, path: Path) -> ShellRun:
        """Move the shell to `path` (used to pull it back into the workspace)."""
        return await self.run(f"cd -- {shlex.quote(str(path))}", timeout_s=10.0)

    async def run_oneshot(self, command: str, *, timeout_s: float) -> ShellRun:
        """Run `command` in a new bash from the persistent shell's cwd and state; nothing persists.

        Any number may run at once, alongside each other (not alongside `run`: the caller runs
        only read-only commands this way). The whole process group is killed at the end, so
        background jobs do not outlive the call.

        **Cancellation:** as `run`.
        """
        out, err = self._capture(), self._capture()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started = await self._start_oneshot(command, (out_r, out_w), (err_r, err_w))
        proc = started.proc
        finished = False
        try:
            with trio.move_on_after(timeout_s) as deadline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, out_r, out)
                    nursery.start_soon(_pump, err_r, err)
                    await proc.wait()
                    nursery.cancel_scope.cancel()
            finished = True
        finally:
            with trio.CancelScope(shield=True):
                await started.stop(killed=not finished or deadline.cancelled_caught)
                if finished:
                    _drain(out_r, out)
                    _drain(err_r, err)
                os.close(out_r)
                os.close(err_r)
        code = proc.returncode
        return self._result(
            out,
            err,
            exit_code=None if code is None else (128 - code if code < 0 else code),
            cwd=started.cwd,
            timed_out=deadline.cancelled_caught,
        )

    @asynccontextmanager
    async def streaming(self, command: str) -> AsyncIterator[StreamingRun]:
        """Run `command` as `run_oneshot` does, its stdout and stderr together on one pipe
        that the caller reads as it comes (`StreamingRun.read`): a background command.

        Leaving the block before the command ended kills it with everything it started
        (shielded, bounded by about twice the grace period); after it ended, what it left
        running.

        **Errors:** `ToolError` when bash cannot be started.
        """
        read_end, write_end = os.pipe()
        started = await self._start_oneshot(command, (read_end, write_end), None)
        run = StreamingRun(started, read_end)
        try:
            yield run
        finally:
            with trio.CancelScope(shield=True):
                await started.stop(killed=run.exit_code is None)
                os.close(read_end)

    async def _start_oneshot(
        self, command: str, out: tuple[int, int], err: tuple[int, int] | None
    ) -> _OneShot:
        """A one-shot bash started on the pipes `out` and `err` (each its read end and write
        end; `err` None: stderr goes to `out` too). The write ends are closed here, the read
        ends made non-blocking, and closed too when bash cannot start.

        **Errors:** `ToolError` when the shell is closed or bash cannot be started.
        """
        pipes = [out] if err is None else [out, err]
        for read_end, _ in pipes:
            os.set_blocking(read_end, False)  # readers must never block the event loop
        script: Path | None = None
        try:
            self._check_open()
            script = self._oneshot_script(command)
            cwd = self._cwd if self._cwd.is_dir() else self._initial_cwd
            adopted = adoption()
            bash = ["bash", "--noprofile", "--norc"]
            preexec: Callable[[], None] | None = None
            if adopted is not None:  # we are the subreaper: a plain bash (sandbox.process.orphans)
                argv = [*bash, str(script)]
            else:
                if self._shim is None:
                    self._shim = subreaper_shim()
                argv = [*self._shim, *bash, "-c", _ONESHOT_REAPER, "warren-oneshot", str(script)]
                # Without the shim, the prctl runs between fork and exec; a `preexec_fn` makes
                # Python fork instead of vfork, which costs ~13 ms a call in a tool host
                # (tests/bench/bench_vs_parent.py, Bash read-only).
                preexec = None if self._shim else become_subreaper
            with adopted.starting() if adopted is not None else contextlib.nullcontext():
                proc = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out[1],
                    stderr=out[1] if err is None else err[1],
                    cwd=cwd,
                    env=self._env,
                    start_new_session=True,
                    preexec_fn=preexec,
                )
                if adopted is not None:
                    adopted.started(proc.pid)
        except BaseException as exc:
            for read_end, _ in pipes:
                os.close(read_end)
            if script is not None:
                script.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ToolError(f"Could not start bash: {exc}") from exc
            raise
        finally:
            for _, write_end in pipes:
                os.close(write_end)
        return _OneShot(proc, script, cwd, adopted, self._grace)

    async def aclose(self) -> None:
        """Kill the shell, every process still in its session, and remove its files.

        Shielded and bounded: SIGTERM, `kill_grace_s`, SIGKILL, then at most `kill_grace_s` to reap.
        """
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._kill_session()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ToolError("The shell of this session is closed; no more commands can run.")

    def _capture(self) -> OutputCapture:
        return OutputCapture(self._limit)

    def _oneshot_script(self, command: str) -> Path:
        """A script of the latest state snapshot, then git's code-running settings
        neutralised (whatever the snapshot exported) and `git` guarded (`sandbox.git_safety`:
        a one-shot runs what was approved without asking), then `command`."""
        self._counter += 1
        script = self._workdir() / f"{self._counter}.oneshot"
        script.write_bytes(_encode(f"{self._snapshot}\n{self._git_safety()}\n{command}\n"))
        return script

    def _git_safety(self) -> str:
        """The one-shot's git lines: the environment's overrides and, where there is a git,
        the guard first on PATH (written once per shell)."""
        if self._git_lines is None:
            from sandbox.git_safety import guard_script, shell_exports

            lines = shell_exports()
            real = shutil.which("git", path=self._env.get("PATH"))
            if real is not None:
                guard = self._workdir() / "guard"
                guard.mkdir(exist_ok=True)
                (guard / "git").write_text(guard_script(real))
                (guard / "git").chmod(0o755)
                lines += f"\nexport PATH={shlex.quote(str(guard))}:\"$PATH\""
            self._git_lines = lines
        return self._git_lines

    def _workdir(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="warren-shell-"))
        return self._dir

    def _result(
        self,
        out: OutputCapture,
        err: OutputCapture,
        *,
        exit_code: int | None,
        cwd: Path,
        timed_out: bool = False,
        shell_reset: bool = False,
    ) -> ShellRun:
        return ShellRun(
            stdout=out.text(),
            stderr=err.text(),
            exit_code=exit_code,
            cwd=cwd,
            timed_out=timed_out,
            shell_reset=shell_reset,
            stdout_lines=out.line_count,
            stderr_lines=err.line_count,
        )

    async def _ensure_started(self) -> None:
        if self._proc is not None:
            return
        workdir = self._workdir()
        cwd = self._cwd if self._cwd.is_dir() else self._initial_cwd
        status_r, status_w = os.pipe()
        try:
            proc = await trio.lowlevel.open_process(
                ["bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=cwd,
                env=self._env,
                start_new_session=True,
                pass_fds=(status_w,),
            )
        except OSError as exc:
            os.close(status_r)
            raise ToolError(f"Could not start bash: {exc}") from exc
        finally:
            os.close(status_w)
        assert proc.stdin is not None
        if (adopted := adoption()) is not None:
            adopted.started(proc.pid)
        self._proc, self._stdin, self._status = proc, proc.stdin, _StatusChannel(status_r)
        self._cwd = cwd
        driver = _DRIVER.format(sfd=status_w, dir=shlex.quote(str(workdir)), ok=_STATE_OK)
        await proc.stdin.send_all(driver.encode())

    async def _run_job(self, job: _Job, command: str, timeout_s: float) -> ShellRun:
        out_r, err_r = job.open(command)
        try:
            with trio.move_on_after(timeout_s) as deadline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, out_r, job.out)
                    nursery.start_soon(_pump, err_r, job.err)
                    await self._submit(job)
                    nursery.cancel_scope.cancel()
        finally:
            if not job.ended or job.shell_gone:
                await self._stop(job)
        _drain(out_r, job.out)
        _drain(err_r, job.err)
        if job.cwd is not None:
            self._cwd = job.cwd
            state = job.state()
            if state is not None:
                self._snapshot = state
        return self._result(
            job.out,
            job.err,
            exit_code=job.status,
            cwd=self._cwd,
            timed_out=deadline.cancelled_caught,
            shell_reset=job.status is None or job.restarted,
        )

    async def _submit(self, job: _Job) -> None:
        """Hand `job` to the shell and wait for its end record.

        A shell found dead before it started the command (killed from outside between calls)
        is replaced once, and the command runs in the new one.
        """
        for attempt in (1, 2):
            try:
                assert self._stdin is not None
                await self._stdin.send_all(f"__warren_run {job.id}\n".encode())
            except trio.BrokenResourceError:
                job.shell_gone = True
            else:
                await self._await_end(job)
            if not job.shell_gone or job.pgid is not None or attempt == 2:
                return
            await self._kill_session()
            await self._ensure_started()
            job.shell_gone = False
            job.restarted = True

    async def _read_record(self, job: _Job) -> None:
        if self._status is None:
            job.shell_gone = True
            return
        record = await self._status.next()
        match record:
            case None:
                job.shell_gone = True
            case ["B", job.id, pgid]:
                job.pgid = int(pgid)
            case ["E", job.id, status, cwd]:
                job.status = int(status)
                job.cwd = Path(cwd)
            case _:
                pass  # a record of no interest (cannot happen: one command at a time)

    async def _await_end(self, job: _Job) -> None:
        while not job.ended:
            await self._read_record(job)

    async def _stop(self, job: _Job) -> None:
        """Kill the job's process group and collect its end record; failing that, the shell.

        Shielded and bounded by about twice the grace period.
        """
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self._grace):
                while job.pgid is None and not job.ended:
                    await self._read_record(job)
            if job.pgid is not None and not job.ended:
                await terminate_group(job.pgid, self._grace)
                with trio.move_on_after(_END_WAIT_S):
                    await self._await_end(job)
            if job.status is None:
                await self._kill_session()

    async def _kill_session(self) -> None:
        """Kill the shell and everything in its session (bounded); the next `run` starts afresh."""
        proc, stdin, status = self._proc, self._stdin, self._status
        self._proc = self._stdin = self._status = None
        self._snapshot = ""
        with trio.CancelScope(shield=True):
            if stdin is not None:
                await stdin.aclose()
            if status is not None:
                await status.aclose()
            if proc is None:
                return
            # The shell is not reaped before the end, so its pid (the session id) stays ours.
            await stop_session(proc.pid, self._grace)
            with trio.move_on_after(self._grace):
                await proc.wait()
            if (adopted := adoption()) is not None:
                adopted.ended(proc.pid)


async def _pump(fd: int, capture: OutputCapture) -> None:
    """Read non-blocking `fd` into `capture` until end-of-file; cancelling loses nothing read."""
    while True:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
            continue
        if not data:
            return
        capture.feed(data)
        # A writer faster than us would otherwise never let the deadline or the end record in.
        await trio.lowlevel.checkpoint()


def _encode(command: str) -> bytes:
    """The bytes bash sees; the syntax check and the run use the same ones."""
    return command.encode(errors="replace")


def _drain(fd: int, capture: OutputCapture | _Bytes) -> None:
    """Read what is buffered in `fd` now, without waiting, up to `_DRAIN_LIMIT` bytes."""
    taken = 0
    while taken < _DRAIN_LIMIT:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        if not data:
            return
        capture.feed(data)
        taken += len(data)


_ONESHOT_REAPER = kills_leftovers(
    """
(
    script=$1
    set --
    . "$script"
)
"""
)
"""The outer bash of a one-shot, a child subreaper (see the module docstring): it sources the
command's script (`$1`) in a subshell, then kills whatever the command left running."""
