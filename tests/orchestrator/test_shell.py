"""The persistent shell with real processes: state, timeouts, kills, output caps, one-shots.

Processes are found afterwards by a unique `sleep` argument (a marker), so the checks hold
however they were reparented.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.text import truncate_middle
from orchestrator.tools.shell import OutputCapture, PersistentShell, shell_environment

LIMIT = 30_000


def marker_sleep() -> tuple[str, str]:
    """A `sleep` whose argument is unique to this test: (command, marker)."""
    marker = f"1000.{secrets.randbelow(10**9):09d}"
    return f"sleep {marker}", marker


def processes_with(marker: str) -> list[psutil.Process]:
    """Live (not zombie) processes whose command line contains `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


def new_shell(cwd: Path) -> PersistentShell:
    return PersistentShell(cwd=cwd, env=shell_environment(), output_limit=LIMIT)


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncIterator[PersistentShell]:
    (tmp_path / "sub dir").mkdir()
    sh = new_shell(tmp_path)
    try:
        yield sh
    finally:
        await sh.aclose()


async def test_cwd_exports_and_functions_persist(shell: PersistentShell, tmp_path: Path) -> None:
    first = await shell.run(
        'cd "sub dir" && export GREETING="hi there" && greet() { echo "$GREETING"; }',
        timeout_s=10,
    )
    assert first.exit_code == 0
    assert first.cwd == tmp_path / "sub dir"

    second = await shell.run("pwd; greet", timeout_s=10)
    assert second.stdout == f"{tmp_path / 'sub dir'}\nhi there\n"
    # A child process sees the export too: it is in the environment, not just a shell variable.
    third = await shell.run("bash -c 'echo $GREETING'; unset GREETING", timeout_s=10)
    assert third.stdout == "hi there\n"
    fourth = await shell.run('echo "[${GREETING-unset}]"', timeout_s=10)
    assert fourth.stdout == "[unset]\n"


async def test_exit_ends_the_command_not_the_shell(shell: PersistentShell, tmp_path: Path) -> None:
    run = await shell.run('cd "sub dir"; exit 4', timeout_s=10)
    assert (run.exit_code, run.cwd, run.shell_reset) == (4, tmp_path / "sub dir", False)
    assert (await shell.run("pwd", timeout_s=10)).stdout == f"{tmp_path / 'sub dir'}\n"


async def test_stdout_stderr_and_exit_code_are_separate(shell: PersistentShell) -> None:
    run = await shell.run("echo out; echo err >&2; echo out2; exit 3", timeout_s=10)
    assert (run.stdout, run.stderr, run.exit_code) == ("out\nout2\n", "err\n", 3)
    assert (run.stdout_lines, run.stderr_lines) == (2, 1)


async def test_plain_non_interactive_environment(shell: PersistentShell) -> None:
    run = await shell.run(
        'echo "$GIT_EDITOR $PAGER $GIT_PAGER $LESS $TERM"; [ -t 0 ] || echo no-tty; '
        'read -r line; echo "read=$?"',
        timeout_s=10,
    )
    assert run.stdout == "true cat cat -FRX dumb\nno-tty\nread=1\n"


def test_environment_drops_colour_forcing_and_startup_files() -> None:
    env = shell_environment({"PATH": "/bin", "FORCE_COLOR": "1", "BASH_ENV": "/x", "PAGER": "less"})
    assert env["PATH"] == "/bin"
    assert env["PAGER"] == "cat"
    assert "FORCE_COLOR" not in env and "BASH_ENV" not in env


async def test_timeout_kills_a_tree_that_ignores_sigterm(shell: PersistentShell) -> None:
    sleep, marker = marker_sleep()
    await shell.run('cd "sub dir"', timeout_s=10)
    run = await shell.run(f"echo started; trap '' TERM; {sleep} & {sleep}", timeout_s=1.0)
    assert run.timed_out
    assert run.exit_code == 137  # SIGKILL: SIGTERM was ignored
    assert run.stdout == "started\n"
    assert processes_with(marker) == []
    # The shell lives on with its state.
    after = await shell.run("echo alive; pwd", timeout_s=10)
    assert not after.shell_reset
    assert after.stdout.startswith("alive\n") and after.stdout.endswith("sub dir\n")


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) so the next reading covers only what follows."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss() -> int:
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


async def test_huge_output_is_capped_in_bounded_memory(shell: PersistentShell) -> None:
    if not reset_peak_rss():
        pytest.skip("cannot reset the peak RSS here")
    rss_before = psutil.Process().memory_info().rss

    run = await shell.run("head -c 50000000 /dev/zero | tr '\\0' a", timeout_s=60)

    assert peak_rss() - rss_before < 20_000_000
    assert run.exit_code == 0
    assert run.stdout == truncate_middle("a" * 50_000_000, LIMIT)
    assert "[... 49970000 characters (0 lines) removed from the middle" in run.stdout


async def test_background_job_does_not_keep_the_call_alive(tmp_path: Path) -> None:
    sleep, marker = marker_sleep()
    shell = new_shell(tmp_path)
    try:
        run = await shell.run(f"{sleep} & echo $!", timeout_s=10)
        assert (run.exit_code, run.timed_out) == (0, False)
        job = psutil.Process(int(run.stdout))
        assert job.status() != psutil.STATUS_ZOMBIE  # still running, as asked
        # A background job that writes without end does not hold the call either.
        # (It starts writing after the echo, so the output's head is deterministic.)
        chatty = await shell.run("(sleep 0.2; exec yes) & echo started", timeout_s=10)
        assert (chatty.exit_code, chatty.timed_out) == (0, False)
        assert chatty.stdout.startswith("started\n")
    finally:
        await shell.aclose()
    # Closing the session ends its background jobs.
    assert not job.is_running() or job.status() == psutil.STATUS_ZOMBIE
    assert processes_with(marker) == []


async def test_cancellation_kills_the_command_and_keeps_the_shell(shell: PersistentShell) -> None:
    sleep, marker = marker_sleep()
    with trio.move_on_after(0.5) as scope:
        await shell.run(sleep, timeout_s=60)
    assert scope.cancelled_caught
    assert processes_with(marker) == []
    assert [p.pid for p in psutil.Process().children(recursive=True)] == [shell.pid]
    assert (await shell.run("echo ok", timeout_s=10)).stdout == "ok\n"


async def test_a_killed_shell_is_replaced_with_a_note(
    shell: PersistentShell, tmp_path: Path
) -> None:
    await shell.run('cd "sub dir"; export KEPT=1', timeout_s=10)
    died = await shell.run("kill -9 $$", timeout_s=10)
    assert died.exit_code is None
    assert died.shell_reset
    after = await shell.run('pwd; echo "[${KEPT-}]"', timeout_s=10)
    assert after.stdout == f"{tmp_path / 'sub dir'}\n[]\n"  # cwd kept, exports reset
    assert not after.shell_reset


async def test_a_shell_killed_between_calls_is_replaced(shell: PersistentShell) -> None:
    await shell.run("true", timeout_s=10)
    assert shell.pid is not None
    psutil.Process(shell.pid).kill()
    run = await shell.run("echo fresh", timeout_s=10)
    assert (run.stdout, run.shell_reset) == ("fresh\n", True)


async def test_oneshot_starts_from_the_shell_state_and_changes_nothing(
    shell: PersistentShell, tmp_path: Path
) -> None:
    await shell.run('cd "sub dir"; export FROM_SHELL=1; f() { echo fn; }', timeout_s=10)
    run = await shell.run_oneshot("pwd; echo $FROM_SHELL; f; cd /; export LEAK=1", timeout_s=10)
    assert run.stdout == f"{tmp_path / 'sub dir'}\n1\nfn\n"
    after = await shell.run('pwd; echo "[${LEAK-}]"', timeout_s=10)
    assert after.stdout == f"{tmp_path / 'sub dir'}\n[]\n"


async def test_oneshot_can_follow_another_shells_state(
    shell: PersistentShell, tmp_path: Path
) -> None:
    await shell.run('cd "sub dir"; export FROM_SHELL=1', timeout_s=10)
    follower = new_shell(tmp_path)
    try:
        follower.adopt_state(cwd=shell.cwd, snapshot=shell.snapshot)
        run = await follower.run_oneshot("pwd; echo $FROM_SHELL", timeout_s=10)
        assert run.stdout == f"{tmp_path / 'sub dir'}\n1\n"
        assert follower.pid is None  # its own persistent bash never started
    finally:
        await follower.aclose()


async def test_oneshot_timeout_and_background_jobs_leave_nothing(shell: PersistentShell) -> None:
    sleep, marker = marker_sleep()
    run = await shell.run_oneshot(f"trap '' TERM; {sleep} & {sleep}", timeout_s=0.5)
    assert run.timed_out
    assert processes_with(marker) == []
    sleep, marker = marker_sleep()
    run = await shell.run_oneshot(f"{sleep} & echo started", timeout_s=10)
    assert (run.stdout, run.timed_out) == ("started\n", False)
    assert processes_with(marker) == []


ESCAPES = {
    "setsid": "setsid {sleep} >/dev/null 2>&1 &",
    "double fork": "( {sleep} >/dev/null 2>&1 & ) ",
    "nohup": "nohup {sleep} >/dev/null 2>&1 &",
    "setsid double fork": "( setsid {sleep} >/dev/null 2>&1 & ) ",
    "disowned": "{sleep} >/dev/null 2>&1 & disown",
}


@pytest.mark.parametrize("escape", list(ESCAPES), ids=list(ESCAPES))
@pytest.mark.parametrize("end", ["returns", "times out", "cancelled"])
async def test_nothing_a_oneshot_starts_outlives_it(
    shell: PersistentShell, escape: str, end: str
) -> None:
    """A process that left the one-shot's process group and parent (setsid, a double fork)
    is gone when the call returns, times out or is cancelled: checked on the host."""
    sleep, marker = marker_sleep()
    started = ESCAPES[escape].format(sleep=sleep)
    if end == "returns":
        run = await shell.run_oneshot(f"{started}\necho started", timeout_s=10)
        assert (run.stdout, run.timed_out) == ("started\n", False)
    elif end == "times out":
        run = await shell.run_oneshot(f"{started}\nsleep 30", timeout_s=0.5)
        assert run.timed_out
    else:
        with trio.move_on_after(0.5) as scope:
            await shell.run_oneshot(f"{started}\nsleep 30", timeout_s=10)
        assert scope.cancelled_caught
    assert processes_with(marker) == []
    # The next call is not disturbed, and its own escapee goes the same way.
    sleep, marker = marker_sleep()
    command = ESCAPES[escape].format(sleep=sleep) + "\necho next"
    run = await shell.run_oneshot(command, timeout_s=10)
    assert run.stdout == "next\n"
    assert processes_with(marker) == []


async def test_a_oneshot_keeps_its_exit_status(shell: PersistentShell) -> None:
    run = await shell.run_oneshot("(setsid sleep 300 &); exit 7", timeout_s=10)
    assert run.exit_code == 7


async def test_syntax_error_is_reported_without_running(
    shell: PersistentShell, tmp_path: Path
) -> None:
    error = await shell.syntax_error(f"touch {tmp_path / 'ran'}; if")
    assert error is not None and "syntax error" in error
    assert not (tmp_path / "ran").exists()
    assert await shell.syntax_error("echo 'fine'") is None


async def test_aclose_reaps_everything(tmp_path: Path) -> None:
    shell = new_shell(tmp_path)
    await shell.run("sleep 1000 &", timeout_s=10)
    await shell.aclose()
    assert psutil.Process().children(recursive=True) == []
    with pytest.raises(Exception, match="closed"):
        await shell.run("true", timeout_s=10)


@given(
    text=st.text(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    limit=st.integers(min_value=1, max_value=40),
)
def test_capture_matches_truncate_middle(text: str, cuts: list[int], limit: int) -> None:
    data = text.encode()
    capture = OutputCapture(limit)
    start = 0
    for cut in sorted(cuts):
        capture.feed(data[start:cut])
        start = max(start, cut)
    capture.feed(data[start:])
    assert capture.text() == truncate_middle(text, limit)


def test_capture_counts_lines() -> None:
    data = "a\nb\n" * 1000 + "tail"
    capture = OutputCapture(10)
    capture.feed(data.encode())
    assert capture.line_count == 2001
    assert capture.text() == truncate_middle(data, 10)
    assert "(1997 lines) removed" in capture.text()
