"""The direct connection (workers/remote/channel.py) over real sockets, no cluster: only
the holder of a start's token gets the connection whose bytes the coordinator reads; another
process on this machine that connects, with a wrong token or a used one, is closed unanswered
and its forged lines go nowhere; an actor checks the coordinator's proof; the actor's side
(`workers.remote.actor._Relay`, driven here as `NodeWorker` drives it) hands the socket to a
real sandboxed worker and relays none of its bytes."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import trio

from sandbox.spec import SandboxSpec
from tests.kit.floor import needs_sandbox
from workers.remote.actor import _Relay
from workers.remote.channel import (
    TOKEN_BYTES,
    ChannelOffer,
    connect,
    facing_address,
    receive_exactly,
)

FORGED = (
    b'{"type":"model_request","id":"m1","agent":"a1","system":[],"messages":[],'
    b'"tools":[],"max_tokens":1}\n'
)

ATTACKER = """
import socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
sock.sendall(bytes.fromhex(sys.argv[2]) + sys.stdin.buffer.read())
answer = b""
try:
    while chunk := sock.recv(4096):
        answer += chunk
except ConnectionResetError:  # closed with the forged lines unread
    pass
print(answer.hex())
"""


async def attack(port: int, token: bytes, lines: bytes) -> bytes:
    """Another process on this machine: connects, sends `token` and `lines`, returns what it
    was answered before the connection closed."""
    done = await trio.run_process(
        [sys.executable, "-c", ATTACKER, str(port), token.hex()],
        stdin=lines,
        capture_stdout=True,
    )
    return bytes.fromhex(done.stdout.decode().strip())


async def test_only_the_tokens_holder_is_connected_and_forged_lines_go_nowhere() -> None:
    offer = await ChannelOffer.open("127.0.0.1")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(offer.accept)
            wrong = secrets.token_bytes(TOKEN_BYTES)
            assert await attack(offer.port, wrong, FORGED) == b""  # no proof: closed unanswered
            assert await attack(offer.port, b"", FORGED) == b""  # a line instead of a token
            assert offer.stream is None

            actor, how = await connect(offer.for_actor())
            assert how == "direct" and actor is not None
            # Its token again, from another process: closed, the first connection unchanged.
            assert await attack(offer.port, offer.token, FORGED) == b""
            nursery.cancel_scope.cancel()
        assert offer.refused == 3
        coordinator = offer.stream
        assert coordinator is not None
        await actor.send_all(b'{"type":"ready"}\n')
        await actor.aclose()
        received = b""
        while chunk := await coordinator.receive_some():
            received += chunk
        # Only the actor's line: nothing of the attackers' lines.
        assert received == b'{"type":"ready"}\n'
        await coordinator.aclose()
    finally:
        await offer.aclose()
    # Nothing listens once the start is over.
    assert (await connect(offer.for_actor()))[0] is None


async def test_an_actor_relays_over_ray_unless_the_listener_proves_it_is_the_coordinator() -> None:
    """An impostor holding the port answers the token with something else than the proof;
    a port where nobody listens is refused at once. Either way: no connection, and why."""
    offer = await ChannelOffer.open("127.0.0.1")
    impostor = offer.listener
    async with trio.open_nursery() as nursery:

        async def answer_wrongly() -> None:
            async with await impostor.accept() as stream:
                await receive_exactly(stream, TOKEN_BYTES)
                await stream.send_all(secrets.token_bytes(TOKEN_BYTES))
                await stream.receive_some()  # until the actor hangs up

        nursery.start_soon(answer_wrongly)
        stream, why = await connect(offer.for_actor())
    assert stream is None and "did not prove" in why
    await offer.aclose()
    stream, why = await connect(offer.for_actor())
    assert stream is None and "cannot connect" in why


def test_the_listener_faces_the_cluster_and_ray_client_gets_none() -> None:
    assert facing_address("127.0.0.1:6379") == "127.0.0.1"
    assert facing_address("ray://10.0.0.7:10001") is None
    assert facing_address("no-such-host.invalid:6379") is None
    route = subprocess.run(
        ["ip", "-o", "route", "get", "192.0.2.1"], capture_output=True, text=True, check=False
    )
    if route.returncode == 0 and " src " in route.stdout:  # a machine with a default route
        assert facing_address("192.0.2.1:6379") == route.stdout.split(" src ")[1].split()[0]


ECHO = """
import os, sys
fd_in, fd_out = (int(fd) for fd in os.environ["WARREN_PIPE_FDS"].split(","))
os.set_blocking(fd_in, True)  # the node made the connection non-blocking
print("echo worker up", file=sys.stderr, flush=True)
with os.fdopen(fd_in, "rb", buffering=0) as lines, os.fdopen(fd_out, "wb", buffering=0) as out:
    for line in iter(lines.readline, b""):
        out.write(b"echo " + line)
