"""A remote worker's protocol over one TCP connection from its node to the coordinator.

Relayed over Ray, every line a worker writes or reads costs an actor call (about 1.4 ms here,
more under load), and a subagent's turn waits on four of them in a row: its model request,
the response, its permission ask, the reply (`tests/bench/bench_ray.py` (b)). So when the
cluster can reach the coordinator, the worker's bytes take a direct connection instead and
Ray keeps placement, start, snapshot sync, usage, the worker's stderr and exit status, kill,
stop and the detection of a lost actor (workers/remote/process.py). The actor makes the
connection and checks it, then hands the socket to the worker as its protocol stdin and
stdout and closes its own copy (workers/remote/actor.py): the bytes do not pass through
the actor.

Who may speak on it (a forged `model_request` would be sent with the user's key):

- the coordinator opens one listener per worker start (`ChannelOffer`), on the address of
  this machine that faces the cluster (`facing_address`), on a port of the system's choice,
  and closes it as soon as that start is over: nothing listens between starts;
- the offer holds two random 32-byte secrets, sent to the actor inside `NodeWorker.start`
  (Ray's own authenticated channel), never in an argv or an environment, never logged:
  the actor's `token` and the coordinator's `proof`;
- a connection must send the token within `HANDSHAKE_TIMEOUT_S`; anything else is closed
  unanswered (`ChannelOffer.refused` counts them). The token is good for one connection;
- the worker gets the socket only after the coordinator answered with the proof (an impostor
  on the port would not get the workspace's contents), and is then its only holder on the
  node; it talks the line protocol it talks on pipes, and can reach nothing new through a
  connection that is already made;
- no worker can connect: every sandbox runs without a network.

Like Ray's own traffic without TLS, the bytes are not encrypted: the cluster's network is
trusted to the same degree (deploy/ray/README.md).

After the handshake the connection carries the worker's protocol as it is: the worker's
stdin from the coordinator, its stdout to the coordinator; its end (every copy closed) is the
end of its stdout.

When the actor cannot connect (no route back: Ray Client from a laptop, a firewall) its start
says so and the worker is relayed over Ray as before: slower, never broken.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

import trio

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HANDSHAKE_TIMEOUT_S",
    "TOKEN_BYTES",
    "ChannelOffer",
    "connect",
    "facing_address",
    "receive_exactly",
]

TOKEN_BYTES = 32
HANDSHAKE_TIMEOUT_S = 5.0
"""Seconds a connection has to present its token before it is closed."""
CONNECT_TIMEOUT_S = 3.0
"""Seconds an actor tries to reach the coordinator before it relays over Ray instead."""


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes | None:
    """`size` bytes from `stream`, or None when it ends first."""
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def facing_address(cluster_address: str) -> str | None:
    """The address of this machine on the route to the cluster's head (`HOST:PORT`), where the
    nodes can reach the coordinator; None for Ray Client (`ray://`: the driver runs
    elsewhere) or a head whose name does not resolve."""
    if cluster_address.startswith("ray://"):
        return None
    host, _, port = cluster_address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        if ipaddress.ip_address(sockaddr[0]).is_loopback:
            return str(sockaddr[0])
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)  # no packet is sent: the kernel picks the route
            return str(probe.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class ChannelOffer:
    """One worker start's listener and secrets (see the module docstring). Open with `open`,
    serve with `accept` in a nursery until the start is over, then `aclose`."""

    listener: trio.SocketListener
    host: str
    port: int
    token: bytes = field(default_factory=lambda: secrets.token_bytes(TOKEN_BYTES))
    proof: bytes = field(default_factory=lambda: secrets.token_bytes(TOKEN_BYTES))
    stream: trio.SocketStream | None = None
    """The actor's connection, once it presented the token."""
    refused: int = 0
    """Connections closed for want of the token."""

    @classmethod
    async def open(cls, host: str) -> ChannelOffer:
        """**Errors:** `OSError` when no listener can be opened there."""
        [listener] = await trio.open_tcp_listeners(0, host=host, backlog=8)
        port = listener.socket.getsockname()[1]
        return cls(listener, host, int(port))

    def for_actor(self) -> dict[str, Any]:
        """What `NodeWorker.start` gets: where to connect and both secrets."""
        return {
            "host": self.host,
            "port": self.port,
            "token": self.token.hex(),
            "proof": self.proof.hex(),
        }

    async def accept(self) -> None:
        """Take connections until one presents the token (it becomes `stream`, and is
        answered with the proof); the others are closed. Runs until cancelled."""
        async with trio.open_nursery() as nursery:
            while self.stream is None:
                stream = await self.listener.accept()
                nursery.start_soon(self._handshake, stream)

    async def _handshake(self, stream: trio.SocketStream) -> None:
        kept = False
        try:
            with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
                token = await receive_exactly(stream, TOKEN_BYTES)
                # Constant time, and once only: a second connection with it is refused.
                if (
                    token is not None
                    and self.stream is None
                    and hmac.compare_digest(token, self.token)
                ):
                    self.stream = stream  # claimed before any checkpoint: once only
                    await stream.send_all(self.proof)
                    kept = True
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            if not kept:
                self.refused += 1
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def aclose(self) -> None:
        """Stop listening (the accepted `stream`, if any, stays open)."""
        with contextlib.suppress(OSError, trio.ClosedResourceError):
            await self.listener.aclose()


async def connect(offer: dict[str, Any]) -> tuple[trio.SocketStream | None, str]:
    """The actor's side: connect to the coordinator's offer (`ChannelOffer.for_actor`),
    present the token, check the proof. The stream, or None and why not (bounded by
    `CONNECT_TIMEOUT_S`)."""
    why = f"no connection to {offer['host']}:{offer['port']} within {CONNECT_TIMEOUT_S:g} s"
    stream: trio.SocketStream | None = None
    try:
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            stream = await trio.open_tcp_stream(offer["host"], int(offer["port"]))
            await stream.send_all(bytes.fromhex(offer["token"]))
            proof = await receive_exactly(stream, TOKEN_BYTES)
            if proof is not None and hmac.compare_digest(proof, bytes.fromhex(offer["proof"])):
                connected, stream = stream, None
                return connected, "direct"
            why = "the listener did not prove it is the coordinator"
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        why = f"cannot connect to {offer['host']}:{offer['port']}: {exc}"
    finally:
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
    return None, why
