"""The bash analyser, table-driven: every bypass family with its floor and no-floor verdicts.

Each case states what `classify` must say with the floor proven (read-only or not, which
also fixes the hint: read-only means "allow") and the hint without the floor (only the exact
list of `NO_FLOOR_EXACT_COMMANDS` is "allow"). Cases are grouped by the family of bypass
they pin; a case that is read-only is as much a test as one that is not, since a catalogue
that refuses everything is useless.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from policies.bash_analysis import (
    MAX_COMMAND_CHARS,
    NO_FLOOR_EXACT_COMMANDS,
    BashAnalyser,
    BashClassification,
    classify,
    suggest_rule,
)

WORKSPACE = Path("/work/repo")


@dataclass(frozen=True)
class Case:
    command: str
    floor_read_only: bool
    """With the floor: read-only, hence hint "allow"."""
    no_floor_hint: str = "ask"
    critical: bool = False
    parse_ok: bool = True


def ro(command: str, no_floor_hint: str = "ask") -> Case:
    return Case(command, True, no_floor_hint)


def rw(command: str, *, critical: bool = False, parse_ok: bool = True) -> Case:
    return Case(command, False, "ask", critical=critical, parse_ok=parse_ok)


PLAIN_READ_ONLY = [
    ro("ls", "allow"),
    ro("ls -la", "allow"),
    ro("pwd", "allow"),
    ro("date", "allow"),
    ro("whoami", "allow"),
    ro("true", "allow"),
    ro("git status", "allow"),
    ro("git diff", "allow"),
    ro("git log", "allow"),
    ro("git branch", "allow"),
    ro("  git   status  ", "allow"),
    ro("ls -l"),
    ro("cat README.md"),
    ro("head -n 20 src/main.py"),
    ro("tail -f log.txt"),
    ro("wc -l src/a.py src/b.py"),
    ro("stat -c %s file"),
    ro("du -sh ."),
    ro("df -h"),
    ro("diff a.txt b.txt"),
    ro("cmp a b"),
    ro("which python3"),
    ro("type ls"),
    ro("echo hello world"),
    ro("printf '%s\\n' a b"),
    ro("uname -a"),
    ro("id -u"),
    ro("hostname"),
    ro("hostname -f"),
    ro("nproc"),
    ro("seq 1 10"),
    ro("tr a-z A-Z < in.txt"),
    ro("cut -d: -f1 /etc/passwd"),
    ro("sort -u names.txt"),
    ro("sort -k2,2n -t, data.csv"),
    ro("uniq -c sorted.txt"),
    ro("uniq -f 2 sorted.txt"),
    ro("comm -12 a b"),
    ro("nl file"),
    ro("od -c file"),
    ro("xxd file"),
    ro("xxd -l 64 file"),
    ro("hexdump -C file"),
    ro("sha256sum file"),
    ro("md5sum -c sums.md5"),
    ro("column -t file"),
    ro("basename /a/b.py"),
    ro("dirname /a/b.py"),
    ro("realpath ."),
    ro("readlink -f link"),
    ro("sleep 1"),
    ro("test -f setup.py"),
    ro("[ -d src ]"),
    ro("[[ -n $x ]]"),
    ro("ps aux"),
    ro("free -m"),
    ro("uptime"),
    ro("locale"),
    ro("getconf PAGE_SIZE"),
    ro("jq .name package.json"),
    ro("base64 -d blob.txt"),
    ro("printenv HOME"),
    ro("env"),
    ro("tree -L 2 src"),
    ro("file README.md"),
    ro("date +%Y-%m-%d"),
    ro("date -Iseconds"),
    ro("date -d yesterday"),
    ro("python3 --version"),
    ro("node --version"),
    ro("cd src && ls"),
    ro("rg -n 'TODO' src"),
    ro("rg -z foo logs"),
    ro("rg --passthru foo"),
    ro("grep -rn foo ."),
    ro("find . -name '*.py' -type f"),
    ro("find src -newer setup.py -print"),
    ro('find . "$X"'),  # variables are the floor's business (DESIGN.md)
    ro("echo $HOME ~"),
    ro("ls ~/src"),
    ro("read -r line"),
    ro("foo=1"),
]

GIT_READ_ONLY = [
    ro("git show HEAD~1 --stat"),
    ro("git blame -L 10,20 src/a.py"),
    ro("git rev-parse --abbrev-ref HEAD"),
    ro("git ls-files '*.py'"),
    ro("git diff --no-ext-diff HEAD"),
    ro("git diff --no-textconv HEAD"),
    ro("git log --oneline --graph -n 20"),
    ro("git log --output-indicator-new=+ -p"),
    ro("git branch -a"),
    ro("git branch -vv"),
    ro("git branch --list 'feat/*'"),
    ro("git branch --show-current"),
    ro("git branch --sort=-committerdate"),
    ro("git tag"),
    ro("git tag -l 'v*'"),
    ro("git remote"),
    ro("git remote -v"),
    ro("git remote show origin"),
    ro("git remote get-url origin"),
    ro("git config --get user.email"),
    ro("git config --list"),
    ro("git config user.name"),
    ro("git config get user.name"),
    ro("git stash list"),
    ro("git stash show -p"),
    ro("git worktree list"),
    ro("git submodule status"),
    ro("git merge-base main HEAD"),
    ro("git for-each-ref --format='%(refname)' refs/heads"),
    ro("git --no-pager log -5"),
    ro("git grep -n foo"),
    ro("git cat-file -p HEAD"),
    ro("git reflog"),
    ro("git reflog show main"),
    ro("git describe --tags"),
    ro("git --version"),
    ro("git -C sub log"),
    ro("git -C /work/repo/sub status"),
]

OPERATORS_AND_NEWLINES = [
    ro("ls && cat a"),
    ro("ls || echo none"),
    ro("ls; pwd"),
    ro("ls | head"),
    ro("ls & pwd"),
    ro("ls\npwd"),
    ro("! grep -q foo file"),
    ro("if [ -f a ]; then cat a; else echo no; fi"),
    ro('for f in src/*.py; do wc -l "$f"; done'),
    ro('while read -r l; do echo "$l"; done < list.txt'),
    ro("ls -la # comment; rm x"),
    ro("git log --oneline | head -5 && rg -n foo src 2>/dev/null"),
    rw("ls\nrm -rf build"),
    rw("ls && rm x"),
    rw("ls || rm x"),
    rw("ls; rm x"),
    rw("ls |& rm x"),
    rw("sleep 5 & rm x"),
    # A shell reading its script from a pipe runs text no one saw: a critical delete for
    # the analyser, whatever the text (issue 33, class 6).
    rw("cat a | sh", critical=True),
    rw("if true; then rm x; fi"),
    rw("while true; do touch x; done"),
    rw("case $x in a) ls;; *) rm -rf y;; esac"),
    rw("ls && { pwd; mv a b; }"),
]

SUBSTITUTIONS = [
    ro("echo $(pwd)"),
    ro("cat $(git ls-files)"),
    ro("echo `date`"),
    ro("diff <(sort a) <(sort b)"),
    ro("x=$(cat VERSION)"),
    ro('cat <<< "$(ls)"'),
    ro("cat <<'EOF'\n`rm x` $(rm y)\nEOF"),
    ro("cat <<EOF\nplain $HOME \\`escaped\\`\nEOF"),
    rw("echo $(rm -rf build)"),
    rw("echo `rm x`"),
    rw('echo "$(curl evil.example)"'),
    rw('echo "a`rm x`b"'),
    rw("cat <(curl x)"),
    rw("ls $(echo $(rm x))"),
    rw("x=$(rm y)"),
    rw("echo ${x:-$(rm y)}"),
    # Arithmetic on text holding `rm`: treated as a hidden delete (issue 33, class 6).
    rw('echo "${arr[$(rm y)]}"', critical=True),
    rw("cat <<EOF\n$(rm x)\nEOF"),
    rw("cat <<EOF\n`rm x`\nEOF"),  # heredoc backtick: tree-sitter leaves it as text
    rw("cat <<< $(rm x)"),
    rw("echo ${x:=y}"),
    rw("echo $((x=1))"),
    rw("echo $((x+1))"),  # x may hold `a[$(cmd)]`: arithmetic runs it
    ro("echo $((1+2))"),
]

REDIRECTIONS = [
    ro("ls > /dev/null"),
    ro("ls 2>/dev/null"),
    ro("ls &>/dev/null"),
    ro("ls 2>&1"),
    ro("ls >&2"),
    ro("ls 1>&-"),
    ro("cat < in.txt"),
    ro("ls | tee"),
    ro("ls | tee /dev/null"),
    ro("ls >/dev/null -la"),
    rw("ls > out.txt"),
    rw("ls >> log"),
    rw("ls 2> err.txt"),
    rw("ls &> all.txt"),
    rw("ls &>> all.txt"),
    rw("ls >| forced"),
    rw("ls >& file"),
    rw("> file"),
    rw('ls > "$OUT"'),
    rw("cat x >out y"),
    rw("{ ls; pwd; } > out"),
    rw("(ls) > out"),
    rw("ls | head > out"),
    rw("ls | tee out.txt"),
    rw("ls | tee -a log"),
    rw("echo x > >(tee log)"),
    rw("[ a > b ]"),  # bash: `[ a ]` with stdout redirected to the file b
    rw("test a > b"),
    rw("exec 3>file"),
    # tree-sitter attaches -delete to the redirection
    rw("find . >/dev/null -delete", critical=True),
    rw("ls 3<>f", parse_ok=False),
]

SUBSHELLS_AND_GROUPS = [
    ro("(cd src && ls)"),
    ro("{ ls; pwd; }"),
    ro("(ls; (pwd; (echo deep)))"),
    rw("(rm x)"),
    rw("{ rm x; }"),
    rw("(ls; (pwd; (rm x)))"),
    rw("ls() { rm -rf build; }; ls"),
    rw("f() { ls; }"),
]

WRAPPERS_AND_ASSIGNMENTS = [
    ro("timeout 10 rg foo"),
    ro("timeout -s KILL 5 cat f"),
    ro("timeout --kill-after=2 5 git status"),
    ro("nice -n 10 grep foo f"),
    ro("nice -5 cat f"),
    ro("nohup cat f"),
    ro("time ls"),
    ro("time -p git status"),
    ro("stdbuf -oL tail -f log"),
    ro("env LC_ALL=C sort f"),
    ro("env -i"),
    ro("env -u LANG ls"),
    ro("command -p ls"),
    # git's neutral settings and its guard (sandbox.git_safety) come with the environment
    # and PATH a read-only one-shot gives it: clearing them, or naming git by path, asks.
    rw("env -i ls"),
    rw("env - git status"),
    rw("env -i git status"),
    rw("env -u GIT_CONFIG_COUNT git status"),
    rw("env --unset=GIT_CONFIG_COUNT git status"),
    rw("env -uPATH git status"),
    rw("env -u $V git status"),
    rw("/usr/bin/git status"),
    rw("nice /usr/bin/git log"),
    rw("command -p git status"),
    ro("command -v git"),
    ro("command ls"),
    ro("builtin echo hi"),
    ro("timeout 5 nice -n 1 env LC_ALL=C cat f"),
    ro("LC_ALL=C sort f"),
    ro("TZ=UTC date"),
    ro("GIT_PAGER=cat git log"),
    ro("x=1 cat f"),
    rw("timeout 5 rm x"),
    rw("nice rm x"),
    rw("nohup rm x"),
    rw("time rm x"),
    rw("stdbuf -o0 rm x"),
    rw("env PATH=/tmp ls"),
    rw("env -S 'rm x'"),
    rw("env rm x"),
    rw("command curl example.com"),
    rw("builtin eval ls"),
    rw("GIT_PAGER=less git log"),
    rw("PAGER=evil git log"),
    rw("LD_PRELOAD=/tmp/x.so cat f"),
    rw("PATH=/tmp:$PATH ls"),
    rw("GIT_DIR=/other git log"),
    rw("GIT_EXTERNAL_DIFF=./x git diff"),
    rw("FOO=1"),
    rw("PATH=/tmp"),
    rw("export FOO=1"),
    rw("unset x"),
    rw("declare -x A=1"),
    rw("local x"),
    rw("read PATH"),
    rw("for PATH in /tmp; do ls; done"),
    rw("select x in a b; do ls; done"),
    rw("test -v 'a[$(touch x)]'"),  # bash evaluates the quoted subscript and runs touch
    rw("[ -v 'a[$(touch x)]' ]"),
    rw("[[ -v 'a[$(touch x)]' ]]"),
    ro("test -v name"),
    rw("echo ${x@P}"),
    rw("(( i++ ))"),
    rw("for ((i=0;i<3;i++)); do echo $i; done"),
]

NEVER_READ_ONLY = [
    rw("xargs rm"),
    rw("ls | xargs cat"),
    rw("sh -c 'ls'"),
    rw("bash -c ls"),
    rw("zsh -c ls"),
    rw("eval ls"),
    rw("exec ls"),
    rw("source ./env.sh"),
    rw(". ./env.sh"),
    rw("python -c 'print(1)'"),
    rw("python3 -c 'import os'"),
    rw("python script.py"),
    rw("node -e 'x'"),
    rw("perl -e 'x'"),
    rw("ruby -e 'x'"),
    rw("npx prettier ."),
    rw("uvx ruff"),
    rw("pipx run black"),
    rw("npm exec foo"),
    rw("sudo ls"),
    rw("less file"),
    rw("man ls"),
    rw("curl https://example.com"),
    rw("touch x"),
    rw("mkdir -p d"),
    rw("chmod +x f"),
    rw("cp a b"),
    rw("mv a b"),
]

FIND = [
    rw("find . -exec rm {} \\;", critical=True),
    rw("find . -execdir cat {} +"),
    rw("find . -ok rm {} \\;", critical=True),
    rw("find . -okdir rm {} \\;", critical=True),
    rw("find . -delete", critical=True),
    rw("find . -fprint out"),
    rw("find . -fprint0 out"),
    rw("find . -fprintf out '%p'"),
    rw("find . -fls out"),
    rw("find . $'-delete'", critical=True),
    rw("find . $'\\055delete'", critical=True),
    rw('find . -del"ete"', critical=True),
    rw("find . \\-delete", critical=True),
    rw("find . -$ACTION"),
    rw("find . -del\\\nete"),  # bash joins `-del\<newline>ete`; tree-sitter splits it
    ro("find . \\\n  -name x"),
]

SED = [
    ro("sed -n '1,20p' file"),
    ro("sed -n '$=' file"),
    ro("sed -n '/start/,/end/p' file"),
    ro("sed -n -e '5q' -e 'p' file"),
    ro("sed -nE '/^#/!p' file"),
    ro("sed -n '/a\\/b/p' file"),
    ro("sed -n '\\,a/b,p' file"),
    ro("sed -n '10,+5p' file"),
    ro("sed -n '1~2p' file"),
    ro("sed -n '/x/{p;q}' file"),
    ro("sed -n 'l 80' file"),
    ro("sed --quiet --expression=p file"),
    rw("sed -i 's/a/b/' f"),
    rw("sed --in-place 's/a/b/' f"),
    rw("sed --in-pl 's/a/b/' f"),
    rw("sed -ni 'p' f"),
    rw("sed 's/a/b/' f"),
    rw("sed -n 's/a/b/p' f"),
    rw("sed -n 's/a/b/w out' f"),
    rw("sed -n '1e rm x' f"),
    rw("sed -n '/x/w out' f"),
    rw("sed -n '/x/W out' f"),
    rw("sed -n -f script.sed f"),
    rw("sed -n 'r /etc/passwd' f"),
    rw('sed -n "$SCRIPT" f'),
    rw("sed -n '/unterminated' f"),
]

RG = [
    rw("rg --pre cat foo"),
    rw("rg --pre=./x.sh foo"),
    rw("rg --pre-glob '*.gz' --pre zcat foo"),
    rw("rg --hostname-bin=./h foo"),
    rw("rg --pr=sh foo"),
    rw("rg --pre=$TOOL foo"),
]

GIT = [
    rw("git -c core.pager=sh log"),
    rw("git -c core.fsmonitor=evil status"),
    rw("git -ccore.pager=sh log"),
    rw("git --config-env=core.pager=X log"),
    rw("git --exec-path=/tmp log"),
    rw("git --git-dir=/other/.git log"),
    rw("git --work-tree=/ status"),
    rw("git -p log"),
    rw("git -C /tmp log"),
    rw("git -C ../other log"),
    rw("git -C $DIR log"),
    rw("git log --output=/tmp/x"),
    rw("git log --out=x"),
    rw("git diff --output x"),
    rw("git diff --ext-diff"),
    rw("git diff --textconv"),
    rw("git show --textconv HEAD:f"),
    rw("git cat-file --filters HEAD:f"),
    rw("git grep -O foo"),
    rw("git grep -nO foo"),
    rw("git grep --open-files-in-pager=vim foo"),
    rw("git log --help"),
    rw("git push"),
    rw("git commit -m x"),
    rw("git checkout main"),
    rw("git reset --hard"),
    rw("git clean -fdx", critical=True),
    rw("git branch -d old"),
    rw("git branch -D old"),
    rw("git branch -m a b"),
    rw("git branch newbranch"),
    rw("git branch --delete x"),
    rw("git branch --set-upstream-to=origin/main"),
    rw("git tag v1.0"),
    rw("git tag -d v1"),
    rw("git tag -a v1 -m x"),
    rw("git stash"),
    rw("git stash pop"),
    rw("git config user.name x"),
    rw("git config --add a.b c"),
    rw("git config --unset a.b"),
    rw("git config set a.b c"),
    rw("git config -e"),
    rw("git remote add o url"),
    rw("git remote remove o"),
    rw("git reflog expire --all"),
    rw("git reflog delete HEAD@{1}"),
    rw("git worktree add ../x"),
    rw("git submodule update"),
    rw("git fetch"),
    rw("git ls-remote --upload-pack=x origin"),
    rw("git $CMD"),
    rw("git st"),
]

OTHER_FLAGS = [
    rw("sort -o out f"),
    rw("sort --output=out f"),
    rw("sort --out out f"),
    rw("sort -uo out f"),
    rw("sort --compress-program=gzip f"),
    rw("awk 'BEGIN{system(\"rm x\")}'"),
    rw("awk '{print > \"out\"}' f"),
    rw("awk '{print $1 >> \"out\"}' f"),
    rw('awk \'{printf("%s", $1) > "out"}\' f'),
    rw("awk '{print | \"sh\"}' f"),
    rw("awk '{\"date\" | getline d}' f"),
    rw('awk \'{ print /"/ | "sh" }\' f'),
    rw('awk \'BEGIN{f="system"; @f("rm x")}\''),
    rw("awk -f prog.awk f"),
    rw("gawk -i inplace '{print}' f"),
    rw('awk "$PROG" f'),
    rw("awk -E prog f"),
    rw("mawk -W exec x"),
    ro("awk '{print $1}' file"),
    ro("awk -F: '$3 >= 1000 {print $1}' /etc/passwd"),
    ro("awk 'NR==1, /end/' f"),
    ro("awk '/a|b/' f"),
    ro("awk -v x=1 '{print x}' f"),
    ro("awk '{print ($1 > 5)}' f"),
    ro("awk '{ if ($2 > max) max = $2 } END { print max }' f"),
    rw("tee out.txt"),
    rw("uniq in out"),
    rw("xxd in out"),
    rw("xxd -r in out"),
    rw("printf -v PATH '/tmp'"),
    rw("printf $FMT"),
    rw("date -s '2020-01-01'"),
    rw("date --set='x'"),
    rw("tree -o out.txt"),
    rw("tree -R -H ."),
    rw("file -C -m magic"),
    rw("hostname evil"),
]

COMMAND_NAMES = [
    rw("'git status'"),
    rw('"git status"'),
    ro("'git' status"),
    ro("\\ls"),
    ro('c"at" f'),
    ro("/usr/bin/cat f"),
    ro("/bin/ls"),
    ro("/usr/local/bin/rg foo"),
    rw("/usr/bin/curl x"),
    rw("./cat f"),
    rw("bin/cat f"),
    rw("/work/repo/ls"),
    rw("/usr/bin/../../tmp/cat f"),
    rw("$CMD .", critical=True),  # `CMD="rm -r"`: an unknown program may be rm
    rw("/bin/rm x"),
]

GLOBS = [
    rw("touch -- -delete; find *"),
    rw("find *"),
    rw("ls *"),
    rw("ls *.py"),
    rw("cat -- *"),
    rw("find . -name *.py"),
    rw("ls -*"),
    rw("ls ?x"),
    rw("ls [a-z]*"),
    rw("find . {-delete,}"),
    rw("echo *"),
    ro("ls ./*.py"),
    ro("ls src/*.py"),
    ro("ls src/{a,b}.py"),
    ro("find . -name '*.py'"),
]

CRITICAL_DELETES = [
    rw("rm -rf /", critical=True),
    rw("rm -rf ~", critical=True),
    rw("rm -rf ~/", critical=True),
    rw("rm -rf .", critical=True),
    rw("rm -rf ..", critical=True),
    rw("rm -rf ../..", critical=True),
    rw("rm -rf $EMPTY/*", critical=True),
    rw('rm -rf "$HOME"', critical=True),
    rw("rm -rf ${HOME}", critical=True),
    rw("rm -rf $HOME/*", critical=True),
    rw("rm -r /*", critical=True),
    rw("rm -rf -- /", critical=True),
    rw("rm -rf / --no-preserve-root", critical=True),
    rw("rm -rf /usr", critical=True),
    rw("rm -rf /etc/", critical=True),
    rw("rm -rf /work/repo", critical=True),
    rw("rm -rf /work/repo/*", critical=True),
    rw("rm -rf *", critical=True),
    rw('rm -rf "$DIR"/', critical=True),
    rw("rm -rf {/,}", critical=True),
    rw("sudo rm -rf /", critical=True),
    rw("bash -c 'rm -rf /'", critical=True),
    rw('sh -c "rm -rf ~"', critical=True),
    rw("eval 'rm -rf /'", critical=True),
    rw("timeout 5 rm -rf /", critical=True),
    rw("/bin/rm -rf /", critical=True),
    rw("ls && rm -rf /", critical=True),
    rw("echo $(rm -rf /)", critical=True),
    rw("rm -rf / )", critical=True, parse_ok=False),
    # Issue 9 item 6: the workspace through variables, `cd`, `..`, find, xargs, .git, ...
    rw('rm -rf "$PWD"', critical=True),
    rw("rm -rf $(pwd)", critical=True),
    rw("cd .. && rm -rf repo", critical=True),
    rw("cd /tmp; rm -rf x", critical=True),
    rw("cd; rm -rf x", critical=True),
    rw("pushd sub; rm -rf x", critical=True),
    rw("rm -rf ../repo", critical=True),
    rw("rm -rf /work", critical=True),
    rw("rm -rf /tmp/x", critical=True),
    rw("find . -name '*.o' -delete", critical=True),
    rw("find -delete", critical=True),
    rw("find . -exec rm -rf {} +", critical=True),
    rw("find /work/repo -execdir sh -c 'rm -rf \"$1\"' _ {} \\;", critical=True),
    rw("pwd | xargs rm -rf", critical=True),
    rw("ls | xargs -n1 rm -r", critical=True),
    rw("git clean -f", critical=True),
    rw("git -C . clean -fd", critical=True),
    rw("rm -rf .git", critical=True),
    rw("rm -rf .git/objects", critical=True),
    rw("rm -rf sub/.git", critical=True),
    rw("rm -f .git/index", critical=True),
    rw("rm -rf build/.*", critical=True),
    rw("rm -rf *.o", critical=True),
    rw("shred -u *", critical=True),
    rw("shred -u ../x", critical=True),
    rw("truncate -s 0 *", critical=True),
    rw('mv "$PWD" /tmp/gone', critical=True),
    rw("mv /work/repo /dev/null", critical=True),
    rw("mv .git old", critical=True),
    rw("unlink .git", critical=True),
    rw("rsync -a --delete empty/ ./", critical=True),
    rw("timeout --bogus 5 rm -rf /", critical=True),
    rw("sudo -u nobody rm -rf /", critical=True),
    rw("env -S 'x' rm -rf .", critical=True),
    rw("xargs -0 -I{} rm -rf {}", critical=True),
    rw("rm -r$X build", critical=True),
    rw("sh -c 'cd .. && rm -rf repo'", critical=True),
    rw('eval "rm -rf \\$PWD"', critical=True),
    rw('X=rm; $X -rf "$PWD"', critical=True),  # a program not known before it runs may be rm
    rw('"$RM" -r ..', critical=True),
    rw('"$EDITOR" src/a.py'),
    rw("rm -rf build/*.o"),
    rw("rm -rf src/gen"),
    rw("rm -rf /work/repo/build"),
    rw("cd src && rm -rf build"),
    rw("find build -delete"),
    rw("find src -name '*.pyc' -exec rm {} +"),
    rw("find . -name x -exec grep y {} +"),
    rw("git clean -fd build"),
    rw("git clean -n"),
    rw("xargs rm -f"),
    rw("shred -u build/key"),
    rw("truncate -s 0 build/log"),
    rw("mv build old-build"),
    rw("rm -rf build/{a,b}", critical=True),
    rw("rm -rf build"),
    rw("rm -rf ./build"),
    rw('rm -rf "$DIR"', critical=True),
    rw("rm -rf ${DIR:?}/*", critical=True),
    rw("rm -f /tmp/x.txt"),
    rw("rm -rf ~/project/build", critical=True),
    rw("rm -- -x"),
]

PARSE_ERRORS = [
    rw("echo $(", parse_ok=False),
    rw("ls &&", parse_ok=False),
    rw("ls |", parse_ok=False),
    rw("if true; then ls", parse_ok=False),
    rw('echo "unterminated', parse_ok=False),
    rw("cat <<A <<B\na\nA\nb\nB", parse_ok=False),
    rw(")", parse_ok=False),
    rw("x=1 >out", parse_ok=False),
    rw("ls\x00rm -rf x", parse_ok=False),
    rw("ls \ud800", parse_ok=False),
]

# Places where tree-sitter-bash and bash disagree about words, comments or commands; each
# was found by comparing the analyser with `bash -x` (test_bash_properties.py).
GRAMMAR_DIVERGENCES = [
    rw("ls\n\\rm x"),  # the grammar folds the newline and `\rm` into a word of `ls`
    rw("\\ cat"),  # bash runs ` cat`; the grammar drops the escaped blank
    rw("printf x ==$'a'"),  # one word `==a` to bash, two to the grammar
    rw("tee $"),  # a loose `$` token is the file name `$`
    rw("sort -o2>/dev/null"),  # `-o2` is an argument, not a file descriptor
    rw("tee>&-x"),  # close stdout, then `tee x`
    rw("cat <<< $\na"),  # the grammar glues `$` and the next line's `a`
    rw("cat[ -0 ]="),  # the command `cat[` to bash, an assignment to the grammar
    rw("a[ 1 ]=x"),
    rw("[ ]#x"),  # `]#x` is a word to bash
    rw("!\\\ntee"),  # the command `!tee`
    rw("ls\\\n#x"),  # the word `ls#x`
    rw("[]"),
    rw("[a]"),
    rw("{}"),
    rw("{ls;}"),
    rw("{ \U0001f600; }", parse_ok=False),  # tree-sitter-bash#337 would crash: not parsed
    rw("xxd -fprint0<<'EOF'\n$xif "),  # no closing line: the scanner loses its place
    rw("awk 0<&- 'BEGIN{system(\"id\")}'"),  # `0` is a descriptor, not the awk program
    ro("echo 0>&- 2"),
    ro("ls 2>&1 -la"),
    ro("ls;#comment"),
    ro("{ ls\n}"),
]

CASES = (
    GRAMMAR_DIVERGENCES
    + PLAIN_READ_ONLY
    + GIT_READ_ONLY
    + OPERATORS_AND_NEWLINES
    + SUBSTITUTIONS
    + REDIRECTIONS
    + SUBSHELLS_AND_GROUPS
    + WRAPPERS_AND_ASSIGNMENTS
    + NEVER_READ_ONLY
    + FIND
    + SED
    + RG
    + GIT
    + OTHER_FLAGS
    + COMMAND_NAMES
    + GLOBS
    + CRITICAL_DELETES
    + PARSE_ERRORS
)


@pytest.fixture(scope="module")
def analyser() -> BashAnalyser:
    return BashAnalyser()


def test_the_table_is_large_and_has_no_duplicates() -> None:
    commands = [case.command for case in CASES]
    assert len(commands) >= 200
    assert len(set(commands)) == len(commands)


@pytest.mark.parametrize("case", CASES, ids=[repr(case.command)[1:-1][:60] for case in CASES])
def test_classification(analyser: BashAnalyser, case: Case) -> None:
    with_floor = analyser.classify(case.command, floor=True, workspace=WORKSPACE)
    without = analyser.classify(case.command, floor=False, workspace=WORKSPACE)
    explain = f"{case.command!r}: {with_floor.reasons} {with_floor.parts}"

    assert with_floor.read_only is case.floor_read_only, explain
    assert with_floor.decision_hint == ("allow" if case.floor_read_only else "ask"), explain
    assert without.decision_hint == case.no_floor_hint, explain
    assert without.read_only is with_floor.read_only, "read_only must not depend on the floor"
    assert with_floor.critical_delete is case.critical, explain
    assert with_floor.parse_ok is case.parse_ok, explain
    for result in (with_floor, without):
        assert result.concurrency_safe is (result.decision_hint == "allow")
        # A refusal always says why; a read-only command has nothing to explain.
        assert bool(result.reasons) is not result.read_only, explain


def test_no_floor_exact_list_is_allowed_only_exactly(analyser: BashAnalyser) -> None:
    for command in NO_FLOOR_EXACT_COMMANDS:
        assert analyser.classify(command, floor=False).decision_hint == "allow"
        assert analyser.classify(command + " > out", floor=False).decision_hint == "ask"
        assert analyser.classify(command + " $X", floor=False).decision_hint == "ask"
        assert analyser.classify(command + "\nrm x", floor=False).decision_hint == "ask"
        assert analyser.classify(f"'{command}'", floor=False).decision_hint == "ask"


def test_parts_split_on_every_operator(analyser: BashAnalyser) -> None:
    result = analyser.classify("a 1 && b 2 || c 3; d 4 | e 5 & f 6\ng 7 |& h 8", floor=True)
    assert [part.words for part in result.parts] == [
        (name, str(number)) for number, name in enumerate("abcdefgh", start=1)
    ]
    assert result.parts[0].reason == "`a` is not a read-only command"


def test_parts_keep_words_as_written_and_resolve_wrappers(analyser: BashAnalyser) -> None:
    result = analyser.classify("LC_ALL=C timeout 5 '/usr/bin/rg' \"a b\" $(ls src)", floor=True)
    host, nested = result.parts
    assert host.words == ("timeout", "5", "'/usr/bin/rg'", '"a b"', "$(ls src)")
    assert host.assignments == ("LC_ALL=C",)
    assert host.program == "rg"
    assert host.text == "LC_ALL=C timeout 5 '/usr/bin/rg' \"a b\" $(ls src)"
    assert not host.nested
    assert nested.words == ("ls", "src") and nested.nested
    assert result.read_only


def test_flags(analyser: BashAnalyser) -> None:
    plain = analyser.classify("ls -la", floor=True)
    assert not (
        plain.has_substitution or plain.has_expansion or plain.has_redirection or plain.has_heredoc
    )
    assert analyser.classify("echo $(pwd)", floor=True).has_command_substitution
    assert analyser.classify("echo `pwd`", floor=True).has_substitution
    assert analyser.classify("diff <(ls) f", floor=True).has_process_substitution
    assert analyser.classify("echo $HOME", floor=True).has_expansion
    assert analyser.classify("echo ${x}", floor=True).has_expansion
    assert analyser.classify("echo $((1+1))", floor=True).has_expansion
    assert analyser.classify("ls src/*.py", floor=True).has_expansion
    assert analyser.classify("ls 2>&1", floor=True).has_redirection
    assert not analyser.classify("ls 2>&1", floor=True).has_write_redirection
    assert analyser.classify("ls > x", floor=True).has_write_redirection
    heredoc = analyser.classify("cat <<EOF\nx\nEOF", floor=True)
    assert heredoc.has_heredoc and heredoc.has_redirection and heredoc.read_only


def test_reasons_name_the_problem(analyser: BashAnalyser) -> None:
    def reasons(command: str) -> str:
        return " | ".join(analyser.classify(command, floor=True).reasons)

    assert "`rm` is not a read-only command" in reasons("ls; rm x")
    assert "write redirection to `out.txt`" in reasons("ls > out.txt")
    assert "`find -exec` runs commands" in reasons("find . -exec ls {} +")
    assert "`sed -i` edits files in place" in reasons("sed -i s/a/b/ f")
    assert "`rg --pre` runs a preprocessor program" in reasons("rg --pre=x y")
    assert "`git -c`" in reasons("git -c core.pager=sh log")
    assert "`git log --output` writes to a file" in reasons("git log --output=x")
    assert "`sort -o` writes to a file" in reasons("sort -o x y")
    assert "`tee` writes to `x`" in reasons("ls | tee x")
    assert "`xargs` runs a command" in reasons("ls | xargs rm")
    assert "`system()` runs commands" in reasons("awk 'BEGIN{system(\"x\")}'")
    assert "`git status` is not a read-only command" in reasons("'git status'")
    assert "standard system directory" in reasons("./cat x")
    assert "`curl` is not a read-only command" in reasons("command curl x")
    assert "could expand to a file name starting with `-`" in reasons("find *")
    assert "`rm /` deletes / (everything)" in reasons("rm -rf /")
    assert "could not be parsed" in reasons("echo $(")
    assert "`PATH=...` changes how `ls` runs" in reasons("PATH=/x ls")


def test_too_long_is_never_parsed(analyser: BashAnalyser) -> None:
    command = "ls " + "a" * MAX_COMMAND_CHARS
    for floor in (True, False):
        result = analyser.classify(command, floor=floor)
        assert result.too_long and not result.read_only and result.decision_hint == "ask"
        assert result.parts == ()
    assert not analyser.classify("ls " + "a" * (MAX_COMMAND_CHARS - 3), floor=True).too_long


def test_deep_nesting_does_not_hit_the_recursion_limit(analyser: BashAnalyser) -> None:
    # The walk is iterative: 2,400 nested subshells fit in 10,000 characters. (Written
    # without blanks, `((((ls))))` is an arithmetic command to bash, which evaluates the
    # variable `ls`: not read-only.)
    depth = 2400
    result = analyser.classify("( " * depth + "ls" + " )" * depth, floor=True)
    assert result.read_only
    assert not analyser.classify("(" * 3000 + "ls" + ")" * 3000, floor=True).read_only
    substitutions = "echo " + "$(" * 2000 + "rm x" + ")" * 2000
    assert not analyser.classify(substitutions, floor=True).read_only


def test_empty_command_runs_nothing(analyser: BashAnalyser) -> None:
    for command in ("", "   ", "# only a comment"):
        result = analyser.classify(command, floor=True)
        assert result.read_only and result.parts == ()


def test_git_c_needs_a_workspace(analyser: BashAnalyser) -> None:
    assert not analyser.classify("git -C sub log", floor=True).read_only
    assert analyser.classify("git -C sub log", floor=True, workspace=WORKSPACE).read_only
    assert analyser.classify("git -C . log", floor=True, workspace=WORKSPACE).read_only
    inside = analyser.classify("git -C /work/repo-other log", floor=True, workspace=WORKSPACE)
    assert not inside.read_only


def test_a_recursive_delete_is_safe_only_strictly_inside_a_known_workspace(
    analyser: BashAnalyser,
) -> None:
    assert analyser.classify("rm -rf /work/repo/", floor=True, workspace=WORKSPACE).critical_delete
    # Without a workspace nothing absolute is known to be inside it.
    assert analyser.classify("rm -rf /work/repo/build", floor=True).critical_delete
    assert not analyser.classify("rm -f /work/repo", floor=True).critical_delete
    assert not analyser.classify("rm -rf build", floor=True).critical_delete
    assert not analyser.classify(
        "rm -rf /work/repo/build", floor=True, workspace=WORKSPACE
    ).critical_delete


def test_the_parser_is_created_once_per_analyser() -> None:
    analyser = BashAnalyser()
    assert analyser._parser is None  # nothing loaded before first use
    analyser.classify("ls", floor=True)
    parser = analyser._parser
    analyser.classify("pwd", floor=True)
    assert parser is not None and analyser._parser is parser


def test_module_functions_match_the_analyser(analyser: BashAnalyser) -> None:
    command = "rg foo | head"
    assert classify(command, floor=True) == analyser.classify(command, floor=True)
    assert suggest_rule("npm run test") == analyser.suggest_rule("npm run test")


def test_classification_is_a_frozen_value(analyser: BashAnalyser) -> None:
    result = analyser.classify("ls", floor=True)
    assert isinstance(result, BashClassification)
    with pytest.raises(AttributeError):
        result.read_only = False  # type: ignore[misc]


RULES = [
    ("npm run test", "Bash(npm run test:*)"),
    ("npm run test -- --watch", "Bash(npm run test:*)"),
    ("cargo test --lib", "Bash(cargo test:*)"),
    ("make check", "Bash(make check:*)"),
    ("pytest tests/test_x.py -q", "Bash(pytest:*)"),
    ("git push origin main", "Bash(git push origin:*)"),
    ("  ls -la  ", "Bash(ls:*)"),
    # Not a simple command of plain words: the exact command only.
    ("npm test > out.txt", "Bash(npm test > out.txt)"),
    ("npm test | tee log", "Bash(npm test | tee log)"),
    ("npm test && rm -rf x", "Bash(npm test && rm -rf x)"),
    ("npm run $(echo test)", "Bash(npm run $(echo test))"),
    ("npm run $SCRIPT", "Bash(npm run $SCRIPT)"),
    ("CI=1 npm test", "Bash(CI=1 npm test)"),
    ("npm test;", "Bash(npm test;)"),
    ("git commit -m 'a message'", "Bash(git commit -m 'a message')"),
    # Programs whose arguments can run anything: the exact command only.
    ("python script.py", "Bash(python script.py)"),
    ("bash build.sh", "Bash(bash build.sh)"),
    ("xargs rm", "Bash(xargs rm)"),
    ("timeout 5 make", "Bash(timeout 5 make)"),
    ("rm -rf build", "Bash(rm -rf build)"),
    ("find . -delete", "Bash(find . -delete)"),
    ("git -C x push", "Bash(git -C x push)"),
    ("echo $(", "Bash(echo $()"),
]


@pytest.mark.parametrize(("command", "rule"), RULES)
def test_suggest_rule(analyser: BashAnalyser, command: str, rule: str) -> None:
    assert analyser.suggest_rule(command) == rule
