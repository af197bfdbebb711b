"""The zygote fork protocol's asking end (`sandbox.process.zygote`) against a scripted zygote
on a real SOCK_SEQPACKET socket: the pipes it hands over reach the new process, the pidfd
that comes back names it, refusals and a wedged zygote are errors, exit records reach their
process (even one read before the answer), and a cancelled request's late answer is never
taken for the next one's. The zygote's own end (namespaces, serving) is attacked by
tests/workers/test_zygote.py and the warm server's template tests."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import trio

from sandbox.process.handover import close_all, pid_of, receive_with_fds, send_with_fds
from sandbox.process.zygote import (
    AsyncZygoteLink,
    Exited,
    Forked,
    ForkRequest,
    Ready,
    Refused,
    ZygoteLink,
    parse,
)

REQUEST = ForkRequest(argv=("--role", "read_only"), limits={"processes": 64}, tmp_bytes=1 << 20)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("message", "fds", "expected"),
    [
        ({"ready": True}, 0, Ready()),
        ({"failed": "no user namespaces"}, 0, Refused("no user namespaces")),
        ({"exited": 12, "status": -9}, 0, Exited(12, -9)),
        ({"exited": 12, "status": 0}, 1, Exited(12, 0)),  # a stray descriptor is closed
    ],
)
def test_parse(message: dict[str, object], fds: int, expected: object) -> None:
    made = [os.open("/dev/null", os.O_RDONLY) for _ in range(fds)]
    assert parse(json.dumps(message).encode(), made) == expected
    assert not any(_is_open(fd) for fd in made)


def test_parse_an_answer() -> None:
    pidfd = os.open("/dev/null", os.O_RDONLY)
    assert parse(b'{"pid": 5}', [pidfd]) == Forked(5, pidfd)
    os.close(pidfd)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]
    assert isinstance(parse(b'{"pid": 5}', fds), Refused)  # a pid needs exactly its pidfd
    assert not any(_is_open(fd) for fd in fds)


@pytest.mark.parametrize("data", [b"not json", b"[1]", b'{"what": 1}', b'{"exited": 1}'])
def test_parse_refuses_what_is_no_message(data: bytes) -> None:
    fd = os.open("/dev/null", os.O_RDONLY)
    with pytest.raises(ValueError, match="not a zygote message"):
        parse(data, [fd])
    assert not _is_open(fd)


def test_a_request_survives_the_wire() -> None:
    read_only = ForkRequest(argv=("a",), read_only=("/ws",))
    for request in (REQUEST, read_only):
        assert ForkRequest.decode(request.encode()) == request
    with pytest.raises(ValueError):
        ForkRequest.decode(b'{"limits": {}}')


class Zygote:
    """A scripted zygote on the other end of the socket: each request's descriptors start
    `cat` (its stdin, stdout, stderr), answered by `answer(request, cat)`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.started: list[subprocess.Popen[bytes]] = []

    def say(self, message: dict[str, object], fds: list[int] | None = None) -> None:
        send_with_fds(self.sock, json.dumps(message).encode(), fds or [])

    def take_request(self) -> tuple[ForkRequest, subprocess.Popen[bytes]]:
        data, fds = receive_with_fds(self.sock, max_fds=3)
        request = ForkRequest.decode(data)
        cat = subprocess.Popen(["cat"], stdin=fds[0], stdout=fds[1], stderr=fds[2])
        close_all(fds)
        self.started.append(cat)
        return request, cat

    def answer(self, cat: subprocess.Popen[bytes], pid: int | None = None) -> None:
        pidfd = os.pidfd_open(cat.pid)
        self.say({"pid": cat.pid if pid is None else pid}, [pidfd])
        os.close(pidfd)

    def stop(self) -> None:
        for cat in self.started:
            cat.kill()
            cat.wait()


@contextmanager
def zygote(script: Callable[[Zygote], None]) -> Iterator[socket.socket]:
    """Our end of a socket whose other end runs `script` in a thread."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    peer = Zygote(theirs)
    thread = threading.Thread(target=script, args=(peer,), daemon=True)
    thread.start()
    try:
        yield ours
    finally:
        thread.join(30)
        peer.stop()
        theirs.close()
        ours.close()


def _talk(stdin: int, stdout: int) -> bytes:
    """Write through the new process's input (`cat`) and read what comes out of its output."""
    os.write(stdin, b"through the pipes")
    os.close(stdin)
    with os.fdopen(stdout, "rb") as out:
        return out.read()


