"""The interactive session end to end: the real `warren` in a real pseudo-terminal (tmux),
the real SDK against the fake Messages API, real sandboxes. Every wait is a poll of the
captured pane with a generous deadline (the machine is loaded), never a fixed sleep."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from orchestrator.cli.demo.sample_repo import generate
from tests.kit.fake_api import FakeMessagesAPI, FakeResponse, RecordedRequest, Reply
from tests.kit.tty import Terminal

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
PROMPT = r"\n> ?$"
"""The prompt waiting for input: the pane's last line."""


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return generate(tmp_path / "shop")


def _env(tmp_path: Path, api: FakeMessagesAPI) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "ANTHROPIC_API_KEY": "sk-test-e2e",
        "ANTHROPIC_BASE_URL": api.base_url,
        "PYTHONPATH": str(ROOT),
        # An interactive session starts a warm server for next time: not from the tests.
        "WARREN_NO_SERVER": "1",
    }


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.close()


def _start(
    terminals: list[Terminal],
    tmp_path: Path,
    api: FakeMessagesAPI,
    cwd: Path,
    *args: str,
) -> Terminal:
    terminal = Terminal.start(
        [*WARREN, *args], env=_env(tmp_path, api), cwd=cwd, socket_dir=tmp_path
    )
    terminals.append(terminal)
    terminal.wait_for(r"/help for commands", timeout=60)
    terminal.wait_for(PROMPT)
    return terminal


def _send(terminal: Terminal, text: str) -> None:
    terminal.type(text)
    terminal.press("Enter")


