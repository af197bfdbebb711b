"""Descriptor hand-over (`sandbox.process.handover`): descriptors travel over a Unix socket,
sync and on trio, and every end of a child's pipes is closed exactly when it should be."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess

import pytest
import trio

from sandbox.process.handover import (
    StdioPipes,
    handing_over,
    pid_of,
    receive_with_fds,
    receive_with_fds_async,
    send_with_fds,
    send_with_fds_async,
)


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        return False
    return True


def test_a_pipe_end_sent_over_a_socket_writes_into_the_same_pipe() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe()
    with ours, theirs:
        send_with_fds(ours, b"take this", [write_end])
        os.close(write_end)
        data, fds = receive_with_fds(theirs, max_fds=2)
    assert data == b"take this" and len(fds) == 1
    os.write(fds[0], b"through")
    os.close(fds[0])
    assert os.read(read_end, 100) == b"through"
    assert os.read(read_end, 100) == b""  # both write ends closed: nothing leaked
    os.close(read_end)


async def test_the_same_on_trio_sockets() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours, theirs = trio.socket.from_stdlib_socket(a), trio.socket.from_stdlib_socket(b)
    read_end, write_end = os.pipe()
    with ours, theirs:
        await send_with_fds_async(ours, b"m", [write_end, write_end])
        os.close(write_end)
        data, fds = await receive_with_fds_async(theirs, max_fds=2)
    assert data == b"m" and len(fds) == 2
    for fd in fds:
        os.close(fd)
    assert os.read(read_end, 1) == b""
    os.close(read_end)


def test_the_pipes_connect_our_ends_to_the_childs() -> None:
    pipes = StdioPipes.open(stderr=True)
    try:
        os.write(pipes.ours_in, b"in")
        assert os.read(pipes.child_in, 2) == b"in"
        os.write(pipes.child_out, b"out")
        assert os.read(pipes.ours_out, 3) == b"out"
        os.write(pipes.child_err, b"err")
        assert os.read(pipes.ours_err, 3) == b"err"
        assert pipes.named() == f"{pipes.child_in},{pipes.child_out}"
    finally:
        pipes.close()


def test_handing_over_closes_the_childs_ends_and_keeps_ours() -> None:
    pipes = StdioPipes.open(stderr=False)
    child_ends, ours = pipes.child_ends(), pipes.ours()
    extra, _ = os.pipe()
    with handing_over(pipes) as also:
        also.append(extra)
        subprocess.run(["true"], pass_fds=child_ends, check=True)
    assert not any(_is_open(fd) for fd in (*child_ends, extra))
    assert all(_is_open(fd) for fd in ours)
    pipes.close()
    assert not any(_is_open(fd) for fd in ours)


def test_handing_over_closes_ours_too_when_the_start_fails() -> None:
    pipes = StdioPipes.open(stderr=True)
    every = [*pipes.child_ends(), *pipes.ours()]
    with pytest.raises(FileNotFoundError), handing_over(pipes):
        subprocess.run(["/no/such/program"], pass_fds=pipes.child_ends())
    assert not any(_is_open(fd) for fd in every)


def test_pid_of_a_pidfd() -> None:
    process = subprocess.Popen(["sleep", "1000"])
    pidfd = os.pidfd_open(process.pid)
    try:
        assert pid_of(pidfd) == process.pid
    finally:
        process.kill()
        process.wait()
        os.close(pidfd)