"""


def socket_holders(inode: int) -> set[int]:
    """Pids of the processes of this machine (those we may look at) holding socket `inode`."""
    holders = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    holders.add(int(pid))
        except OSError:  # gone, or not ours to look at
            continue
    return holders


def tcp_inode(local: tuple[str, int]) -> int:
    """The inode of the IPv4 TCP socket bound to `local` (from /proc/net/tcp)."""
    want = f"{int.from_bytes(bytes(map(int, local[0].split('.'))), 'little'):08X}:{local[1]:04X}"
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        if fields[1] == want:
            return int(fields[9])
    raise AssertionError(f"no TCP socket at {local}")


@needs_sandbox
async def test_the_worker_holds_the_connection_and_the_actor_relays_none_of_it(
    tmp_path: Path,
) -> None:
    """The actor connects, checks the proof and hands the socket to its sandboxed worker: the
    worker's lines reach the coordinator with no byte through the actor, no process but the
    worker holds the node's end (so its end is the coordinator's end of stdout), and stderr
    and the exit status come by the actor's `read`. A worker killed mid-line ends the same way,
    with its signal."""
    spec = SandboxSpec().model_dump(mode="json")
    for kill in (False, True):
        offer = await ChannelOffer.open("127.0.0.1")
        start = {
            "spec": spec,
            "argv": ["python", "-c", ECHO],
            "workspace": str(tmp_path),
            "cwd": str(tmp_path),
            "view": None,
            "channel": offer.for_actor(),
        }
        relay = _Relay()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(offer.accept)
            started = await trio.to_thread.run_sync(relay.call, relay.start, start)
            nursery.cancel_scope.cancel()
        await offer.aclose()
        assert started["ok"] and started["channel"] == "direct", started
        coordinator = offer.stream
        assert coordinator is not None
        await coordinator.send_all(b"one\n")
        assert await receive_exactly(coordinator, 9) == b"echo one\n"
        node_end = tcp_inode(coordinator.socket.getpeername())
        holders = socket_holders(node_end)
        # The worker alone: not the actor (this process), not bwrap, nothing else of ours.
        assert len(holders) == 1 and holders <= _descendants(started["pid"])
        if kill:
            await coordinator.send_all(b"half a li")  # the worker is mid-line
            await trio.to_thread.run_sync(relay.call_sync, relay.kill)
        else:
            await coordinator.send_eof()  # its stdin ends: it exits
        assert await coordinator.receive_some() == b""  # its stdout ended with it
        err = b""
        while True:
            _, more, _, _, code = await trio.to_thread.run_sync(relay.call, relay.read, 65536)
            err += more
            if code is not None:
                break
        assert code == (128 + signal.SIGKILL if kill else 0)  # bwrap reports the signal
        assert b"echo worker up" in err
        assert relay.relayed == 0
        await trio.to_thread.run_sync(relay.call, relay.stop, 5.0)
        await coordinator.aclose()


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if task.exists() else []
            found |= {int(c) for c in children}
            todo += [int(c) for c in children]
    return found
