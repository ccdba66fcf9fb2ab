# check-lib.sh - what the tools/check-* scripts share. Each sources it after `set -uo pipefail`:
#     . "$(dirname "$0")/check-lib.sh"
# and ends with check_summary (or check_fatal at its first failure). It gives:
#   pass, fail, ok [WHAT], bad WHAT   the counters; ok prints "ok: WHAT" when given a WHAT,
#                                     bad always prints "FAILED: WHAT"
#   check_summary                     the Check-style line tools/run-tests reads
#                                     ("NN%: Checks: C, Failures: F, Errors: 0"); its status
#                                     is 1 when a check failed
#   check_fatal WHAT                  "$check_name: WHAT", the line with one more failure,
#                                     exit 1 (scripts that stop at their first failure)
#   check_tmpdir VAR                  a new temporary folder in VAR, removed at exit
#   bg+=(PID)                         background processes (and their process groups) killed
#                                     at exit; a script's own check_on_exit runs first
#   check_py ARGS...                  tools/check_util.py: JSON fields, float comparisons,
#                                     the generated texts, safetensors comparisons
#   field FILE KEY, jfield FILE KEY   check_py field / jfield, errors silenced (empty output)
#   mpi_allow_root                    lets mpirun start as root (containers, CI)
check_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
check_name=${check_name:-$(basename "$0")}
pass=0 fail=0
bg=()
check_dirs=()

ok() { pass=$((pass + 1)); [ $# -eq 0 ] || echo "ok: $*"; }
bad() { echo "FAILED: $*"; fail=$((fail + 1)); }
check_summary() {
    local total=$((pass + fail))
    echo "$(( total > 0 ? 100 * pass / total : 100 ))%: Checks: $total, Failures: $fail, Errors: 0"
    [ "$fail" -eq 0 ]
}
check_fatal() {
    echo "$check_name: $*"
    fail=$((fail + 1))
    check_summary
    exit 1
}

_check_exit() {
    local p
    ! declare -F check_on_exit > /dev/null || check_on_exit
    for p in "${bg[@]}"; do kill -KILL -- "-$p" "$p" 2> /dev/null; done
    [ ${#check_dirs[@]} -eq 0 ] || rm -rf "${check_dirs[@]}"
}
trap _check_exit EXIT
check_tmpdir() {
    local d
    d=$(mktemp -d) || { echo "$check_name: mktemp -d failed"; exit 2; }
    check_dirs+=("$d")
    printf -v "$1" '%s' "$d"
}

check_py() { python3 "$check_tools/check_util.py" "$@"; }
field() { check_py field "$1" "$2" 2> /dev/null; }
jfield() { check_py jfield "$1" "$2" 2> /dev/null; }
mpi_allow_root() { export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; }
# same_tensors NAME A B: ok NAME when the safetensors files A and B hold the same tensors
# byte for byte (their metadata, e.g. the run id, may differ), else bad with what differs
same_tensors() {
    local why
    if why=$(check_py same-tensors "$2" "$3" 2>&1); then ok "$1"; else bad "$1: $(tail -1 <<<"$why")"; fi
}
