"""The direct relay's connection (workers/remote/channel.py) over real sockets, no cluster: only
the holder of a start's token gets the connection whose bytes the coordinator reads; another
process on this machine that connects, with a wrong token or a used one, is closed unanswered
and its forged lines go nowhere; an actor checks the coordinator's proof."""

from __future__ import annotations

import secrets
import subprocess
import sys

import trio

from workers.remote.channel import (
    STDOUT,
    TOKEN_BYTES,
    ChannelOffer,
    connect,
    facing_address,
    frame,
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
        await actor.send_all(frame(STDOUT, b'{"type":"ready"}\n'))
        await actor.aclose()
        received = b""
        while chunk := await coordinator.receive_some():
            received += chunk
        # Only the actor's frame: nothing of the attackers' lines.
        assert received == frame(STDOUT, b'{"type":"ready"}\n')
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
