"""The `warren` command: the composition root that turns flags into a run.

    warren -p PROMPT [options]      a headless run (the prompt may also come on stdin)
    warren demo                     the offline demo on a bundled sample repository
    warren doctor [--json]          prove the sandbox floor on this machine, or say how to fix it
    warren sandbox run [--workspace DIR] [--ro] [--net off] -- CMD...
                                    run one command under the floor
    warren policy check|show|test|init   explain and tune the permission policy
    warren trust [PATH] / warren untrust [PATH]   let a repository's policy allow things

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
    from orchestrator.headless import RunnerFactory, SubagentsFactory
    from orchestrator.pipeline import ToolRunner
    from orchestrator.session_policy import SessionPolicy
    from orchestrator.tools.base import ToolContext

__all__ = ["main"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("warren")
    except PackageNotFoundError:
        return "0+unknown"


def _tool_list(values: list[str] | None) -> frozenset[str]:
    """The rules given to --allowed-tools / --disallowed-tools, each split the policy's way
    (commas and blanks between rules, never inside `Bash(npm run test:*)`)."""
    from policies.files import PolicyError, split_tool_list

    try:
        return frozenset(split_tool_list(values or []))
    except PolicyError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


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
        "--max-turns",
        type=int,
        default=None,
        help="model requests per run (default: the policy's limits.max_turns, else 100)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="read-only tool calls run at once (default: the policy's "
        "limits.max_concurrency, else 10)",
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
        choices=["default", "accept-edits", "plan", "dont-ask", "bypass"],
        default=None,
        help="default: read-only calls run, others ask (denied when headless); accept-edits: "
        "edits in the workspace run too; plan: read-only tools only; dont-ask: asks become "
        "denials; bypass: everything except deny rules, protected paths and critical deletes "
        "(default: the policy files' mode)",
    )
    parser.add_argument(
        "--i-know-there-is-no-sandbox",
        dest="no_sandbox_consent",
        action="store_true",
        help="let --permission-mode bypass run without a proven sandbox floor",
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


def _at_terminal() -> bool:
    """A person can answer permission asks: stdin and stderr are terminals."""
    return bool(sys.stdin and sys.stdin.isatty() and sys.stderr.isatty())


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
            no_sandbox_consent=args.no_sandbox_consent,
            asks="terminal" if _at_terminal() else "deny",
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        print(f"warren: {problems}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = trio.run(
            lambda: run_headless(
                options,
                runner_factory=sandboxed_runner_factory(),
                subagents_factory=subagents_factory(),
            )
        )
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
    from sandbox.spec import SandboxSpec
    from workers.toolhost_runner import HOST_LIMITS, SandboxedSpawner, open_tool_runner

    def open_runner(
        ctx: ToolContext, policy: SessionPolicy
    ) -> AbstractAsyncContextManager[ToolRunner]:
        spec = SandboxSpec(
            limits=HOST_LIMITS,
            extra_deny_read=policy.deny_read(),
            extra_protected=policy.protected(),
        )
        return open_tool_runner(
            spawner=SandboxedSpawner(spec, read_denied=policy.read_denied()),
            prestart=ctx,
        )

    return open_runner


def subagents_factory() -> SubagentsFactory:
    """The worker pool (workers/): where dispatch_agent's subagents run, each in its own
    sandboxed process, their model requests through one broker."""
    from workers.pool import open_session_subagents

    return open_session_subagents


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


def _policy(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="warren policy", description="Explain and tune the permission policy of a repository."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="explain the decision for one call: `-- COMMAND...` or `TOOL PATH`",
        description="warren policy check [--json] [--cwd DIR] -- COMMAND...  |  "
        "warren policy check [--json] Edit PATH",
    )
    check.add_argument("--json", action="store_true", help="print the decision as JSON")
    check.add_argument("--cwd", type=Path, default=None, help="the workspace (default: here)")
    check.add_argument("target", nargs=argparse.REMAINDER, help="-- COMMAND... or TOOL PATH")
    for name, text in (
        ("show", "print the effective policy with the source of each rule"),
        ("test", "check every [[examples]] entry of the loaded policy files"),
        ("init", "write a commented starter .warren/policy.toml"),
        ("trust", "let this repository's policy allow things (same as `warren trust`)"),
        ("untrust", "stop trusting this repository's policy (same as `warren untrust`)"),
    ):
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument("--cwd", type=Path, default=None, help="the workspace")
    args = parser.parse_args(argv)
    from orchestrator.tools.registry import builtin_facts
    from policies import commands
    from policies.files import PolicyError

    cwd = (args.cwd or Path.cwd()).absolute()
    tools = commands.CommandEnvironment(tool_facts=builtin_facts())
    match args.command:
        case "check":
            words = list(args.target)
            after_dashdash = words[:1] == ["--"]
            try:
                target = commands.check_target(
                    words[1:] if after_dashdash else words, after_dashdash=after_dashdash
                )
            except PolicyError as exc:
                print(f"warren policy check: {exc}", file=sys.stderr)
                return 2
            return commands.check(target, json_output=args.json, cwd=cwd, environment=tools)
        case "show":
            return commands.show(cwd)
        case "test":
            return commands.test(cwd, environment=tools)
        case "trust":
            return commands.trust_cmd(cwd)
        case "untrust":
            return commands.untrust_cmd(cwd)
        case _:
            return commands.init(cwd)


def _trust(argv: list[str], *, trust: bool) -> int:
    verb = "trust" if trust else "untrust"
    parser = argparse.ArgumentParser(
        prog=f"warren {verb}",
        description="Trust a repository: its policy's allow rules (and later hooks and agent "
        "definitions) take effect. A changed policy file needs trusting again."
        if trust
        else "Stop trusting a repository's policy allow rules.",
    )
    parser.add_argument("path", nargs="?", type=Path, default=None, help="default: here")
    args = parser.parse_args(argv)
    from policies import commands

    path = (args.path or Path.cwd()).absolute()
    return commands.trust_cmd(path) if trust else commands.untrust_cmd(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    match argv[:1]:
        case ["demo"]:
            from orchestrator.demo.run import demo_main

            return demo_main(
                argv[1:],
                runner_factory=sandboxed_runner_factory(),
                subagents=subagents_factory(),
            )
        case ["doctor"]:
            return _doctor(argv[1:])
        case ["sandbox"]:
            return _sandbox(argv[1:])
        case ["policy"]:
            return _policy(argv[1:])
        case ["trust"]:
            return _trust(argv[1:], trust=True)
        case ["untrust"]:
            return _trust(argv[1:], trust=False)
        case _:
            return _run_headless(argv)


if __name__ == "__main__":
    sys.exit(main())
