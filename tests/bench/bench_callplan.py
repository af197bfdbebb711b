"""The cost of planning one call (issue 10, item 2), against the old way, in one run.

    .venv/bin/python tests/bench/bench_callplan.py

New: `pipeline.prepare` (schema, the one classification) + the permission function reading
the plan. Old: what the same call cost before the plan: the executor's concurrency check,
`PolicyEngine.decide` with the tool's own read-only check, and the runner's host choice,
each classifying a Bash command again. Medians over 2,000 calls per command.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.calls.permissions import headless_asker  # noqa: E402
from orchestrator.calls.pipeline import ToolPipeline  # noqa: E402
from orchestrator.calls.policy import SessionPolicy  # noqa: E402
from orchestrator.messages import ToolUseBlock  # noqa: E402
from orchestrator.tools.base import ToolContext  # noqa: E402
from orchestrator.tools.registry import builtin_facts, builtin_tools  # noqa: E402
from policies.bash_analysis import BashAnalyser  # noqa: E402
from policies.engine import PolicyEngine  # noqa: E402
from policies.files import PolicyLayer, merge_policy, parse_policy_text  # noqa: E402

CALLS = 2000
COMMANDS = {
    "read-only Bash": "rg -n TODO src | head -20",
    "writing Bash": "make check && git commit -am wip",
    "Read": None,
}


async def main(ws: Path) -> None:
    layer = PolicyLayer("local", "local.toml", parse_policy_text("", file="local.toml"), ws)
    effective = merge_policy(ws, [layer], home=ws)
    engine = PolicyEngine(
        effective,
        workspace=ws,
        floor_proven=True,
        analyser=BashAnalyser(),
        env={"HOME": str(ws)},
        tool_facts=builtin_facts(),
    )
    session = SessionPolicy(effective, engine)
    ctx = ToolContext(workspace=ws, cwd=ws)
    old_tools = builtin_tools(bash_classifier=SessionPolicy(effective, engine).bash_classifier())
    pipeline = ToolPipeline(
        tools=builtin_tools(),
        ctx=ctx,
        permission=session.permission_fn(),
        asker=headless_asker,
        assessor=session.assessor(),
        emit=lambda event: None,
    )
    permission = session.permission_fn()

    async def measure(label: str, name: str, raw: dict[str, Any]) -> None:
        block = ToolUseBlock(id="t", name=name, input=raw)
        tool = old_tools.get(name)
        assert tool is not None

        async def new() -> None:
            await permission(pipeline.prepare(block), ctx)

        async def old() -> None:
            parsed = tool.parse_input(raw)
            tool.is_concurrency_safe(parsed)  # the executor
            dumped = parsed.model_dump(mode="json", by_alias=True, exclude_none=True)
            engine.decide(name, dumped, tool_read_only=tool.is_read_only(parsed))  # policy
            tool.is_read_only(parsed)  # the runner's host

        times: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(CALLS):  # interleaved, so both see the same machine
            for way, fn in (("new", new), ("old", old)):
                start = time.perf_counter()
                await fn()
                times[way].append(time.perf_counter() - start)
        n, o = (statistics.median(times[w]) * 1e6 for w in ("new", "old"))
        print(f"{label:>15}: plan {n:7.1f} us, old way {o:7.1f} us, ratio {n / o:.2f}")

    for label, command in COMMANDS.items():
        if command is None:
            await measure(label, "Read", {"file_path": str(ws / "a.py")})
        else:
            await measure(label, "Bash", {"command": command})


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        trio.run(main, Path(tmp).resolve())
