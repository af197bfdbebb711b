"""A worker that speaks the protocol badly, for the pool's fault tests.

    python -m tests.workers.rogue_worker MODE

It says `Ready` like a real worker, then on `RunAgent`:

- `garbage`: writes a few lines that are not protocol messages, then a proper `AgentResult`;
- `flood-garbage`: writes non-protocol lines forever;
- `flood-logs`: writes to stderr forever;
- `hang`: answers nothing and ignores SIGTERM (only SIGKILL stops it).
"""

from __future__ import annotations

import os
import signal
import sys

from workers import protocol as wire


def main() -> None:
    mode = sys.argv[1]
    out = sys.stdout.buffer
    ready = wire.Ready(
        version=wire.PROTOCOL_VERSION, pid=os.getpid(), role="read_only", workspace="/", tools=[]
    )
    out.write(wire.encode(ready))
    out.flush()
    for line in sys.stdin.buffer:
        message = wire.decode_line(line)
        if not isinstance(message, wire.RunAgent):
            continue
        if mode == "garbage":
            out.write(b'not json\n{"type": "nonsense"}\n[1, 2]\n')
            result = wire.AgentResult(
                id=message.id, reason="completed", result="survived the garbage", num_turns=1
            )
            out.write(wire.encode(result))
            out.flush()
        elif mode == "flood-garbage":
            while True:
                out.write(b"garbage " * 100 + b"\n")
        elif mode == "flood-logs":
            while True:
                sys.stderr.write("log " * 1000 + "\n")
        elif mode == "hang":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.pause()


if __name__ == "__main__":
    main()
