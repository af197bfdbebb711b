"""Handing descriptors to another process: to a child we start (`handing_over`: the child's
ends closed here once it has them), over a Unix socket (`send_with_fds`,
`receive_with_fds`: SCM_RIGHTS), and the pipes a sandboxed process speaks its protocol on,
named in its environment (`PIPE_FDS_ENV`, `StdioPipes`).

Every descriptor has one owner at a time, and each function here says who owns what when it
returns or raises: a descriptor sent or passed is closed on our side by whoever the docstring
names, never left to the garbage collector (a leaked write end keeps a reader from ever seeing
end of file).

Used by the sandbox runner and the spares (bwrap's pipes and seccomp program), the zygote
fork protocol (`sandbox.process.zygote`: a worker's pipes out, its pidfd back) and the worker
entry point (`workers.entry`, which finds its pipes by `PIPE_FDS_ENV`). Standard library only,
and nothing heavy at import: a worker and the zygote import it on their way to `Ready`,
before `workers.lean` defers what they never use.
"""

from __future__ import annotations

import array
import contextlib
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio

__all__ = [
    "PIPE_FDS_ENV",
    "StdioPipes",
    "close_all",
    "handing_over",
    "pid_of",
    "receive_with_fds",
    "receive_with_fds_async",
    "received_fds",
    "rights",
    "send_with_fds",
    "send_with_fds_async",
]

PIPE_FDS_ENV = "WARREN_PIPE_FDS"
"""Names, inside a sandbox opened with private pipes, the descriptors of its stdin and stdout
pipes: `"<in>,<out>"` (`sandbox.run.open_sandboxed_process(private_pipes=True)`)."""

_INT = array.array("i")


def close_all(fds: Iterable[int]) -> None:
    """Close each of `fds` that is open (negative numbers stand for none), ignoring errors."""
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def rights(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """The ancillary data that sends `fds` with a message (`socket.sendmsg`)."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def received_fds(ancillary: Iterable[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors that came with a message (`socket.recvmsg`'s ancillary data); each is
    now the caller's to close."""
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def _room(max_fds: int) -> int:
    return socket.CMSG_SPACE(max_fds * _INT.itemsize)


def send_with_fds(sock: socket.socket, data: bytes, fds: Sequence[int]) -> None:
    """Send one message (a datagram or seqpacket socket) with `fds`; they stay ours to close.

    **Errors:** `OSError` from the socket (`TimeoutError` on a socket with a timeout)."""
    sock.sendmsg([data], rights(fds) if fds else [])


def receive_with_fds(
    sock: socket.socket, *, max_fds: int, size: int = 65_536
) -> tuple[bytes, list[int]]:
    """One message (empty at the end of the stream) and the descriptors that came with it,
    now the caller's.

    **Errors:** `OSError` from the socket (`BlockingIOError` on a non-blocking one with
    nothing to read)."""
    data, ancillary, _, _ = sock.recvmsg(size, _room(max_fds))
    return data, received_fds(ancillary)


async def send_with_fds_async(
    sock: trio.socket.SocketType, data: bytes, fds: Sequence[int]
) -> None:
    """`send_with_fds` on a trio socket.

    **Cancellation:** as `trio.socket.SocketType.sendmsg`: nothing was sent.
    **Errors:** `OSError` from the socket."""
    await sock.sendmsg([data], rights(fds) if fds else [])


async def receive_with_fds_async(
    sock: trio.socket.SocketType, *, max_fds: int, size: int = 65_536
) -> tuple[bytes, list[int]]:
    """`receive_with_fds` on a trio socket.

    **Cancellation:** as `trio.socket.SocketType.recvmsg`: nothing was received.
    **Errors:** `OSError` from the socket."""
    data, ancillary, _, _ = await sock.recvmsg(size, _room(max_fds))
    return data, received_fds(ancillary)


def pid_of(pidfd: int) -> int:
    """The pid of a pidfd's process in our pid namespace (its fdinfo's `Pid:`).

    **Errors:** `OSError` when it has none (gone, or in no pid namespace of ours)."""
    for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
        if line.startswith("Pid:") and int(line.split()[1]) > 0:
            return int(line.split()[1])
    raise OSError(f"no pid for pidfd {pidfd}")


@dataclass
class StdioPipes:
    """A new process's input, output and (optionally) error pipes, as two sets of ends: the
    child's (`child_in` to read, `child_out` and `child_err` to write), handed to it, and ours
    (`ours_in` to write, `ours_out` and `ours_err` to read). -1 stands for an end there is
    none of. Whoever holds this closes each end once: `close_child_ends` once the child has
    them, `close` for whatever is still open on a failure."""

    child_in: int
    ours_in: int
    child_out: int
    ours_out: int
    child_err: int = -1
    ours_err: int = -1

    @classmethod
    def open(cls, *, stderr: bool) -> StdioPipes:
        """Three new pipes (two without `stderr`). **Errors:** `OSError` (nothing is left
        open)."""
        made: list[int] = []
        try:
            for _ in range(3 if stderr else 2):
                made += os.pipe()
        except BaseException:
            close_all(made)
            raise
        child_in, ours_in, ours_out, child_out = made[:4]
        ours_err, child_err = made[4:] or (-1, -1)
        return cls(child_in, ours_in, child_out, ours_out, child_err, ours_err)

    @classmethod
    def of_socket(cls, socket_fd: int) -> StdioPipes:
        """A connected socket as the child's input and output: two copies of it (each end can
        be closed alone), and nothing on our side. **Errors:** `OSError`."""
        child_in = os.dup(socket_fd)
        try:
            child_out = os.dup(socket_fd)
        except BaseException:
            os.close(child_in)
            raise
        return cls(child_in, -1, child_out, -1)

    def child_ends(self) -> list[int]:
        """The ends to hand over, in order (in, out, and err when there is one)."""
        return [fd for fd in (self.child_in, self.child_out, self.child_err) if fd >= 0]

    def ours(self) -> list[int]:
        """Our ends, in the order of `child_ends`."""
        return [fd for fd in (self.ours_in, self.ours_out, self.ours_err) if fd >= 0]

    def named(self) -> str:
        """The value of `PIPE_FDS_ENV` that names the child's input and output ends."""
        return f"{self.child_in},{self.child_out}"

    def close_child_ends(self) -> None:
        """The child has them (or never will): close our copies."""
        close_all((self.child_in, self.child_out, self.child_err))
        self.child_in = self.child_out = self.child_err = -1

    def give_up_ours(self) -> None:
        """Our ends now belong to someone else (who closes them)."""
        self.ours_in = self.ours_out = self.ours_err = -1

    def close(self) -> None:
        """Close every end still held."""
        self.close_child_ends()
        close_all((self.ours_in, self.ours_out, self.ours_err))
        self.give_up_ours()


@contextlib.contextmanager
def handing_over(pipes: StdioPipes) -> Iterator[list[int]]:
    """Around starting a child with `pipes`: when the block is left the child's ends are
    closed here (it has them, or never will), and ours too when the block raises (there is
    no child to speak to). Descriptors appended to the list it yields, made for the child
    alone (bwrap's seccomp program), are closed with the child's ends."""
    extra: list[int] = []
    try:
        yield extra
    except BaseException:
        pipes.close()
        raise
    finally:
        pipes.close_child_ends()
        close_all(extra)
