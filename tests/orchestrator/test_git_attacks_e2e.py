"""Auto-approved git never runs a program a repository configured (issue 33, class 1), through
the real `warren` CLI: real sandboxes, the real SDK against the fake Messages API.

A workspace holds three carriers of each attack: a nested repository, a gitlink (a repository
recorded in the workspace's index) and a linked worktree (its settings in its own
`config.worktree`, but for its alias: git reads aliases before it reads that file). Each
configures every code-running setting git reads from a repository, each naming a program of
its own that writes a marker file into an extra root outside the workspace (`--add-dir`,
writable to a sandbox that may write) and prints a marker (a read-only one-shot's sandbox can
write nowhere: there the printed marker shows a program ran). Each attack is first shown to
work with a plain git on the host, so the test can fail. Then, in one run, the model runs the
read-only git commands that trigger them, which Warren runs without asking:

- `status` (`core.fsmonitor`; `core.hooksPath`, whose `post-index-change` hook runs when
  `status` rewrites the index, which a read-only one-shot never does),
- `log --show-signature` over an OpenPGP-, an SSH- and an X.509-signed commit (`gpg.program`,
  `gpg.ssh.program`, `gpg.x509.program`; `gpg.openpgp.program` from an included file),
- `remote show` (`core.sshCommand` for ssh://; `credential.helper` and `core.askPass`, asked
  for a client certificate's password before any connection, offline; `core.gitProxy` for
  git://; an `ext::` remote with `protocol.allow=always`),
- `rev-list --alternate-refs` (`core.alternateRefsCommand`),
- `include.path` and `includeIf.gitdir:` files carrying them,
- at the root, `status --ignore-submodules=none` and `diff-files -p`, which run git in each
  gitlink (with the neutral settings, which it inherits).

No marker reaches a tool result or the host. Where no command Warren approves runs the setting
(`core.pager` pages only on a terminal and a one-shot's output is a pipe; `core.editor` and
`sequence.editor` run only for commands that write; `core.hooksPath` above; git reads
`uploadpack.packObjectsHook` only from the user's and the system's configuration, and runs it
only when serving a fetch), the attack is shown live on the host (a pager on a pty, `commit`,
`rebase -i`, `status`, a clone) and the sandboxed git reports the neutral value (`git var
GIT_PAGER`/`GIT_EDITOR`, `git config --get sequence.editor`, `git rev-parse --git-path hooks`;
no pack-objects hook from the user's configuration). A `!` alias is not a read-only git
command: it asks (denied headless), as do spellings that would drop the neutral settings
(`env -i`, `env -u GIT_CONFIG_COUNT`).

A repository that configures a driver's program (`diff.<d>.textconv`) or `diff.external`, which
no fixed override reaches, makes git ask instead (denied headless, with the reason); one
configured after start-up (in a file the repository includes from outside the workspace), in a
nested repository, a gitlink or a worktree, is refused when the command runs, and git named by
its path (`/usr/bin/git`, `command -p git`), which would skip that check, asks.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kit.fake_api import FakeMessagesAPI, Reply
from tests.kit.floor import needs_sandbox
from tests.kit.git_repo import git, make_repo

pytestmark = needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
WARREN = [sys.executable, "-m", "orchestrator.cli"]
SIGNATURES = {
    "pgp": ("PGP SIGNATURE", "iQEzBAABCAAdFiEEsignaturesignaturesignaturesignatureAAoJEAAAAAAAAAA"),
    "ssh": ("SSH SIGNATURE", "U1NIU0lHAAAAAQAAADMAAAALc3NoLWVkMjU1MTk="),
    "x509": ("SIGNED MESSAGE", "MIIBsignaturesignaturesignature"),
}
"""A bogus signature of each format git verifies, by the program of that format."""
NEUTRAL_VIEW = "cat\nfalse\nfalse\n/dev/null"
"""What the sandboxed git reports for `GIT_PAGER`, `GIT_EDITOR`, `sequence.editor` and the
hooks directory (`sandbox.git_safety.NEUTRAL`), whatever the repository says."""


@pytest.fixture
def place() -> Iterator[Path]:
    """The workspace, the fake home, the planted programs and the extra root, outside /tmp
    (every sandbox has a private /tmp)."""
    root = Path("/var/tmp") / f"warren-git-{uuid.uuid4().hex[:10]}"
    for part in ("home", "bin", "extra", "state"):
        (root / part).mkdir(parents=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _program(path: Path, place: Path, name: str) -> str:
    """A program at `path` that drops a file of that name in the extra root and prints
    `MARKER-name` (in this order: whoever reads its output may be gone)."""
    path.write_text(
        f"#!/bin/sh\ntouch {place / 'extra' / name}\n"
        f"echo MARKER-{name}\necho MARKER-{name} >&2\nexit 1\n"
    )
    path.chmod(0o755)
    return str(path)


def _evil(place: Path, name: str) -> str:
    return _program(place / "bin" / f"evil-{name}", place, name)


def _host_git(cwd: Path, *args: str, home: Path | None = None, tty: bool = False) -> None:
    """A plain git on the host (the attack must work there, else the test proves nothing),
    with no `GIT_*` of ours; on a pseudo-terminal when `tty` (git pages only there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"HOME": str(home or cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    argv = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    if not tty:
        subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=30)
        return
    leader, follower = pty.openpty()
    try:
        subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
            timeout=30,
        )  # fmt: skip
    finally:
        os.close(follower)
        os.close(leader)