def test_the_blocking_link_forks_through_a_zygote() -> None:
    def script(z: Zygote) -> None:
        z.say({"ready": True})
        request, cat = z.take_request()
        assert request == REQUEST
        z.say({"exited": 999, "status": 0})  # another process's record: dropped
        z.answer(cat, pid=42)
        z.take_request()
        z.say({"failed": "out of processes"})
        z.take_request()  # and never answered: the asker gives up

    with zygote(script) as sock:
        link = ZygoteLink(sock)
        while not link.ready:
            assert select.select([link.fileno()], [], [], 30)[0], "no Ready"
            link.read_waiting()
        forked = link.fork(REQUEST, timeout_s=30)
        assert forked.zygote_pid == 42
        assert forked.pid == pid_of(forked.pidfd)
        os.close(forked.pidfd)
        os.close(forked.stderr)
        assert _talk(forked.stdin, forked.stdout) == b"through the pipes"
        with pytest.raises(OSError, match="out of processes"):
            link.fork(REQUEST, timeout_s=30)
        with pytest.raises(TimeoutError):
            link.fork(REQUEST, timeout_s=0.2)
        assert not link.gone


def test_the_blocking_link_sees_the_zygote_go() -> None:
    def script(z: Zygote) -> None:
        z.say({"ready": True})
        z.sock.shutdown(socket.SHUT_RDWR)

    with zygote(script) as sock:
        link = ZygoteLink(sock)
        while not link.gone:
            select.select([sock], [], [], 30)
            link.read_waiting()
        assert link.fileno() == -1
        with pytest.raises(OSError):
            link.fork(REQUEST, timeout_s=1)


async def _read_until_gone(link: AsyncZygoteLink, done: trio.Event) -> None:
    await link.read()
    done.set()


async def test_an_exit_record_read_before_the_answer_reaches_its_process() -> None:
    def script(z: Zygote) -> None:
        z.say({"ready": True})
        _, cat = z.take_request()
        z.say({"exited": 7, "status": 3})
        z.answer(cat, pid=7)

    with zygote(script) as sock:
        link = AsyncZygoteLink(trio.socket.from_stdlib_socket(sock))
        with trio.fail_after(30):
            assert await link.hello()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_until_gone, link, trio.Event())
                statuses: list[int] = []
                forked = await link.fork(REQUEST, statuses.append)
                nursery.cancel_scope.cancel()
        assert statuses == [3]
        os.close(forked.pidfd)
        os.close(forked.stderr)
        assert _talk(forked.stdin, forked.stdout) == b"through the pipes"


async def test_a_cancelled_requests_answer_is_not_taken_for_the_next() -> None:
    answer_late = threading.Event()

    def script(z: Zygote) -> None:
        z.say({"ready": True})
        _, first = z.take_request()
        answer_late.wait(30)
        z.answer(first, pid=1)
        _, second = z.take_request()
        z.answer(second, pid=2)

    with zygote(script) as sock:
        link = AsyncZygoteLink(trio.socket.from_stdlib_socket(sock))
        with trio.fail_after(30):
            assert await link.hello()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_until_gone, link, trio.Event())
                with trio.move_on_after(0.2) as waited:
                    await link.fork(REQUEST, lambda status: None)
                assert waited.cancelled_caught
                answer_late.set()
                forked = await link.fork(REQUEST, lambda status: None)
                nursery.cancel_scope.cancel()
    assert forked.zygote_pid == 2
    for fd in forked.descriptors():
        os.close(fd)


async def test_a_zygote_that_goes_takes_its_processes_along() -> None:
    def script(z: Zygote) -> None:
        z.say({"ready": True})
        _, cat = z.take_request()
        z.answer(cat, pid=5)
        z.sock.shutdown(socket.SHUT_RDWR)

    with zygote(script) as sock:
        link = AsyncZygoteLink(trio.socket.from_stdlib_socket(sock))
        done = trio.Event()
        statuses: list[int] = []
        with trio.fail_after(30):
            assert await link.hello()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_until_gone, link, done)
                forked = await link.fork(REQUEST, statuses.append)
                await done.wait()
                assert not link.alive
                with pytest.raises(OSError):
                    await link.fork(REQUEST, statuses.append)
    assert statuses == [-signal.SIGKILL]
    for fd in forked.descriptors():
        os.close(fd)
