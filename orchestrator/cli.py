"""The `warren` command: the composition root that turns flags into a run.

    warren -p PROMPT [options]      a headless run (the prompt may also come on stdin)
    warren demo                     the offline demo on a bundled sample repository
    warren doctor [--json]          prove the sandbox floor on this machine, or say how to fix it
    warren sandbox run [--workspace DIR] [--ro] [--net off] -- CMD...
                                    run one command under the floor

Exit codes are the run's terminal reason (see `orchestrator.outcome.exit_code`); 2 is a bad
command line or configuration.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.headless import RunnerFactory
    from orchestrator.pipeline import ToolRunner
    from orchestrator.tools.base import ToolContext

__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("warren")
    except PackageNotFoundError:
        return "0+unknown"


def _tool_list(values: list[str] | None) -> frozenset[str]:
    names: set[str] = set()
    for value in values or []:
        names.update(n.strip() for n in value.replace(",", " ").split() if n.strip())
    return frozenset(names)


def _headless_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warren",
        description="Warren: a sandboxed multi-agent coding orchestrator.",
        epilog="Other commands: `warren demo` runs an offline demo. "
        "Exit codes: 0 completed, 1 model error, 2 usage, 3 max turns, 4 prompt too long, "
        "5 budget exceeded, 6 hook blocked, 7 permission denied, 130 interrupted.",
    )
    parser.add_argument(
        "-p",
        "--print",
        dest="prompt",
        metavar="PROMPT",
        help="run headless with this prompt (or give the prompt on stdin)",
    )
    parser.add_argument(
        "--output-format",
        choices=["text", "json", "stream-json"],
        default="text",
        help="what to print on stdout (default: text)",
    )
    parser.add_argument(
        "--max-turns", type=int, default=100, help="model requests per run (default: 100)"
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=10,
        help="read-only tool calls run at once (default: 10)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="Claude model name, or scripted:PATH to replay a script (default: claude-sonnet-4-6)",
    )
    parser.add_argument(
        "--cwd",
        type=Path,
        default=None,
        help="the workspace to work in (default: the current directory)",
    )
    parser.add_argument(
        "--permission-mode",
        choices=["default", "bypass"],
        default="default",
        help="default: read-only calls run, others are asked (denied when "
        "headless); bypass: everything runs",
    )
    parser.add_argument(
        "--allowed-tools",
        action="append",
        metavar="TOOLS",
        help="tools that run without asking (comma or space separated)",
    )
    parser.add_argument(
        "--disallowed-tools", action="append", metavar="TOOLS", help="tools that are always denied"
    )
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", metavar="SESSION_ID", help="continue a session")
    resume.add_argument(
        "-c",
        "--continue",
        dest="continue_last",
        action="store_true",
        help="continue the most recent session in this directory",
    )
    parser.add_argument(
        "--sandbox",
        choices=["required", "off"],
        default="required",
        help="required (default): prove the bubblewrap floor and run every tool call inside "
        "it, or refuse to start; off: run tools unsandboxed, with a warning on every run",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="readable logs and progress on stderr"
    )
    parser.add_argument("--version", action="version", version=f"warren {_version()}")
    return parser


def _run_headless(argv: list[str]) -> int:
    import trio
    from pydantic import ValidationError

    from orchestrator.errors import ConfigError
    from orchestrator.headless import DEFAULT_MODEL, HeadlessOptions, run_headless
    from orchestrator.outcome import EXIT_USAGE, exit_code

    parser = _headless_parser()
    args = parser.parse_args(argv)
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            parser.print_usage(sys.stderr)
            print(
                "warren: give a prompt with -p PROMPT or on stdin "
                "(the interactive REPL is not built yet)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        prompt = sys.stdin.read()
    if not prompt.strip():
        print("warren: the prompt is empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        options = HeadlessOptions(
            prompt=prompt,
            cwd=(args.cwd or Path.cwd()).absolute(),
            model=args.model or DEFAULT_MODEL,
            output_format=args.output_format,
            max_turns=args.max_turns,
            max_concurrency=args.max_concurrency,
            permission_mode=args.permission_mode,
            allowed_tools=_tool_list(args.allowed_tools),
            disallowed_tools=_tool_list(args.disallowed_tools),
            resume=args.resume,
            continue_last=args.continue_last,
            verbose=args.verbose,
            sandbox=args.sandbox,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        print(f"warren: {problems}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = trio.run(lambda: run_headless(options, runner_factory=sandboxed_runner_factory()))
    except ConfigError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("warren: interrupted", file=sys.stderr)
        return 130
    result = report.result
    if result.reason != "completed" and options.output_format == "text":
        print(f"warren: run ended: {result.reason}: {result.result}", file=sys.stderr)
    return exit_code(result.reason)


def sandboxed_runner_factory() -> RunnerFactory:
    """The sandboxed tool hosts (workers/): where every tool call of a run executes.

    The one place the orchestrator is wired to a concrete worker implementation.
    """
    from workers.toolhost_runner import SandboxedSpawner, open_tool_runner

    def open_runner(ctx: ToolContext) -> AbstractAsyncContextManager[ToolRunner]:
        return open_tool_runner(spawner=SandboxedSpawner(), prestart=ctx)

    return open_runner


def _doctor(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="warren doctor", description="Prove the sandbox floor here, or say how to fix it."
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    from sandbox.commands import doctor

    return doctor(args.json)


def _sandbox(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="warren sandbox", description="Run one command under Warren's sandbox floor."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run CMD in the sandbox; its exit code is passed through")
    run.add_argument(
        "--workspace",
        type=Path,
        default=None,
        help="the directory mounted writable (default: the current directory)",
    )
    run.add_argument("--ro", action="store_true", help="mount the workspace read-only")
    run.add_argument("--net", choices=["off"], default="off", help="network (only off for now)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    from sandbox.commands import sandbox_run

    return sandbox_run((args.workspace or Path.cwd()).absolute(), args.ro, args.net, cmd)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    match argv[:1]:
        case ["demo"]:
            from orchestrator.demo.run import demo_main

            return demo_main(argv[1:], runner_factory=sandboxed_runner_factory())
        case ["doctor"]:
            return _doctor(argv[1:])
        case ["sandbox"]:
            return _sandbox(argv[1:])
        case _:
            return _run_headless(argv)


if __name__ == "__main__":
    sys.exit(main())