def _live(
    place: Path,
    names: str | tuple[str, ...],
    cwd: Path,
    *args: str,
    home: Path | None = None,
    tty: bool = False,
) -> None:
    """The host git command runs each program `names` names (their marker files appear)."""
    _host_git(cwd, *args, home=home, tty=tty)
    for name in (names,) if isinstance(names, str) else names:
        marker = place / "extra" / name
        assert marker.exists(), f"{name}: the attack does not work on this git ({args})"
        marker.unlink()


def _clear_markers(place: Path) -> None:
    """One host check can fire another's program too (a `status` runs the fsmonitor)."""
    for marker in (place / "extra").iterdir():
        marker.unlink()


def _repo(path: Path) -> Path:
    """A repository with README.md and clean.txt committed (clean.txt stays unchanged: a new
    mtime alone makes `status` refresh, and so rewrite, the index)."""
    make_repo(path)
    (path / "clean.txt").write_text("clean\n")
    git(path, "add", "clean.txt")
    git(path, "commit", "-q", "-m", "clean")
    return path


def _sign(repo: Path, kind: str) -> None:
    """HEAD becomes a child commit with a (bogus) signature of `kind` (`SIGNATURES`), whose
    message is `<kind> signed`: `log --show-signature` runs that format's program."""
    header, body = SIGNATURES[kind]
    tree = subprocess.run(["git", "write-tree"], cwd=repo, capture_output=True, text=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    text = (
        f"tree {tree.stdout.strip()}\nparent {head.stdout.strip()}\n"
        "author t <t@t> 1700000000 +0000\ncommitter t <t@t> 1700000000 +0000\n"
        f"gpgsig -----BEGIN {header}-----\n \n {body}\n -----END {header}-----\n\n{kind} signed\n"
    )
    made = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
        cwd=repo, input=text, capture_output=True, text=True, check=True,
    )  # fmt: skip
    git(repo, "update-ref", "HEAD", made.stdout.strip())


@dataclass(frozen=True)
class Carrier:
    """A repository the workspace holds, carrying the attacks."""

    name: str
    """Its directory below the workspace."""
    tag: str
    """`n` (nested), `g` (gitlink) or `w` (worktree), `2` added for the included files'
    carriers: the suffix of its markers."""
    git_dir: Path
    """Where its objects live (a worktree's: the workspace repository's)."""
    worktree: bool = False
    """Its settings go to its own `config.worktree`."""

    def set(self, path: Path, key: str, value: str) -> None:
        where = ["--worktree"] if self.worktree else []
        git(path / self.name, "config", *where, key, value)


