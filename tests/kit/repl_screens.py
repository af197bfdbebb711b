"""The README's captured panes of the interactive session, reproduced: `warren` in tmux on
the demo's sample repository, against the fake Messages API (scripted replies).

    uv run python -m tests.kit.repl_screens [edit|subagents|esc] [--live]

Prints the pane (tmux capture-pane) after each scenario; `--live` prints the subagent panel
while the three subagents run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.cli.demo.sample_repo import generate
from tests.kit.fake_api import FakeMessagesAPI, RecordedRequest, Reply
from tests.kit.tty import Terminal

ROOT = Path(__file__).resolve().parents[2]


def _terminal(tmp: Path, api: FakeMessagesAPI, cwd: Path) -> Terminal:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp)),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "XDG_STATE_HOME": str(tmp / "state"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "ANTHROPIC_API_KEY": "sk-demo",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        "WARREN_NO_SERVER": "1",  # no warm server started for next time
    }
    terminal = Terminal.start(
        [sys.executable, "-m", "orchestrator.cli"], env=env, cwd=cwd, socket_dir=tmp, width=100
    )
    terminal.wait_for(r"/help for commands", timeout=60)
    terminal.wait_for(r"\n> ?$")
    return terminal


def edit(tmp: Path) -> str:
    sample = generate(tmp / "shop")
    money = sample / "shop" / "money.py"
    replies = [
        Reply(content=[{"type": "text", "text": "I'll read the helper first."},
                       {"type": "tool_use", "name": "Read", "input": {"file_path": str(money)}}]),
        Reply.tool_use("Edit", {"file_path": str(money), "old_string": "def legacy_round(",
                                "new_string": "def round_money("}),
        Reply.text("Renamed `legacy_round` to **`round_money`** in `shop/money.py`."),
    ]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        terminal = _terminal(tmp, api, sample)
        try:
            terminal.type("rename legacy_round to round_money in shop/money.py")
            terminal.press("Enter")
            dialog = terminal.wait_for(r"\[y\] yes")
            terminal.type("y")
            terminal.wait_for(r"in shop/money\.py\.")
            terminal.type("/cost")
            terminal.press("Enter")
            terminal.wait_for(r"Total cost")
            return dialog + "\n\n--- after y and /cost ---\n\n" + terminal.screen()
        finally:
            terminal.close()


def subagents(tmp: Path, live_only: bool = False) -> str:
    sample = generate(tmp / "shop")
    areas = ["billing", "catalog", "shipping"]
    main = [
        Reply(content=[
            {"type": "tool_use", "name": "dispatch_agent",
             "input": {"description": f"survey {a}", "prompt": f"[survey:{a}] go"}}
            for a in areas
        ]),
        Reply.text("All three areas call `legacy_round`; billing twice."),
    ]  # fmt: skip
    seen: dict[str, int] = {}

    def route(request: RecordedRequest) -> Reply | None:
        first = json.dumps(request.messages[:1])
        for area in areas:
            if f"[survey:{area}]" in first:
                seen[area] = seen.get(area, 0) + 1
                if seen[area] == 1:
                    return Reply.tool_use("Grep", {"pattern": "legacy_round", "path": str(sample)})
                return Reply.text(f"{area}: uses legacy_round", hold_before_stop=True)
        return None

    with FakeMessagesAPI(main, route=route) as api:
        terminal = _terminal(tmp, api, sample)
        try:
            terminal.type("where is legacy_round used? one subagent per area")
            terminal.press("Enter")
            deadline = time.monotonic() + 60
            live = ""
            while time.monotonic() < deadline:
                live = terminal.screen(history=False)
                if len(re.findall(r"survey \w+ .* \d+\s*$", live, re.M)) == 3:
                    break
                time.sleep(0.1)
            api.release(3)
            done = terminal.wait_for(r"billing twice\.", timeout=60)
            return live if live_only else live + "\n\n--- when they are done ---\n\n" + done
        finally:
            terminal.close()


def esc(tmp: Path) -> str:
    sample = generate(tmp / "shop")
    replies = [
        Reply.tool_use("Bash", {"command": "python -m unittest -q; sleep 30",
                                "description": "run the tests"}),
        Reply.text("Stopped; tell me when to run them."),
    ]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        terminal = _terminal(tmp, api, sample)
        try:
            terminal.type("run the tests")
            terminal.press("Enter")
            terminal.wait_for(r"\[y\] yes")
            terminal.type("y")
            terminal.wait_for(r"sleep 30\)  \d")
            terminal.press("Escape")
            terminal.wait_for(r"Interrupted\.")
            terminal.type("/context")
            terminal.press("Enter")
            terminal.wait_for(r"tokens \(")
            return terminal.screen()
        finally:
            terminal.close()


def main() -> None:
    which = [a for a in sys.argv[1:] if not a.startswith("-")] or ["edit", "subagents", "esc"]
    for name in which:
        with tempfile.TemporaryDirectory() as tmp:
            if name == "subagents":
                print(subagents(Path(tmp), live_only="--live" in sys.argv))
            else:
                print({"edit": edit, "esc": esc}[name](Path(tmp)))
        print()


if __name__ == "__main__":
    main()
