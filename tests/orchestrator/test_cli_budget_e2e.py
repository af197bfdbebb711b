"""Budgets end to end: the real `warren` process, the real SDK over a socket to the fake
Messages API, whose turns report 100,000 input tokens ($0.30 each on claude-sonnet-4-6).

Under `--max-budget-usd 0.60` the first such turn fits (its estimate: the system prompt and the
tools' descriptions plus the model's default max_tokens, 32,000 output tokens, about $0.52),
the next request would pass the budget ($0.30 spent plus about $0.52), so it is never sent:
the run ends `budget_exceeded`, exit 5, with the spend in the result. The same when the $0.30
was spent by a subagent, or when the budget comes from the policy's `[limits]
max_budget_usd`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli.demo.sample_repo import generate
from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply
from tests.orchestrator.test_cli_e2e import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXPENSIVE = {"input_tokens": 100_000, "output_tokens": 20}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return generate(tmp_path / "shop")


def _result(stdout: str) -> dict[str, object]:
    result = json.loads(stdout)
    assert isinstance(result, dict)
    return result


@pytest.mark.parametrize("budget_from", ["flag", "policy"])
def test_main_agent_spend_ends_the_run_budget_exceeded(
    sample: Path, env: dict[str, str], tmp_path: Path, budget_from: str
) -> None:
    replies = [
        Reply.tool_use("Glob", {"pattern": "**/*.py"}, usage=EXPENSIVE),
        Reply.text("never sent", usage=EXPENSIVE),
    ]
    args = ["-p", "look around", "--cwd", str(sample), "--output-format", "json"]
    if budget_from == "flag":
        args += ["--max-budget-usd", "0.60"]
    else:
        user_policy = tmp_path / "config" / "warren" / "policy.toml"
        user_policy.parent.mkdir(parents=True)
        user_policy.write_text("[limits]\nmax_budget_usd = 0.6\n")
    with FakeMessagesAPI(replies) as api:
        done = run_cli(args, {**env, "ANTHROPIC_BASE_URL": api.base_url})
        sent = len(api.requests)
    assert done.returncode == 5, done.stderr
    assert sent == 1, "the request that would pass the budget was sent"
    result = _result(done.stdout)
    assert result["terminal_reason"] == "budget_exceeded" and result["is_error"] is True
    assert result["total_cost_usd"] == pytest.approx(0.3003, abs=1e-4)
    assert "$0.60" in str(result["result"]) and "not sent" in str(result["result"])
    assert "Traceback" not in done.stderr


def test_subagent_spend_counts_against_the_budget(sample: Path, env: dict[str, str]) -> None:
    """The main agent's own turns are cheap; its subagent's turn costs $0.30, so the main
    agent's next request would pass the $0.60 budget and is not sent."""

    def route(request: RecordedRequest) -> Reply | None:
        first = request.messages[0]["content"]
        text = first if isinstance(first, str) else " ".join(b.get("text", "") for b in first)
        if "[budget-sub]" in text:
            return Reply.text("surveyed", usage=EXPENSIVE)
        return None

    main = [
        Reply.tool_use(
            "dispatch_agent",
            {"description": "survey", "prompt": "Survey the code. [budget-sub]"},
        ),
        Reply.text("never sent"),
    ]
    args = ["-p", "survey", "--cwd", str(sample), "--output-format", "json"]
    args += ["--max-budget-usd", "0.60", "--permission-mode", "accept-edits"]
    with FakeMessagesAPI(main, route=route) as api:
        done = run_cli(args, {**env, "ANTHROPIC_BASE_URL": api.base_url})
        requests = api.requests
    assert done.returncode == 5, done.stderr
    subagent = [r for r in requests if "[budget-sub]" in json.dumps(r.messages[0])]
    assert len(subagent) == 1 and len(requests) == 2
    result = _result(done.stdout)
    assert result["terminal_reason"] == "budget_exceeded"
    # The main agent's one turn (100 in, 20 out) plus the subagent's $0.3003.
    assert result["total_cost_usd"] == pytest.approx(0.3003 + 0.0006, abs=1e-4)


def test_a_budget_below_zero_is_a_usage_error(sample: Path, env: dict[str, str]) -> None:
    done = run_cli(["-p", "x", "--cwd", str(sample), "--max-budget-usd", "-1"], env)
    assert done.returncode == 2 and "max_budget_usd" in done.stderr
    assert "Traceback" not in done.stderr
