"""`warren doctor` and `warren sandbox run`: sandbox/commands.py's values, printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli.subcommands.parsers import command_group, command_parser

__all__ = ["add_commands"]


def add_commands(sub: Any, summaries: dict[str, str]) -> None:
    """Add `doctor` and `sandbox` to the `warren` subparsers."""
    doctor = command_parser(sub, "doctor", summaries)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--pool",
        choices=["local", "ray"],
        default="local",
        help="ray: also prove the floor on every node of the Ray cluster at $RAY_ADDRESS "
        "(else the policy's [pool] address)",
    )
    doctor.set_defaults(handler=_doctor)

    commands = command_group(sub, "sandbox", summaries)
    run = commands.add_parser("run", help="run CMD in the sandbox; its exit code is passed through")
    run.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="the directory mounted writable (default: the current directory)",
    )
    run.add_argument("--ro", action="store_true", help="mount the workspace read-only")
    run.add_argument("--net", choices=["off"], default="off", help="network (only off for now)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    run.set_defaults(handler=_sandbox_run)


def _doctor(args: argparse.Namespace) -> int:
    from sandbox.commands import doctor

    report = doctor(extra_home_allow=_home_allow_here())
    if args.json:
        payload: dict[str, Any] = report.floor.model_dump(mode="json")
        payload["stubs_swept"] = [str(p) for p in report.stubs_swept]
        payload["home_hidden"] = str(report.home_hidden) if report.home_hidden else None
        payload["home_allow"] = list(report.home_visible)
        print(json.dumps(payload, indent=2))
    else:
        print(report.floor.render())
        for path in report.stubs_swept:
            print(f"removed a stale mount stub: {path}")
        if report.home_hidden is None:
            print("home: visible to sandboxes (secrets masked by list only)")
        else:
            print(f"home: {report.home_hidden} hidden from sandboxes; visible read-only:")
            for shown in report.home_visible or ("(nothing)",):
                print(f"  {shown}")
            print("  add more with `[sandbox] home_allow = [...]` in a policy file")
        for line in _mcp_servers_here(report.floor.proven):
            print(line)
    if args.pool == "ray":
        return _ray_nodes(args.json) or (0 if report.floor.proven else 1)
    return 0 if report.floor.proven else 1


def _ray_nodes(as_json: bool) -> int:
    """Each alive node of the Ray cluster with its floor (`wiring.cluster_nodes`): 1 when a
    node has none or the cluster cannot be reached, else 0."""
    import os

    from orchestrator.calls.policy import load_session_policy
    from orchestrator.cli.wiring import cluster_nodes
    from policies.pool import PoolSetting, resolve_pool
    from policies.sources import PolicyError

    try:
        setting = load_session_policy(Path.cwd(), floor_proven=True).effective.pool
    except Exception:
        setting = PoolSetting()  # no policy here: RAY_ADDRESS decides
    try:
        address = resolve_pool(setting, "ray", os.environ).address
        assert address is not None
        reports = cluster_nodes(address)
    except (PolicyError, ConnectionError, ModuleNotFoundError) as exc:
        print(f"warren doctor: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps([vars(r) for r in reports], indent=2))
    else:
        print(f"ray cluster {address}: {len(reports)} nodes")
        for report in reports:
            print(report.render())
    return 0 if reports and all(r.ok for r in reports) else 1


def _mcp_servers_here(floor_proven: bool) -> list[str]:
    """Each MCP server in force here, started as a session would start it (inside the floor),
    with its state: ready and how many tools, or why it failed. Nothing when none is
    configured or the policy cannot load."""
    import trio

    from orchestrator.calls.policy import load_session_policy
    from orchestrator.cli.wiring import open_mcp
    from orchestrator.text import escape_controls
    from orchestrator.tools.base import ToolContext

    try:
        policy = load_session_policy(Path.cwd(), floor_proven=floor_proven)
    except Exception:
        return []
    if not policy.effective.mcp_servers:
        return []
    cwd = Path.cwd().resolve()
    ctx = ToolContext(workspace=cwd, cwd=cwd, extra_roots=policy.writable_roots())
    wait = max(server.startup_timeout_s for _, server, _ in policy.effective.mcp_servers)

    async def states() -> list[str]:
        lines = ["mcp servers:"]
        async with open_mcp(ctx, policy, notices=False) as servers:
            await servers.wait_started(wait)
            for name in servers.names():
                status, error, _ = servers.status(name)
                # The widening `network = true` grants is shown wherever the server is.
                config = servers.config(name)
                widened = ", HOST NETWORK" if config is not None and config.network else ""
                if status == "ready":
                    tools = sum(1 for server, _ in servers.tools() if server == name)
                    prompts = [p.name for server, p in servers.prompts() if server == name]
                    listed = f"; prompts: {', '.join(prompts)}" if prompts else ""
                    shown = f"{tools} tools{widened}{escape_controls(listed)}"
                    lines.append(f"  {name}: ready, {shown}")
                else:
                    lines.append(
                        f"  {name}: {status}{widened}: {escape_controls(error or 'starting')}"
                    )
        return lines

    return trio.run(states)


def _home_allow_here() -> tuple[str, ...]:
    """The `[sandbox] home_allow` of the policy in force here (none if it cannot load: the
    doctor still reports the floor)."""
    from orchestrator.calls.policy import load_session_policy

    try:
        return load_session_policy(Path.cwd(), floor_proven=True).home_allow()
    except Exception:
        return ()


def _sandbox_run(args: argparse.Namespace) -> int:
    from sandbox.commands import EXIT_SANDBOX_ERROR, sandbox_run
    from sandbox.errors import SandboxError

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("warren sandbox run: no command given (use `-- CMD ...`)", file=sys.stderr)
        return 2
    try:
        result = sandbox_run((args.workspace or Path.cwd()).absolute(), args.ro, cmd)
    except SandboxError as exc:
        print(f"warren sandbox run: {exc.message}", file=sys.stderr)
        return EXIT_SANDBOX_ERROR
    except KeyboardInterrupt:  # the sandbox was killed and reaped on the way out
        return 130
    for note in result.notes:
        print(f"warren: {note}", file=sys.stderr)
    return result.exit_code