def _family(pid: int | None) -> list[psutil.Process]:
    if pid is None:
        return []
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cmdline(process: psutil.Process) -> str:
    """Its command line; empty once it ended (a short-lived child, such as the first change
    scan, may be gone or not yet reaped when it is looked at)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(process.cmdline()) or str(process.pid))
        except psutil.NoSuchProcess:
            pass
    return left


def _texts(request: RecordedRequest) -> str:
    return json.dumps(request.messages)


def test_a_prompt_streams_its_reply_and_exit_leaves_nothing_behind(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    replies = [
        Reply.tool_use("Glob", {"pattern": "**/*.py"}),
        Reply.text("The shop has **three** parts:\n\n- billing\n- catalog\n- shipping",
                   chunk_delay_s=0.02),
    ]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        family = _family(terminal.pid())
        _send(terminal, "what is in here?")
        terminal.wait_for(r"• shipping")
        screen = terminal.wait_for(PROMPT)
        assert "✓ Glob('**/*.py')" in screen  # one line per tool call, with its status
        family += _family(terminal.pid())[1:]  # the tool hosts now run
        assert any("bwrap" in _cmdline(p) for p in family[1:])
        assert "(/expand 1)" in screen  # the result is folded, its whole text a command away
        _send(terminal, "/cost")
        screen = terminal.wait_for(r"Total cost: \$\d+\.\d{4}")
        assert "200 input · 40 output" in screen  # two requests of the fake's default usage
        _send(terminal, "/expand")
        screen = terminal.wait_for(r"\[1\] Glob\('\*\*/\*\.py'\)  \d+ lines")
        # the whole result once the next prompt is drawn below it (the header comes first)
        screen = terminal.wait_for(PROMPT, after=screen.rindex("[1] Glob"))
        expanded = screen.split("[1] Glob")[-1]
        for name in ("shop/money.py", "shop/billing/invoice.py", "shop/__init__.py"):
            assert str(sample / name) in expanded  # every path, not the folded count
        _send(terminal, "/expand 2")
        terminal.wait_for(r"No tool result '2': they are numbered 1 to 1\.")
        _send(terminal, "/exit")
        assert terminal.wait_exit() == 0
        screen = terminal.screen()
    session_id = screen.split("Session ")[-1].split()[0]
    assert f"warren --resume {session_id}" in screen.replace("\n", " ")
    assert (tmp_path / "state" / "warren" / "sessions" / f"{session_id}.jsonl").is_file()
    assert "Traceback" not in screen
    deadline = time.monotonic() + 20
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(family) == []


def test_an_edit_shows_its_diff_and_y_applies_it(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    money = sample / "shop" / "money.py"
    replies = [
        Reply.tool_use("Read", {"file_path": str(money)}),
        Reply.tool_use(
            "Edit",
            {
                "file_path": str(money),
                "old_string": "def legacy_round(",
                "new_string": "def round_money(",
            },
        ),
        Reply.text("Renamed it."),
    ]
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "rename legacy_round")
        screen = terminal.wait_for(r"\[y\] yes")
        assert f"Allow Edit({money})?" in screen
        assert "-def legacy_round(" in screen and "+def round_money(" in screen
        assert "def round_money(" not in money.read_text()  # nothing ran before the answer
        terminal.type("y")
        terminal.wait_for(r"Renamed it\.")
        assert "def round_money(" in money.read_text()
        assert "✓ Edit(" in terminal.screen()


def test_no_with_a_reason_reaches_the_model_and_stops_the_rest_of_the_batch(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    replies = [
        Reply(content=[
            {"type": "tool_use", "name": "Bash",
             "input": {"command": "touch first.txt", "description": "make the first file"}},
            {"type": "tool_use", "name": "Bash", "input": {"command": "touch second.txt"}},
        ]),
        Reply.text("Understood."),
    ]  # fmt: skip
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "make two files")
        screen = terminal.wait_for(r"\[a\] always allow Bash\(touch")
        assert "touch first.txt" in screen and "make the first file" in screen
        terminal.type("n")
        terminal.wait_for(r"reason for the model")
        _send(terminal, "not in this repo")
        terminal.wait_for(r"Understood\.")
        follow_up = _texts(api.requests[-1])
    assert "not in this repo" in follow_up
    assert "the user rejected an earlier tool call in this batch" in follow_up
    assert not (sample / "first.txt").exists() and not (sample / "second.txt").exists()


def test_always_for_bash_saves_the_rule_it_shows(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    replies = [
        Reply.tool_use("Bash", {"command": "touch made.txt"}),
        Reply.tool_use("Bash", {"command": "touch made.txt"}),
        Reply.text("Made twice."),
    ]
    # No `.warren/` yet: the coordinator makes it while a writable sandbox runs, and that
    # sandbox's guard keeps the coordinator's own write (sandbox.guard.coordinator_writes).
    assert not (sample / ".warren").exists()
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "make files")
        screen = terminal.wait_for(r"\[a\] always allow Bash\(touch[^)]*\) here")
        rule = re.search(r"always allow (Bash\(touch[^)]*\)) here", screen)
        assert rule is not None
        terminal.type("a")
        terminal.wait_for(r"Made twice\.")  # the second call was not asked
        screen = terminal.screen()
    assert screen.count("[y] yes") == 1
    assert (sample / "made.txt").exists()
    local = (sample / ".warren" / "policy.local.toml").read_text()
    assert json.dumps(rule[1]) in local  # the rule shown is the rule saved


def test_esc_stops_a_running_command_and_the_session_goes_on(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    replies = [
        Reply.tool_use("Bash", {"command": "sleep 30", "description": "wait"}),
        Reply.text("Carrying on."),
    ]
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample, "--allowed-tools", "Bash(sleep:*)")
        _send(terminal, "wait a while")
        terminal.wait_for(r"sleep 30")
        terminal.type("go on")  # typed ahead: echoed under the spinner, not sent yet
        terminal.wait_for(r"esc to interrupt\n> go on")
        pressed = time.monotonic()
        terminal.press("Escape")
        terminal.wait_for(r"Interrupted\.")
        took = time.monotonic() - pressed
        terminal.wait_for(r"\n> go on$")  # the next prompt starts with it
        assert "stopped after" in terminal.screen()
        terminal.press("Enter")
        terminal.wait_for(r"Carrying on\.")
        resumed = _texts(api.requests[-1])
    print(f"Esc to the interrupted line: {took:.2f} s")
    assert took < 2, f"Esc took {took:.1f} s"
    assert "Interrupted: the run was cancelled while this tool call was running" in resumed
    assert "go on" in resumed


def test_compact_and_an_unknown_command(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    replies = [Reply.text("Hello."), Reply.text("<summary>We said hello.</summary>")]
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "hi")
        terminal.wait_for(r"Hello\.")
        terminal.wait_for(PROMPT)
        _send(terminal, "/compact keep the greeting")
        terminal.wait_for(r"Compacted: ~[\d,]+ → ~[\d,]+ tokens")
        assert "keep the greeting" in _texts(api.requests[-1])
        _send(terminal, "/cots")
        terminal.wait_for(r"Unknown command /cots\. Did you mean /cost\?")
        _send(terminal, "/context")
        terminal.wait_for(r"of 200,000 tokens")


def test_a_bang_command_runs_in_the_workspace_and_joins_the_conversation(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    with FakeMessagesAPI([Reply.text("Seen it."), Reply.text("Gone.")]) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "!echo bang > bang.txt && ls")
        terminal.wait_for(r"bang\.txt")
        terminal.wait_for(PROMPT)
        assert (sample / "bang.txt").read_text() == "bang\n"
        _send(terminal, "what did I run?")
        terminal.wait_for(r"Seen it\.")
        sent = _texts(api.requests[-1])
        # The command was a writing turn of its own (issue 17, item 4): /undo takes it back.
        terminal.wait_for(PROMPT)
        _send(terminal, "/undo")
        terminal.wait_for(r"Undid turn 1: removed bang\.txt\.")
        assert not (sample / "bang.txt").exists()
        _send(terminal, "/undo")
        terminal.wait_for(r"Every writing turn was undone already; nothing changed\.")
        terminal.wait_for(PROMPT)
        _send(terminal, "and now?")
        terminal.wait_for(r"Gone\.")
        told = _texts(api.requests[-1])
    assert "<bash-input>echo bang > bang.txt && ls</bash-input>" in sent
    assert "(The user ran /undo, which undid turn 1: removed bang.txt.)" in told


def test_ctrl_c_twice_at_an_empty_prompt_exits(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    with FakeMessagesAPI([]) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        terminal.press("C-c")
        terminal.wait_for(r"press Ctrl-C again to exit")
        terminal.press("C-c")
        assert terminal.wait_exit() == 0
        assert "warren --resume" in terminal.screen()


def test_a_first_prompt_on_the_command_line_and_an_untrusted_repository(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    (sample / ".warren").mkdir()
    (sample / ".warren" / "policy.toml").write_text('[permissions]\nallow = ["Bash(touch:*)"]\n')
    with FakeMessagesAPI([Reply.text("Straight away.")]) as api:
        terminal = _start(terminals, tmp_path, api, sample, "start here")
        screen = terminal.wait_for(r"Straight away\.")
        assert "This repository is not trusted" in screen
        assert "> start here" in screen
        terminal.press("C-d")
        assert terminal.wait_exit() == 0


def test_three_subagents_show_three_live_rows_then_one_line(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    areas = ["billing", "catalog", "shipping"]
    main = [
        Reply(
            content=[
                {
                    "type": "tool_use",
                    "name": "dispatch_agent",
                    "input": {"description": f"survey {area}", "prompt": f"[survey:{area}] go"},
                }
                for area in areas
            ]
        ),
        Reply.text("All three reported."),
    ]
    seen: dict[str, int] = {}

    def route(request: RecordedRequest) -> Reply | None:
        first = json.dumps(request.messages[:1])
        for area in areas:
            if f"[survey:{area}]" in first:
                seen[area] = seen.get(area, 0) + 1
                if seen[area] == 1 and area == "billing":  # asks: the user's policy says so
                    return Reply.tool_use("Read", {"file_path": str(sample / "shop/money.py")})
                if seen[area] == 1:
                    return Reply.tool_use("Glob", {"pattern": f"shop/{area}/*.py"})
                return Reply.text(f"{area}: fine", hold_before_stop=True)
        return None

    (tmp_path / "config" / "warren").mkdir(parents=True)
    user_policy = tmp_path / "config" / "warren" / "policy.toml"
    user_policy.write_text('[permissions]\nask = ["Read(**/money.py)"]\n')
    with FakeMessagesAPI(main, route=route) as api:
        terminal = _start(terminals, tmp_path, api, sample)
        _send(terminal, "survey the shop")
        # The subagent's ask is a dialog like the main agent's, labelled with the subagent.
        dialog = terminal.wait_for(r"\[y\] yes", timeout=60)
        assert re.search(r"asked by subagent agent-[0-9a-f]{12} \(survey billing\)", dialog)
        assert f"Allow Read({sample / 'shop/money.py'})?" in dialog
        terminal.type("y")
        # All three rows at once, each with its worker's pid, while their replies are held.
        row = r"\n *[0-9a-f]{8} +survey AREA +.*\d+ +\d+\.?\d*k? +[\d.]+ ?m?s +\d+"
        deadline = time.monotonic() + 60
        while True:
            screen = terminal.screen(history=False)
            if all(re.search(row.replace("AREA", area), screen) for area in areas):
                break
            assert time.monotonic() < deadline, f"three live rows never showed:\n{screen}"
            time.sleep(0.1)
        live = screen
        api.release(3)
        screen = terminal.wait_for(r"All three reported\.", timeout=60)
    assert "agent" in live and "pid" in live
    assert re.search(r"◆ 3 subagents done \(3 completed\)", screen)
    assert "survey billing" not in screen.split("◆ 3 subagents done")[1]  # rows folded


def test_the_slash_commands(tmp_path: Path, sample: Path, terminals: list[Terminal]) -> None:
    """Each command says what it is about; /model, /clear, /init and /resume open another
    session (the mode chosen with /permissions carries over), /init's files stay."""
    with FakeMessagesAPI([Reply.text("First answer."), Reply.text("Second answer.")]) as api:
        terminal = _start(terminals, tmp_path, api, sample)

        def command(text: str, expected: str) -> str:
            _send(terminal, text)
            terminal.wait_for(expected, timeout=60)
            return terminal.wait_for(PROMPT, timeout=60)

        command("the first", r"First answer\.")
        command("/help", r"/mcp +the MCP servers")
        command("/permissions", r"Mode: default")
        command("/permissions accept-edits", r"Mode for this session: accept-edits")
        command("/policy", r"rules \(deny wins")
        command("/agents", r"general +builtin")
        command("/hooks", r"no hooks in force")
        command("/mcp", r"No MCP servers in force here")
        command("/doctor", r"floor: PROVEN")
        command("/model haiku", r"claude-haiku-4-5 · [^✻]*mode\s+accept-edits")
        command("/init", r"review it, then run `warren policy trust`")
        command("/clear", r"is kept; /resume finds it")
        command("/sessions", r"1 +[0-9a-f-]{36} .* the first")
        _send(terminal, "/resume")
        terminal.wait_for(r"resume which")
        _send(terminal, "1")
        terminal.wait_for(r"Resumed \d+ messages")
        command("and the second", r"Second answer\.")
        resumed = _texts(api.requests[-1])
    assert "the first" in resumed and "First answer." in resumed
    assert api.requests[-1].body["model"] == "claude-haiku-4-5"
    assert (sample / "WARREN.md").read_text().startswith("# shop")
    assert (sample / ".warren" / "policy.toml").is_file()