def _workspace(place: Path) -> tuple[Path, list[Carrier], list[Carrier]]:
    """The workspace repository with a nested repository, a gitlink and a linked worktree for
    the direct settings (`vendor`, `sub`, `wt`) and three more for the included ones
    (`vendor2`, `sub2`, `wt2`): (workspace, direct carriers, included carriers)."""
    ws = _repo(place / "ws")
    git(ws, "config", "extensions.worktreeConfig", "true")
    for name in ("vendor", "vendor2", "sub", "sub2"):
        _repo(ws / name)
    git(ws, "add", "sub", "sub2")
    git(ws, "commit", "-q", "-m", "gitlinks")
    for name in ("wt", "wt2"):
        git(ws, "worktree", "add", "-q", name)
    direct = [
        Carrier("vendor", "n", ws / "vendor" / ".git"),
        Carrier("sub", "g", ws / "sub" / ".git"),
        Carrier("wt", "w", ws / ".git", worktree=True),
    ]
    included = [
        Carrier("vendor2", "n2", ws / "vendor2" / ".git"),
        Carrier("sub2", "g2", ws / "sub2" / ".git"),
        Carrier("wt2", "w2", ws / ".git", worktree=True),
    ]
    return ws, direct, included


def _plant(place: Path, ws: Path, carrier: Carrier) -> None:
    """Every fixed-name code-running setting, each naming `evil-<setting>-<tag>`."""
    tag = carrier.tag
    hooks = place / f"hooks-{tag}"
    hooks.mkdir()
    _program(hooks / "post-index-change", place, f"hooks-{tag}")
    settings = {
        "core.fsmonitor": _evil(place, f"fsmonitor-{tag}"),
        "core.hooksPath": str(hooks),
        "core.pager": _evil(place, f"pager-{tag}"),
        "core.editor": _evil(place, f"editor-{tag}"),
        "sequence.editor": _evil(place, f"sequence-{tag}"),
        "core.sshCommand": _evil(place, f"ssh-{tag}"),
        "remote.ssh.url": "ssh://example.invalid/x.git",
        # A client certificate's password is asked for before connecting: offline.
        "credential.helper": "!" + _evil(place, f"credential-{tag}"),
        "core.askPass": _evil(place, f"askpass-{tag}"),
        "http.sslCert": str(place / "cert.pem"),
        "http.sslCertPasswordProtected": "true",
        "remote.web.url": "https://example.invalid/x.git",
        "core.gitProxy": _evil(place, f"proxy-{tag}"),
        "remote.proxied.url": "git://example.invalid/x.git",
        "protocol.allow": "always",
        "remote.ext.url": "ext::" + _evil(place, f"ext-{tag}"),
        "core.alternateRefsCommand": _evil(place, f"altrefs-{tag}"),
        "gpg.program": _evil(place, f"gpg-{tag}"),
        "gpg.ssh.program": _evil(place, f"gpgssh-{tag}"),
        "gpg.ssh.allowedSignersFile": str(place / "allowed_signers"),
        "gpg.x509.program": _evil(place, f"gpgx509-{tag}"),
    }
    for key, value in settings.items():
        carrier.set(ws, key, value)
    # git reads aliases before it knows of `config.worktree`: a worktree's come from the
    # repository's shared configuration.
    git(ws / carrier.name, "config", "alias.st", "!" + _evil(place, f"alias-{tag}"))
    # An alternate object store: `--alternate-refs` asks `core.alternateRefsCommand` for its refs.
    (carrier.git_dir / "objects" / "info" / "alternates").write_text(
        f"{ws / 'vendor2' / '.git' / 'objects'}\n"
    )
    for kind in SIGNATURES:
        _sign(ws / carrier.name, kind)


def _plant_included(place: Path, ws: Path, carrier: Carrier, gitdir: str) -> None:
    """`core.fsmonitor` from an `includeIf.gitdir:` file, `gpg.openpgp.program` from an
    `include.path` file, and an OpenPGP-signed HEAD."""
    tag = carrier.tag
    conditional = place / f"includeif-{tag}.inc"
    conditional.write_text(f"[core]\n\tfsmonitor = {_evil(place, f'includeif-{tag}')}\n")
    carrier.set(ws, f"includeIf.gitdir:{gitdir}.path", str(conditional))
    plain = place / f"include-{tag}.inc"
    plain.write_text(f'[gpg "openpgp"]\n\tprogram = {_evil(place, f"include-{tag}")}\n')
    carrier.set(ws, "include.path", str(plain))
    _sign(ws / carrier.name, "pgp")


