"""`python -I -m workers MODULE ARGS...`: how the coordinator starts a tool host
(`workers.toolhost`) or a pool worker (`workers.agent_worker`), the argv `HostLaunch.of_module`
builds. Turns off pydantic's plugin search and defers the modules a worker never uses first
(workers/lean.py: both must precede MODULE's imports), then runs MODULE's `main(ARGS)` and
leaves without interpreter teardown (`workers.entry.exit_now`). `python -m MODULE` still
works, without the savings."""

from __future__ import annotations

import sys

from workers.lean import defer_unused_modules, pydantic_plugins_off

_MODULES = ("workers.toolhost", "workers.agent_worker")


def _main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in _MODULES:
        raise SystemExit(f"usage: python -m workers {{{','.join(_MODULES)}}} ARGS...")
    pydantic_plugins_off()
    defer_unused_modules()
    module, args = sys.argv[1], sys.argv[2:]
    if module == "workers.toolhost":
        from workers.toolhost import main
    else:
        from workers.agent_worker import main
    from workers.entry import exit_now

    exit_now(main(args))


if __name__ == "__main__":
    _main()
