#!/usr/bin/env bash
# compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS] - the bundled workloads (W1 mlp, W2 cnn,
# W3 gpt) of two builds of nabla in the same run, runs alternating so machine noise hits both
# alike. Prints each build's median step time and the ratio new/base per workload (< 1.00
# means the new build is faster). For "no regression" checks of a change: build the
# previous commit in one folder and this one in another.
set -uo pipefail
base=${1:?usage: compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS]}
new=${2:?usage: compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS]}
reps=${3:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
uptime

step_ms() { # the JSON line's median step in ms (gpt reports tokens_per_s for 16 x 128)
    python3 -c '
import json, sys
o = json.loads(sys.argv[1])
print(o["median_step_ms"] if "median_step_ms" in o else 16 * 128 / o["tokens_per_s"] * 1e3)' "$1"
}

run() { # name, then the arguments after the binary's path
    local name=$1 bin=$2; shift 2
    for r in $(seq "$reps"); do
        for b in base new; do
            local dir=$base
            [ $b = new ] && dir=$new
            local line
            line=$("$dir/$bin" "$@" 2>/dev/null | tail -1)
            step_ms "$line" >>"$out/$name.$b"
        done
    done
    python3 - "$name" "$out" <<'PY'
import statistics, sys
name, out = sys.argv[1], sys.argv[2]
b = [float(x) for x in open(f"{out}/{name}.base")]
n = [float(x) for x in open(f"{out}/{name}.new")]
ratios = [y / x for x, y in zip(b, n)]
print(f"{name}: base median {statistics.median(b):.2f} ms, new median {statistics.median(n):.2f} ms, "
      f"new/base {statistics.median(n) / statistics.median(b):.3f} "
      f"(paired ratios {', '.join(f'{r:.3f}' for r in ratios)})")
PY
}

run mlp models/mlp --epochs 1 --threads 2
run cnn models/cnn --epochs 1 --threads 2
run gpt models/gpt/gpt --steps 60 --threads 2
