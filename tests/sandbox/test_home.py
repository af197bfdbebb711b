"""The hidden home and Warren's own code, attacked from inside real sandboxes.

Secrets by default, not by list: with a fake home outside /tmp (sandboxes have a private
/tmp, which would hide a /tmp home for the wrong reason) holding every credential file we
know of, nothing in a sandbox can read one, whatever tool it uses, while toolchains and caches
under that home still work and a workspace under it stays writable. And a sandbox cannot
change the code the coordinator imports at its next start.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from sandbox.host import SandboxHost
from sandbox.masks import gather_host_facts, sanitise_gitconfig, warren_code_paths
from sandbox.run import run_sandboxed
from sandbox.spec import Limits, SandboxSpec, WorkspaceRoot

REPO = Path(__file__).resolve().parents[2]

CREDENTIALS = (
    ".claude/.credentials.json",
    ".config/git/credentials",
    ".git-credentials",
    ".bash_history",
    ".zsh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".pgpass",
    ".config/gh/hosts.yml",
    ".config/github-copilot/hosts.json",
    ".config/github-copilot/apps.json",
    ".gem/credentials",
    ".local/share/gem/credentials",
    ".terraform.d/credentials.tfrc.json",
    ".terraformrc",
    ".config/rclone/rclone.conf",
    ".cache/huggingface/token",
    ".huggingface/token",
    ".m2/settings.xml",
    ".m2/settings-security.xml",
    ".codex/auth.json",
    ".ssh/id_ed25519",
    ".aws/credentials",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".docker/config.json",
    ".kube/config",
    ".cargo/credentials.toml",
    ".ray/auth_token",
)
"""Credential files planted in the fake home (issue 9, item 7, and the older list)."""

SECRET = "SECRET-hunter2-7f3a"


@pytest.fixture
def home(scratch: Path) -> Path:
    home = scratch / "home"
    for rel in CREDENTIALS:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{SECRET} {rel}\n")
        path.chmod(0o600)
    # Toolchains and caches that must keep working.
    tool = home / ".local" / "bin" / "mytool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho toolchain-ok\n")
    tool.chmod(0o755)
    cached = home / ".cache" / "pip" / "wheels" / "w.txt"
    cached.parent.mkdir(parents=True)
    cached.write_text("cache-ok\n")
    (home / ".m2" / "repository").mkdir(parents=True)
    (home / ".m2" / "repository" / "a.pom").write_text("pom-ok\n")
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Dev Eloper\n\temail = dev@example.com\n"
        "[credential]\n\thelper = store\n"
        f'[http "https://example.com"]\n\textraHeader = Authorization: {SECRET}\n'
        f'[url "https://x:{SECRET}@example.com/"]\n\tinsteadOf = https://example.com/\n'
        "[core]\n\tfsmonitor = /bin/false\n\tautocrlf = input\n"
        "[include]\n\tpath = ~/.secret-git\n"
    )
    return home


def _spec(ws: Path, home: Path, mode: str = "ro", **extra: object) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {
            "workspaces": (WorkspaceRoot.model_validate({"path": ws, "mode": mode}),),
            "home": home,
            "limits": Limits(wall_time_s=30.0),
            **extra,
        }
    )


READERS = {
    "cat": 'for f in {files}; do cat "$f"; done',
    "grep": 'grep -r hunter2 "$HOME" {files}',
    "find": 'find "$HOME" -type f -exec cat {{}} +',
    "python": (
        "python3 -c 'import os,sys\n"
        'for r,_,fs in os.walk(os.environ["HOME"]):\n'
        '  [sys.stdout.write(open(os.path.join(r,f),errors="replace").read()) for f in fs]\''
    ),
    "ls": 'ls -laR "$HOME"; ls -la {files}',
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("mode", ["ro", "rw"])
async def test_no_credential_file_is_readable(
    host: SandboxHost, scratch: Path, home: Path, reader: str, mode: str
) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    files = " ".join(str(home / rel) for rel in CREDENTIALS)
    script = READERS[reader].format(files=files)
    if shutil.which("rg"):
        script += f'; rg -uuu hunter2 "$HOME" {files}'
    done = await run_sandboxed(_spec(ws, home, mode), ["/bin/sh", "-c", script], host=host)
    output = done.stdout + done.stderr
    assert SECRET.encode() not in output
    assert b"hunter2" not in done.stdout
    for rel in CREDENTIALS:  # the host files are untouched
        assert (home / rel).read_text() == f"{SECRET} {rel}\n"


async def test_toolchains_caches_and_sanitised_gitconfig_stay(
    host: SandboxHost, scratch: Path, home: Path
) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    script = (
        '"$HOME/.local/bin/mytool"; cat "$HOME/.cache/pip/wheels/w.txt" '
        '"$HOME/.m2/repository/a.pom"; cat "$HOME/.gitconfig"; '
        "git config --global user.name; git config --global credential.helper || echo no-helper"
    )
    done = await run_sandboxed(_spec(ws, home), ["/bin/sh", "-c", script], host=host)
    out = done.stdout.decode()
    assert "toolchain-ok" in out and "cache-ok" in out and "pom-ok" in out, done
    assert "Dev Eloper" in out and "no-helper" in out
    assert SECRET not in out and "fsmonitor" not in out and "include" not in out
    assert "autocrlf" in out


async def test_home_allow_adds_a_path_read_only(
    host: SandboxHost, scratch: Path, home: Path
) -> None:
    ws = scratch / "ws"
    ws.mkdir()
    extra = home / ".config" / "sometool"
    extra.mkdir(parents=True)
    (extra / "settings").write_text("allowed-ok\n")
    script = 'cat "$HOME/.config/sometool/settings"; echo x > "$HOME/.config/sometool/new" || :'
    done = await run_sandboxed(
        _spec(ws, home, "rw", extra_home_allow=("~/.config/sometool",)),
        ["/bin/sh", "-c", script],
        host=host,
    )
    assert "allowed-ok" in done.stdout.decode(), done
    assert not (extra / "new").exists()
    hidden = await run_sandboxed(
        _spec(ws, home), ["/bin/sh", "-c", 'cat "$HOME/.config/sometool/settings"'], host=host
    )
    assert b"allowed-ok" not in hidden.stdout


async def test_workspace_under_the_home_stays_writable(
    host: SandboxHost, scratch: Path, home: Path
) -> None:
    ws = home / "src" / "project"
    ws.mkdir(parents=True)
    (ws / "a.txt").write_text("old\n")
    script = f'echo new > {ws}/a.txt; cat "$HOME/.pgpass"; cat {home}/.bash_history'
    done = await run_sandboxed(_spec(ws, home, "rw"), ["/bin/sh", "-c", script], host=host)
    assert (ws / "a.txt").read_text() == "new\n"
    assert SECRET.encode() not in done.stdout + done.stderr


async def test_python_runtime_under_the_home_still_runs(
    host: SandboxHost, scratch: Path, home: Path
) -> None:
    """Warren's own interpreter may live in the home (~/.pyenv, a venv under ~): it is bound
    back, so the tool host and workers still start."""
    ws = scratch / "ws"
    ws.mkdir()
    fake_runtime = home / "venvs" / "tool" / "bin"  # not in the default allow list
    fake_runtime.mkdir(parents=True)
    spec = _spec(ws, home)
    facts = gather_host_facts(spec, runtime=[fake_runtime])
    assert any(b.path == fake_runtime.resolve() and b.mode == "ro" for b in facts.binds)
    done = await run_sandboxed(spec, [sys.executable, "-I", "-c", "print('py-ok')"], host=host)
    assert done.stdout.strip() == b"py-ok"


def test_the_home_that_is_the_workspace_stays_visible(scratch: Path, home: Path) -> None:
    facts = gather_host_facts(_spec(home, home, "rw"))
    assert facts.home_mask is None
    assert home / ".netrc" in facts.deny_files  # the list still masks what it names


@pytest.mark.parametrize(
    ("text", "kept", "dropped"),
    [
        ("[user]\n name = A\n[credential]\n helper = store\n", ["name = A"], ["helper"]),
        ('[credential "https://x"]\n helper = !cat /x\n', [], ["helper"]),
        (
            "[core]\n fsmonitor = ./x.sh\n hooksPath = h\n editor = vi\n",
            [],
            ["fsmonitor", "hooksPath"],
        ),
        ('[includeIf "gitdir:~/"]\n path = s\n[include]\n path = t\n', [], ["path"]),
        (
            '[http]\n extraHeader = Authorization: t\n[url "https://t@x"]\n insteadOf = y\n',
            [],
            ["t@x", "Authorization"],
        ),
        (
            "[alias]\n st = status \\\n  --short\n[core]\n sshCommand = a \\\n  b\n",
            ["--short"],
            ["sshCommand", "  b"],
        ),
    ],
)
def test_sanitised_gitconfig(scratch: Path, text: str, kept: list[str], dropped: list[str]) -> None:
    source = scratch / "gitconfig"
    source.write_text(text)
    copy = sanitise_gitconfig(source, scratch / "out")
    assert copy is not None
    out = copy.read_text()
    for word in kept:
        assert word in out
    for word in dropped:
        assert word not in out
    assert sanitise_gitconfig(source, scratch / "out") == copy  # one copy per content


async def test_warrens_own_code_is_read_only_in_a_writable_workspace(host: SandboxHost) -> None:
    """The workspace is Warren's own checkout (with its .venv): a writable sandbox cannot
    change what the coordinator imports at its next start."""
    code = warren_code_paths()
    assert REPO / "orchestrator" in code
    init = REPO / "orchestrator" / "__init__.py"
    before = init.read_bytes()
    planted = REPO / "orchestrator" / "planted_by_sandbox.py"
    venv_file = Path(sys.prefix) / "planted-by-sandbox"
    script = (
        f"printf 'import os\\n' >> {init}; echo rc_init=$?; "
        f"echo x > {planted}; echo rc_new=$?; "
        f"echo x > {venv_file}; echo rc_venv=$?; "
        f"mv {REPO}/orchestrator {REPO}/orchestrator-moved; echo rc_mv=$?; "
        f"echo ok > {REPO}/scratch-from-sandbox; echo rc_ws=$?"
    )
    spec = SandboxSpec(
        workspaces=(WorkspaceRoot(path=REPO, mode="rw"),), limits=Limits(wall_time_s=30.0)
    )
    try:
        done = await run_sandboxed(spec, ["/bin/sh", "-c", script], host=host)
        out = done.stdout.decode()
        assert "rc_init=0" not in out and "rc_new=0" not in out and "rc_mv=0" not in out, out
        if REPO in Path(sys.prefix).parents:
            assert "rc_venv=0" not in out, out
        assert "rc_ws=0" in out, out  # the rest of the workspace is writable as before
        assert init.read_bytes() == before
        assert not planted.exists()
        assert (REPO / "orchestrator").is_dir()
    finally:
        for path in (planted, REPO / "scratch-from-sandbox"):
            path.unlink(missing_ok=True)
        if REPO in Path(sys.prefix).parents:
            venv_file.unlink(missing_ok=True)
        moved = REPO / "orchestrator-moved"
        if moved.is_dir():
            moved.rename(REPO / "orchestrator")
