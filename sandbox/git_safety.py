"""git's settings that run programs, neutralised: one list for every git Warren runs or lets run
without asking.

A repository's configuration can name programs git then runs on ordinary read-only commands:
`core.fsmonitor` on `git status`, `diff.external` on `git diff`, `gpg.program` on `git log
--show-signature`, `core.sshCommand` on `git remote show`, and so on. Warren's own git calls
(the context probe, the remote snapshot) and every command the analyser approves as read-only
(run as a one-shot in the read-only sandbox, orchestrator/tools/shell.py) run with each of these
settings overridden by configuration that outranks the repository's: `-c NAME=VALUE` on the
command line, or the same pairs in `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`
(git reads both as command-line configuration, which wins over every file, included files too;
the environment reaches the git a git runs, a submodule's included). Submodules are not entered
(`diff.ignoreSubmodules=all`): their configuration is another repository's.

Settings named after a driver cannot be overridden by a fixed name (`filter.<d>.clean`,
`diff.<d>.textconv`, `merge.<d>.driver`, `remote.<r>.uploadpack`, ...), nor can
`diff.external` (git runs an empty value as a program): `risky_key` names them, and a
repository whose configuration defines one is not trusted with an unasked git call (the
context probe reports them; the one-shot's `git` refuses to run there). An alias that
runs a program (`alias.x = !cmd`) cannot shadow a git command, and the analyser approves only
git's own read-only commands, so none runs.

Standard library only: the context probe loads this file by its path inside the sandbox.
"""

from __future__ import annotations

__all__ = [
    "NEUTRAL",
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
    ("core.gitProxy", "none"),
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
never a repository's; `core.alternateRefsCommand` runs only when serving a push or fetch."""

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
    return frozenset({name.lower() for name, _ in NEUTRAL} | {"diff.external"})


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
    pairs |= config_env()
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


def guard_script(real_git: str) -> str:
    """A `git` for a read-only command's PATH (bash): it runs `real_git` with the same
    arguments unless the repository those arguments name (their `-C`s, from the working
    directory) configures, in its own or an included file, a program under a driver's or
    remote's name (`risky_key`); then it runs nothing, says why on stderr and exits 126."""
    patterns = "|".join(
        ["diff.external"]
        + [f"{section}.*{end}" for section, ends in _DRIVER_KEYS.items() for end in ends]
    )
    return f"""#!/bin/bash
# Warren: git in a command run without asking (sandbox/git_safety.py). git's fixed
# code-running settings are overridden by the environment (GIT_CONFIG_*); a repository that
# names a program under a driver's or remote's name is not run here.
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
risky=$("$real" "${{where[@]}}" config --list --includes --show-scope --name-only 2>/dev/null |
  while IFS=$'\\t' read -r scope name; do
    case $scope in local|worktree) ;; *) continue;; esac
    case ${{name,,}} in {patterns}) printf '%s' "$name"; break;; esac
  done)
if [ -n "$risky" ]; then
  printf 'warren: git was not run: this repository configures `%s`, ' "$risky" >&2
  printf 'a program git would run; ' >&2
  printf 'git here needs the user'"'"'s approval (ask them, or leave this repository alone)\\n' >&2
  exit 126
fi
exec "$real" "$@"
"""