def _prove_live(place: Path, ws: Path, direct: list[Carrier], included: list[Carrier]) -> None:
    """Every planted program runs under a plain git on the host."""
    for carrier in direct:  # before the trees change: `rebase` wants a clean one
        path, tag = ws / carrier.name, carrier.tag
        _live(place, f"sequence-{tag}", path, "rebase", "-i", "HEAD")
        _live(place, f"editor-{tag}", path, "commit", "--allow-empty", "-q")
        os.utime(path / "clean.txt", (1_000_000_000, 1_000_000_000))
        _live(place, f"hooks-{tag}", path, "status")
    for name in ("vendor", "sub", "wt"):
        (ws / name / "README.md").write_text("changed\n")
    for carrier in direct:
        path, tag = ws / carrier.name, carrier.tag
        _live(place, f"fsmonitor-{tag}", path, "status")
        _live(place, f"pager-{tag}", path, "log", "-1", tty=True)
        _live(place, f"ssh-{tag}", path, "remote", "show", "ssh")
        _live(place, (f"credential-{tag}", f"askpass-{tag}"), path, "remote", "show", "web")
        _live(place, f"proxy-{tag}", path, "remote", "show", "proxied")
        _live(place, f"ext-{tag}", path, "remote", "show", "ext")
        _live(place, f"altrefs-{tag}", path, "rev-list", "--alternate-refs", "HEAD")
        signed = (f"gpg-{tag}", f"gpgssh-{tag}", f"gpgx509-{tag}")
        _live(place, signed, path, "log", "--show-signature", "-3")
        _live(place, f"alias-{tag}", path, "st")
    for carrier in included:
        path, tag = ws / carrier.name, carrier.tag
        _live(place, f"includeif-{tag}", path, "status")
        _live(place, f"include-{tag}", path, "log", "--show-signature", "-1")
    # A root `status` runs git in each gitlink.
    _live(place, ("fsmonitor-g", "includeif-g2"), ws, "status")
    # The user's own configuration may name a pack-objects hook: a fetch from here runs it.
    hook = _evil(place, "packhook")
    (place / "home" / ".gitconfig").write_text(f"[uploadpack]\n\tpackObjectsHook = {hook}\n")
    source, clone = str(ws / "vendor2"), str(place / "clone")
    _live(place, "packhook", place, "clone", "-q", "--no-local", source, clone, home=place / "home")
    _clear_markers(place)


