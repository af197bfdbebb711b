"""The thin client's JSON (orchestrator/cli/client.py: `_encode`/`_decode` over the C halves of
`json`, which keep `re` and `enum` off a warm launch) is exactly the standard library's for
everything the server link carries: argv, the environment with any bytes a user may put in
it (surrogate escapes), the working directory, numbers, flags."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchestrator.cli.client import _decode, _encode

_scalars = (
    st.text()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.none()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _values))
@example({"env": {"A": "caf\udce9", "B": "\x00\x1f\"\\\u2028"}, "argv": ["-p", "😀"], "n": -0.0})
@example({"big": 10**30, "tiny": 5e-324, "exp": 1e16})
def test_the_clients_json_is_the_standard_librarys(message: dict[str, object]) -> None:
    text = _encode(message)
    assert text == json.dumps(message)
    assert _decode(text.encode()) == json.loads(text) == message


def test_non_finite_numbers_and_bad_input_as_the_standard_library() -> None:
    assert _encode([math.inf, -math.inf]) == json.dumps([math.inf, -math.inf])
    assert math.isnan(_decode(b'{"x": NaN}')["x"])  # type: ignore[index]
    for bad in (b"", b"{", b'{"a": 1} x', b"[1,]", b'{"a" 1}', b'"\x01"'):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            _decode(bad)
    with pytest.raises(TypeError):
        _encode({1: "a key that is no string"})


def test_descriptors_travel_with_the_first_message_as_the_standard_library_sends_them() -> None:
    """The link packs SCM_RIGHTS by hand (no `array` on a warm launch): descriptors it sends
    arrive through `socket.recv_fds`, in order, and what `socket.send_fds` sends arrives
    through the link, with the message's bytes."""
    import os
    import socket

    from orchestrator.cli.client import ServerLink

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    received: list[int] = []
    try:
        ServerLink(ours).send({"op": "run"}, [read_end, write_end, read_end])
        data, fds, _, _ = socket.recv_fds(theirs, 1024, 4)
        received += fds
        assert json.loads(data) == {"op": "run"}
        assert [os.fstat(fd).st_ino for fd in fds] == [
            os.fstat(fd).st_ino for fd in (read_end, write_end, read_end)
        ]
        os.write(fds[1], b"x")  # the second is the pipe's write end
        assert os.read(read_end, 1) == b"x"
        socket.send_fds(theirs, [b'{"exit": 0}\n'], [write_end, read_end])
        message, back = ServerLink(ours).receive(max_fds=4)
        received += back
        assert message == {"exit": 0}
        assert [os.fstat(fd).st_ino for fd in back] == [
            os.fstat(fd).st_ino for fd in (write_end, read_end)
        ]
    finally:
        for fd in (read_end, write_end, *received):
            os.close(fd)
        ours.close()
        theirs.close()
