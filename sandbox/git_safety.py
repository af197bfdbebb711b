"""git's settings that run programs, neutralised: one list for every git Warren runs or lets run
without asking.

A repository's configuration can name programs git then runs on ordinary read-only commands:
`core.fsmonitor` on `git status`, `diff.external` on `git diff`, `gpg.program` on `git log
--show-signature`, `core.sshCommand`, `credential.helper` and `core.askPass` on `git remote
show`, `core.alternateRefsCommand` on `git rev-list --alternate-refs`, and so on. Warren's own
git calls (the context probe, the remote snapshot) and every command the analyser approves as
read-only (run as a one-shot in the read-only sandbox, orchestrator/tools/shell.py) run with
each of these settings overridden by configuration that outranks the repository's: `-c
NAME=VALUE` on the command line, or the same pairs in `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/
`GIT_CONFIG_VALUE_n` (git reads both as command-line configuration, which wins over every file,
included files too; the environment reaches the git a git runs, a submodule's included), and
`core.gitProxy`, where the first value wins, by the environment (`NEUTRAL_ENV`). git's porcelain
does not enter submodules (`diff.ignoreSubmodules=all`): their configuration is another
repository's.

Settings named after a driver cannot be overridden by a fixed name (`filter.<d>.clean`,
`diff.<d>.textconv`, `merge.<d>.driver`, `remote.<r>.uploadpack`, ...), nor can
`diff.external` (git runs an empty value as a program): `risky_key` names them, and a
repository whose configuration defines one is not trusted with an unasked git call (the
context probe reports them; the one-shot's `git` refuses to run there, or where a gitlink
checked out in it does: git's plumbing, `--submodule=diff` and `--ignore-submodules=none` run
git in a gitlink, past `diff.ignoreSubmodules`). The analyser approves git only by its name,
looked up on PATH where the guard is, and never with its environment cleared. An alias that
runs a program (`alias.x = !cmd`) cannot shadow a git command, and the analyser approves only
git's own read-only commands, so none runs.

Standard library only: the context probe loads this file by its path inside the sandbox.
"""

from __future__ import annotations

__all__ = [
    "NEUTRAL",
    "NEUTRAL_ENV",
    "code_running_keys",
    "config_args",
    "config_env",
    "guard_script",
    "risky_key",
    "shell_exports",
]

NEUTRAL: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("core.alternateRefsCommand", "false"),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("credential.helper", ""),
    ("protocol.ext.allow", "never"),
    ("diff.ignoreSubmodules", "all"),
    ("status.submoduleSummary", "false"),
    ("submodule.recurse", "false"),
    ("core.untrackedCache", "false"),
)
"""Each setting that runs a program (or enters another repository), and the value that makes
it run nothing: `false` where git expects a program (it then fails, harmlessly), `none` for a
proxy, empty where an empty value resets a list. `diff.external` has no such value (git runs
an empty one as a program, and fails): it is named by `risky_key` instead.
`uploadpack.packObjectsHook` is read only from the user's and the system's configuration,
never a repository's (and runs only when serving a fetch)."""

NEUTRAL_ENV: tuple[tuple[str, str], ...] = (("GIT_PROXY_COMMAND", ""),)
"""Settings no later configuration outranks, neutralised by git's environment instead:
git keeps the first `core.gitProxy` that applies to a host (a repository's comes before the
command line's), but skips them all when `GIT_PROXY_COMMAND` is set, and an empty one means
no proxy."""

_REFUSED = ("diff.external",)
"""Fixed names no value turns off: `risky_key` names them."""
_BY_ENVIRONMENT = ("core.gitproxy",)
"""Fixed names `NEUTRAL_ENV` neutralises."""

_DRIVER_KEYS: dict[str, tuple[str, ...]] = {
    "filter": (".clean", ".smudge", ".process"),
    "diff": (".textconv", ".command"),
    "merge": (".driver",),
    "remote": (".uploadpack", ".receivepack", ".vcs"),
}
"""Per section, the keys under a driver's (or remote's) name that name a program git runs: no
fixed override reaches them (`filter.<d>.clean`, `remote.<r>.uploadpack`, ...)."""


def code_running_keys() -> frozenset[str]:
    """Every fixed configuration name (lower case) this module neutralises or refuses: what
    a copy of the user's own configuration leaves out (`sandbox.masks.sanitise_gitconfig`)."""
    return frozenset({name.lower() for name, _ in NEUTRAL} | {*_REFUSED, *_BY_ENVIRONMENT})


def config_args() -> list[str]:
    """`-c NAME=VALUE` for each neutral setting, for a git command line."""
    out: list[str] = []
    for name, value in NEUTRAL:
        out += ["-c", f"{name}={value}"]
    return out