def _run(place: Path, replies: list[Reply], *extra: str, route: Any = None) -> dict[str, Any]:
    with FakeMessagesAPI(replies, route=route) as api:
        done = subprocess.run(
            [*WARREN, "-p", "look around", "--cwd", str(place / "ws"), "--output-format", "json",
             "--add-dir", str(place / "extra"), *extra],
            env={
                **os.environ,
                "HOME": str(place / "home"),
                "XDG_STATE_HOME": str(place / "state"),
                "XDG_CONFIG_HOME": str(place / "home" / ".config"),
                "ANTHROPIC_API_KEY": "sk-test-git",
                "ANTHROPIC_BASE_URL": api.base_url,
                "PYTHONPATH": str(ROOT),
                "WARREN_NO_SERVER": "1",
            },
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        sent = api.requests
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    seen = [
        block
        for request in sent
        for message in request.messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    result["tool_results"] = {b["tool_use_id"]: _text(b["content"]) for b in seen}
    return result


def _text(content: str | list[dict[str, Any]]) -> str:
    """A tool result's text."""
    if isinstance(content, str):
        return content
    return "".join(str(block.get("text", "")) for block in content)


def _uses(*commands: str, first: int = 0) -> list[dict[str, Any]]:
    """Bash calls with the ids `toolu_<first>`, `toolu_<first + 1>`, ..."""
    return [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": c}}
        for i, c in enumerate(commands, start=first)
    ]


def _calls(*commands: str) -> list[Reply]:
    """One Bash call per turn, then a closing text."""
    return [Reply(content=[block]) for block in _uses(*commands)] + [Reply.text("done")]


def _batch(*commands: str, first: int = 0) -> list[Reply]:
    """All the Bash calls in one turn (the read-only ones run together), then a closing text."""
    return [Reply(content=_uses(*commands, first=first)), Reply.text("done")]


def _attacks(direct: list[Carrier], included: list[Carrier]) -> dict[str, str]:
    """The read-only commands that run each carrier's programs, by label."""
    commands: dict[str, str] = {}
    for carrier in direct:
        at = f"git -C {carrier.name}"
        commands |= {
            f"status {carrier.tag}": f"{at} status --short",
            f"signed {carrier.tag}": f"{at} log --show-signature -3 --format=%s",
            f"remotes {carrier.tag}": "; ".join(
                f"{at} remote show {remote}" for remote in ("ssh", "web", "proxied", "ext")
            ),
            f"alternates {carrier.tag}": f"{at} rev-list --alternate-refs HEAD",
            f"neutral {carrier.tag}": f"{at} var GIT_PAGER; {at} var GIT_EDITOR; "
            f"{at} config --get sequence.editor; {at} rev-parse --git-path hooks",
        }
    for carrier in included:
        at = f"git -C {carrier.name}"
        commands |= {
            f"status {carrier.tag}": f"{at} status --short",
            f"signed {carrier.tag}": f"{at} log --show-signature -1 --format=%s",
        }
    return commands | {
        "root status": "git status --short",
        # git in each gitlink, with the neutral settings it inherits:
        "root status into gitlinks": "git status --short --ignore-submodules=none",
        "root diff-files": "git diff-files -p",
        "cd diff": "cd vendor && git diff",
        "packhook": "git config --get-all uploadpack.packObjectsHook || echo unset",
    }


def _programs_run(place: Path, outputs: dict[str, str]) -> tuple[list[str], list[str]]:
    """The planted programs whose marker a tool result shows, and those whose marker file
    is in the extra root (both empty: none ran)."""
    shown = {marker for text in outputs.values() for marker in re.findall(r"MARKER-[\w-]+", text)}
    return sorted(shown), sorted(p.name for p in (place / "extra").iterdir())


def _verified(text: str) -> bool:
    """`git log --show-signature` ran: it listed the signed commits, or died of SIGPIPE
    (git 2.39 writes the signed text to the verifying program, here `false`, which may have
    exited before reading it)."""
    return "signed" in text or "Exit code: 141" in text


def test_code_running_settings_of_every_repository_run_nothing(place: Path) -> None:
    ws, direct, included = _workspace(place)
    (place / "cert.pem").write_text("not a certificate\n")
    (place / "allowed_signers").write_text("")
    for carrier in direct:
        _plant(place, ws, carrier)
    for carrier, gitdir in zip(included, ("vendor2/", "sub2/", "worktrees/wt2"), strict=True):
        _plant_included(place, ws, carrier, gitdir)
    _prove_live(place, ws, direct, included)

    attacks = _attacks(direct, included)
    asked = [f"git -C {carrier.name} st" for carrier in direct] + [
        "env -i git -C vendor status --short",  # would drop the neutral settings
        "env -u GIT_CONFIG_COUNT git -C vendor status --short",
    ]
    result = _run(place, _batch(*attacks.values(), *asked))
    outputs = result["tool_results"]
    assert _programs_run(place, outputs) == ([], [])
    denied = {d["tool_input"]["command"] for d in result["permission_denials"]}
    assert denied == set(asked), result["permission_denials"]
    assert len(outputs) == len(attacks) + len(asked)
    out = {label: outputs[f"toolu_{i}"] for i, label in enumerate(attacks)}
    # The read-only git ran and answered, with the neutral settings in force.
    for carrier in direct:
        assert "README.md" in out[f"status {carrier.tag}"], out[f"status {carrier.tag}"]
        assert _verified(out[f"signed {carrier.tag}"]), out[f"signed {carrier.tag}"]
        assert NEUTRAL_VIEW in out[f"neutral {carrier.tag}"], out[f"neutral {carrier.tag}"]
    for carrier in included:
        assert _verified(out[f"signed {carrier.tag}"]), out[f"signed {carrier.tag}"]
    assert "unset" in out["packhook"] and "evil" not in out["packhook"], out["packhook"]


def test_a_repository_that_configures_a_driver_makes_git_ask(place: Path) -> None:
    ws = make_repo(place / "ws")
    drivers = make_repo(ws / "drivers")
    (drivers / ".gitattributes").write_text("*.md diff=evil\n")
    git(drivers, "config", "diff.evil.textconv", _evil(place, "textconv"))
    (drivers / "README.md").write_text("changed\n")
    _live(place, "textconv", drivers, "diff")
    external = make_repo(ws / "external")
    git(external, "config", "diff.external", _evil(place, "external"))
    (external / "README.md").write_text("changed\n")
    _live(place, "external", external, "diff")

    commands = ("git -C drivers diff", "git -C external diff", "git status --short")
    result = _run(place, _calls(*commands))
    denied = {d["tool_input"]["command"]: d for d in result["permission_denials"]}
    assert set(denied) == set(commands), denied
    for text in result["tool_results"].values():
        assert "MARKER" not in text
        # The reason, for the model: the first repository found that configures a program.
        assert "diff.evil.textconv" in text or "diff.external" in text, text
    assert list((place / "extra").iterdir()) == []


def test_a_driver_planted_after_start_up_is_refused_when_git_runs(place: Path) -> None:
    """A driver configured once the session runs, in a file outside the workspace that a
    repository includes (the floor keeps a sandbox from writing a repository's own
    configuration, and removes a `.git` made while it runs; here the user writes the files
    between two turns): the start-up probe did not see it; the one-shot's git refuses it, in
    a nested repository, in a worktree, and in a gitlink a root command would run git in
    (`diff-index --submodule=diff`, past `diff.ignoreSubmodules`). git named by its path, which
    would skip that refusal, asks."""
    ws = _repo(place / "ws")
    git(ws, "config", "extensions.worktreeConfig", "true")
    late = make_repo(ws / "late")
    (late / ".gitattributes").write_text("*.md diff=evil\n")
    (late / "README.md").write_text("changed\n")
    gitlink = make_repo(ws / "lsub")
    git(ws, "add", "lsub")
    git(ws, "commit", "-q", "-m", "gitlink")
    (gitlink / "README.md").write_text("newer\n")
    git(gitlink, "commit", "-q", "-am", "newer")  # the root's diff shows the gitlink's
    git(ws, "worktree", "add", "-q", "lwt")
    (ws / "lwt" / "README.md").write_text("changed\n")
    # Files the repositories include, outside the workspace: harmless at start-up.
    shared = {name: place / f"{name}.inc" for name in ("late", "lsub", "lwt")}
    for name, path in shared.items():
        path.write_text("[color]\n\tui = false\n")
        scope = ["--worktree"] if name == "lwt" else []
        git(ws / name, "config", *scope, "include.path", str(path))
    evil = {name: _evil(place, f"late-{name}") for name in shared}

    def plant() -> None:
        shared["late"].write_text(f'[diff "evil"]\n\ttextconv = {evil["late"]}\n')
        for name in ("lsub", "lwt"):
            shared[name].write_text(f"[diff]\n\texternal = {evil[name]}\n")

    refused = (
        "git -C late diff",
        "git -C lwt diff",
        "git diff-index -p --submodule=diff HEAD",
    )
    asked = ("/usr/bin/git -C late diff", "command -p git -C late diff")
    replies = [*_calls("git status --short")[:1], *_batch(*refused, *asked, first=1)]
    turns = iter(replies)

    def route(request: Any) -> Reply:
        if len(request.messages) == 3:  # the first result is in: the user plants it now
            plant()
            _live(place, "late-late", late, "diff")
            _live(place, "late-lwt", ws / "lwt", "diff")
            _live(place, "late-lsub", ws, *refused[2].split()[1:])
        return next(turns)

    result = _run(place, [], route=route)
    outputs = result["tool_results"]
    assert _programs_run(place, outputs) == ([], [])
    denied = {d["tool_input"]["command"] for d in result["permission_denials"]}
    assert denied == set(asked), result["permission_denials"]
    for index, key in enumerate(("diff.evil.textconv", "diff.external", "diff.external"), 1):
        text = outputs[f"toolu_{index}"]
        assert "git was not run" in text and key in text, text
    assert "the gitlink at lsub" in outputs["toolu_3"], outputs["toolu_3"]