def test_mcp_prompts_are_commands_and_resources_complete_after_at(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    """A server's prompt is `/mcp__server__prompt ARGS` (Claude Code's name; `/server:prompt`
    too) and its text is sent as the prompt; `@server:` completes the server's resources, and
    the resource mentioned is read into the prompt."""
    server_dir = Path(tempfile.mkdtemp(prefix="warren-repl-mcp-", dir="/var/tmp"))
    try:
        shutil.copy(ROOT / "tests" / "kit" / "hostile_mcp_server.py", server_dir / "notes.py")
        (tmp_path / "config" / "warren").mkdir(parents=True)
        (tmp_path / "config" / "warren" / "policy.toml").write_text(
            f'[mcp.servers.notes]\ncommand = "{sys.executable}"\n'
            f'args = ["{server_dir / "notes.py"}"]\n'
        )
        replies = [Reply.text("Reviewed."), Reply.text("Again."), Reply.text("Noted.")]
        with FakeMessagesAPI(replies) as api:
            terminal = _start(terminals, tmp_path, api, sample)
            deadline = time.monotonic() + 60
            while not re.search(r"notes +ready", terminal.screen()):  # it starts in the floor
                assert time.monotonic() < deadline, terminal.screen()
                shown = terminal.screen().count("problem")
                _send(terminal, "/mcp")
                while terminal.screen().count("problem") == shown:
                    time.sleep(0.1)
            _send(terminal, "/help")
            terminal.wait_for(r"/mcp__notes__review +<path> +\(MCP\) Review a file\.\n")
            terminal.wait_for(PROMPT)
            terminal.type("/mcp__n")  # the completion menu under the line offers it
            terminal.wait_for(r"> /mcp__n\n +/mcp__notes__review +<path> +\(MCP\) Review a f")
            terminal.press("C-c")
            _send(terminal, "/mcp__notes__review shop/money.py")
            terminal.wait_for(r"Reviewed\.")
            _send(terminal, "/notes:review shop/cart.py")
            terminal.wait_for(r"Again\.")
            terminal.wait_for(PROMPT)
            terminal.type("what does @notes:no")
            # The completions come from the server (in a thread): a Tab before they are shown
            # finds nothing to complete, as a user's would, so wait for the menu.
            terminal.wait_for(r"@notes:notes://today +notes://today")
            terminal.press("Tab")  # one resource starts so: completed in place
            terminal.wait_for(r"> what does @notes:notes://today\n")
            _send(terminal, " say?")
            terminal.wait_for(r"Noted\.")
            sent = [_texts(request) for request in api.requests]
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
    assert "Review shop/money.py carefully." in sent[0]
    assert "Review shop/cart.py carefully." in sent[1]
    assert "remember the milk" in sent[2]  # the resource, read through the server


def test_tasks_shows_lists_tails_and_stops_background_work(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    """A background command started by the model shows in the prompt's toolbar while it runs;
    `/tasks` lists it, `/tasks ID` shows the end of its output, `/tasks stop ID` ends it and
    the toolbar line goes."""
    loop = "while true; do echo tock; sleep 0.2371; done"
    replies = [
        Reply.tool_use(
            "Bash", {"command": loop, "run_in_background": True, "description": "ticker"}
        ),
        Reply.text("Started the ticker."),
    ]
    with FakeMessagesAPI(replies) as api:
        terminal = _start(terminals, tmp_path, api, sample)

        def command(text: str, expected: str) -> str:
            _send(terminal, text)
            terminal.wait_for(expected, timeout=60)
            # The empty prompt line: the toolbar may be below it while a task runs.
            return terminal.wait_for(r"\n> ?(\n|$)", timeout=60)

        command("start a ticker", r"Started the ticker\.")
        terminal.wait_for(r"1 background task: bash-[0-9a-f]+ \(ticker\) · /tasks", timeout=30)
        listed = command("/tasks", r"bash-[0-9a-f]+ +shell +running")
        task_id = re.search(r"(bash-[0-9a-f]+) +shell +running", listed)
        assert task_id, listed
        command(f"/tasks {task_id[1]}", r"\.output\ntock")
        command(f"/tasks stop {task_id[1]}", rf"{task_id[1]} \(ticker\) was stopped\.")
        command("/tasks", rf"{task_id[1]} +shell +stopped")
        deadline = time.monotonic() + 10
        while "1 background task" in terminal.screen().splitlines()[-1]:
            assert time.monotonic() < deadline, terminal.screen()
            time.sleep(0.2)


TALLY = """\
META = {"name": "tally", "description": "Count in two places", "phases": ["Count"]}
N = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
phase("Count")
found = parallel([lambda p=p: agent(f"[count:{p}] Count the files.", schema=N, label=f"count {p}")
                  for p in ("a", "b")])
finish({"total": sum(f["n"] for f in found if f)})
"""


def test_a_saved_workflow_from_the_repl_shows_its_phases_and_reports(
    tmp_path: Path, sample: Path, terminals: list[Terminal]
) -> None:
    """`/workflow NAME` starts a saved workflow in the background; `/workflows` lists the
    run, `/workflows RUN_ID` shows its phase with each agent done, its tokens and cost; the
    next prompt carries its one notification with the result."""
    saved = tmp_path / "config" / "warren" / "workflows"
    saved.mkdir(parents=True)
    (saved / "tally.py").write_text(TALLY)

    def route(request: RecordedRequest) -> FakeResponse | None:
        content = request.messages[0]["content"]
        first = content if isinstance(content, str) else content[0].get("text", "")
        if not first.startswith("[count:"):
            return Reply.text("The tally is 5.")
        last = request.messages[-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return Reply.text("Counted.")
        n = 2 if first.startswith("[count:a]") else 3
        return Reply.tool_use("StructuredOutput", {"n": n})

    with FakeMessagesAPI(route=route) as api:
        terminal = _start(terminals, tmp_path, api, sample)

        def command(text: str, expected: str) -> str:
            _send(terminal, text)
            terminal.wait_for(expected, timeout=60)
            return terminal.wait_for(r"\n> ?(\n|$)", timeout=60)

        started = command("/workflow tally", r"Workflow tally started as (wf-[0-9a-f]{12})")
        run_id = re.search(r"started as (wf-[0-9a-f]{12})", started)
        assert run_id, started
        deadline = time.monotonic() + 90
        while True:
            listed = command("/workflows", rf"{run_id[1]} +\w+")
            if re.search(rf"{run_id[1]} +completed +tally: Count in two places", listed):
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.5)
        shown = command(f"/workflows {run_id[1]}", r"\[0\.1\.0\] count b")
        assert re.search(r"✓ \[0\.0\.0\] count a · 240 tokens · \$0\.\d{4}", shown), shown
        command("what did it find?", r"The tally is 5\.")
        [asked] = [r for r in api.requests if "what did it find?" in json.dumps(r.messages)]
        note = json.dumps(asked.messages)
        assert f"<task-id>{run_id[1]}</task-id>" in note and '\\"total\\": 5' in note