def config_env() -> dict[str, str]:
    """The neutral settings as git's environment configuration (`GIT_CONFIG_COUNT`...)."""
    env = {"GIT_CONFIG_COUNT": str(len(NEUTRAL))}
    for index, (name, value) in enumerate(NEUTRAL):
        env[f"GIT_CONFIG_KEY_{index}"] = name
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    return env


def shell_exports() -> str:
    """Bash that drops every `GIT_*` variable a command's environment carries (an earlier
    command may have exported `GIT_DIR`, `GIT_EXTERNAL_DIFF`, `GIT_CONFIG_PARAMETERS`...) and
    exports the neutral settings and a `cat` pager instead: two builtins, run before every
    read-only one-shot (tests/bench/bench_vs_parent.py, Bash read-only)."""
    pairs = {"GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
    pairs |= dict(NEUTRAL_ENV) | config_env()
    exports = " ".join(f"{name}={_quoted(value)}" for name, value in pairs.items())
    return f'unset "${{!GIT_@}}"; export {exports}'


def risky_key(name: str) -> bool:
    """Whether the configuration name `name` (as `git config --list --name-only` prints it)
    names a program no fixed override reaches: a key under a driver's or remote's name, or
    `diff.external` (no value turns it off)."""
    if name.lower() == "diff.external":
        return True
    section, _, rest = name.lower().partition(".")
    ends = _DRIVER_KEYS.get(section)
    return ends is not None and "." in rest and rest.endswith(ends)


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


MAX_GITLINKS = 64
"""Gitlinks (checked out, at any depth) a one-shot's `git` reads the configuration of before it
runs; past that many it refuses to run."""


def guard_script(real_git: str) -> str:
    """A `git` for a read-only command's PATH (bash): it runs `real_git` with the same
    arguments unless the repository those arguments name (their `-C`s, from the working
    directory), or a gitlink checked out in it (at any depth: git's plumbing, `--submodule=diff`
    and `--ignore-submodules=none` run git in them), configures, in its own or an included
    file, a program under a driver's or remote's name (`risky_key`), or holds more than
    `MAX_GITLINKS` gitlinks; then it runs nothing, says why on stderr and exits 126. Only a
    `git` looked up on PATH is this one: the analyser approves git only by its name."""
    patterns = "|".join(
        ["diff.external"]
        + [f"{section}.*{end}" for section, ends in _DRIVER_KEYS.items() for end in ends]
    )
    return f"""#!/bin/bash
# Warren: git in a command run without asking (sandbox/git_safety.py). git's fixed
# code-running settings are overridden by the environment (GIT_CONFIG_*); a repository that
# names a program under a driver's or remote's name (or a gitlink in it that does) is not
# run here.
real={_quoted(real_git)}
where=()
i=1
while [ "$i" -le "$#" ]; do
  a=${{!i}}
  case $a in
    -C) j=$((i + 1)); where+=(-C "${{!j}}"); i=$((i + 2));;
    -C*) where+=("$a"); i=$((i + 1));;
    -*) i=$((i + 1));;
    *) break;;
  esac
done
risk_in() {{  # the first program a repository's own configuration names (git -C args)
  "$real" "$@" config --list --includes --show-scope --name-only 2>/dev/null |
    while IFS=$'\\t' read -r scope name; do
      case $scope in local|worktree) ;; *) continue;; esac
      case ${{name,,}} in {patterns}) printf '%s' "$name"; break;; esac
    done
}}
why=
risky=$(risk_in "${{where[@]}}")
[ -n "$risky" ] && why="this repository configures \\`$risky\\`, a program git would run"
top=
[ -z "$why" ] && top=$("$real" "${{where[@]}}" rev-parse --show-toplevel 2>/dev/null)
todo=()
[ -n "$top" ] && todo=("$top")
seen=0
while [ -z "$why" ] && [ "${{#todo[@]}}" -gt 0 ]; do
  repo=${{todo[0]}}
  todo=("${{todo[@]:1}}")
  while IFS= read -r -d '' entry; do
    path=$repo/${{entry#*$'\\t'}}
    [ -e "$path/.git" ] || continue
    seen=$((seen + 1))
    if [ "$seen" -gt {MAX_GITLINKS} ]; then
      why="this repository holds more than {MAX_GITLINKS} gitlinks, too many to check"
      break
    fi
    risky=$(risk_in -C "$path")
    if [ -n "$risky" ]; then
      why="the gitlink at ${{path#"$top"/}} configures \\`$risky\\`, a program git would run"
      break
    fi
    todo+=("$path")
  done < <("$real" -C "$repo" ls-files --stage -z 2>/dev/null | command -p grep -z '^160000 ')
done
if [ -n "$why" ]; then
  printf 'warren: git was not run: %s; ' "$why" >&2
  printf 'git here needs the user'"'"'s approval (ask them, or leave this repository alone)\\n' >&2
  exit 126
fi
exec "$real" "$@"
"""
