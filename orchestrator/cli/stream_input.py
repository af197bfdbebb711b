"""`--input-format stream-json`: a session driven over stdin and stdout by an SDK host, as
Claude Code is by the Claude Agent SDK (`cli_path`), speaking
`orchestrator.claude_code.sdk_control`.

One session serves every user message the host sends, one run each, in order; each run ends
with its `result` line. The session ends when the host closes stdin. Asks go to the host
(`can_use_tool`, with `--permission-prompt-tool stdio`) or, without that flag, are denied as in
any headless run. A signal during a run stops it the way it stops `warren -p`
(orchestrator/cli/run.py) and ends the session after its result; between runs it ends the
session at once (128 + the signal). The session opens once the host's first line has come
(its `initialize`, with hook callbacks and agent types the session needs from the start).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import IO, Any, cast

import trio

from orchestrator.aio import closing_iter
from orchestrator.claude_code.sdk_control import ProtocolError, SdkControl, mcp_status_entries
from orchestrator.cli.run import ClosableStdout, _Stopping, say
from orchestrator.errors import ConfigError
from orchestrator.outcome import EXIT_USAGE, exit_code
from orchestrator.session.config import SessionConfig, SessionParts
from orchestrator.session.open import open_session
from orchestrator.session.session import Session
from orchestrator.text import escape_controls
from policies.files import Mode

__all__ = ["run_stream_input"]


async def run_stream_input(config: SessionConfig, parts: SessionParts, *, host_asks: bool) -> int:
    """Serve the host on stdin/stdout until it closes stdin; the exit code is the last run's
    (0 when none ran), 2 for a configuration or protocol error, 128 + a signal.

    `host_asks`: the policy's asks go to the host (`--permission-prompt-tool stdio`).

    **Errors:** none: a broken line from the host is one line on stderr and exit 2.
    """
    stopping = _Stopping()
    stdout = ClosableStdout(parts.stdout or sys.stdout, stopping.close_output)
    control = SdkControl(cast(IO[str], stdout))
    parts = dataclasses.replace(parts, stdout=cast(IO[str], stdout))
    if host_asks:
        parts = dataclasses.replace(parts, asker=lambda policy, notify: control.asker())
    failure: list[str] = []
    code = 0

    async def serve(stdin: trio.lowlevel.FdStream) -> None:
        async with stdin:
            try:
                await control.serve(stdin)
            except ProtocolError as exc:
                failure.append(str(exc))
                if stopping.session is not None:
                    stopping.session.interrupt()
                else:
                    stopping.scope.cancel()

    async with trio.open_nursery() as nursery:
        await nursery.start(stopping.watch)
        nursery.start_soon(serve, trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())))
        try:
            with stopping.scope:
                # The host's `initialize` comes first: its hooks and agent types must be in
                # the session before it opens (and prints `system/init`).
                await control.ready.wait()
                parts = dataclasses.replace(parts, host=control.host)
                if parts.mcp is not None:
                    # The host's own MCP servers (`"type": "sdk"` in --mcp-config) are
                    # reached over this control channel.
                    from orchestrator.cli.wiring import open_mcp

                    parts = dataclasses.replace(
                        parts,
                        mcp=lambda ctx, policy: open_mcp(ctx, policy, host=control.mcp_message),
                    )
                async with open_session(config, parts) as session:
                    control.on_interrupt = session.interrupt
                    control.set_mode = lambda mode: _set_mode(session, mode)
                    control.set_model = session.set_model
                    control.mcp_status = lambda: _mcp_status(session)
                    async with closing_iter(control.prompts()) as prompts:
                        async for prompt in prompts:
                            # A signal during a run interrupts it; between runs (no session
                            # set) it ends the session at once (`_Stopping.watch`).
                            stopping.session = session
                            result = await session.run(prompt)
                            stopping.session = None
                            code = exit_code(result.reason)
                            if failure or stopping.signal is not None or stopping.output_closed:
                                break
        except ConfigError as exc:
            say(f"warren: {escape_controls(str(exc))}")
            code = EXIT_USAGE
        finally:
            nursery.cancel_scope.cancel()
    if failure:
        say(f"warren: {escape_controls(failure[0])}")
        return EXIT_USAGE
    if stopping.signal is not None:
        return 128 + stopping.signal
    return code


def _set_mode(session: Session, mode: Mode) -> None:
    """`set_permission_mode` from the host: the same switch as the REPL's `/permissions`
    (`ModeRefused`, a `ValueError`, is the error the host is sent)."""
    session.policy.permission_mode.set(mode)


def _mcp_status(session: Session) -> list[dict[str, Any]]:
    """`mcp_status` from the host: the session's MCP servers, or the configured names while
    they wait to start (after the first response)."""
    source = session.mcp_source
    return mcp_status_entries(session.mcp, () if source is None else source.names)
