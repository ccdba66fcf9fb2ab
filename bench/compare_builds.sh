#!/usr/bin/env bash
# compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS] - the bundled workloads (W1 mlp, W2 cnn,
# W3 gpt, W3b gpt --batch 4 --block-size 64) of two builds of nabla in the same run, runs
# alternating so machine noise hits both alike, on both x86 instruction sets:
#
#   native  the two builds as given (compiled for this CPU), the libraries free to use its
#           best instructions (OPENBLAS_CORETYPE as the environment has it);
#   avx2    x86-64-v3 builds of the same sources, BASE_BUILD-avx2 and NEW_BUILD-avx2 (set up
#           and built here when missing: meson -Dnative=false -Dc_args=-march=x86-64-v3),
#           with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2) and OpenBLAS to its Haswell
#           kernels: what a CPU without AVX-512 (AMD Zen 3, Intel before Ice Lake) runs.
#
# ISAS="native avx2" (the default) picks the passes; on a CPU without AVX-512 the native pass
# already is AVX2. WORKLOADS="mlp cnn gpt gpt_b4" picks the workloads. Prints each build's
# median step time and the ratio new/base per workload and pass (< 1.00: the new build is
# faster). For "no regression" checks of a change: build the previous commit in one folder
# and this one in another (bench/README.md).
set -uo pipefail
base=${1:?usage: compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS]}
new=${2:?usage: compare_builds.sh BASE_BUILD NEW_BUILD [REPEATS]}
reps=${3:-5}
isas=${ISAS:-native avx2}
workloads=${WORKLOADS:-mlp cnn gpt gpt_b4}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
grep -m1 "model name" /proc/cpuinfo
grep -qw avx512f /proc/cpuinfo && echo "CPU has AVX-512" || echo "CPU has no AVX-512"
uptime

# A portable AVX2 build of the sources BUILD was configured from, in BUILD-avx2.
avx2_build() {
    local b=$1 d=$1-avx2
    if [ ! -f "$d/build.ninja" ]; then
        local src
        src=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["directories"]["source"])' \
            "$b/meson-info/meson-info.json") || return 1
        meson setup "$d" "$src" -Dcuda=disabled -Dnative=false -Dc_args=-march=x86-64-v3 \
            >"$out/setup.log" 2>&1 || { tail -5 "$out/setup.log"; return 1; }
    fi
    nice -n 19 ninja -C "$d" models/mlp models/cnn models/gpt/gpt >"$out/ninja.log" 2>&1 ||
        { tail -5 "$out/ninja.log"; return 1; }
}

step_ms() { # the JSON line's median step in ms (gpt reports step_ms_median)
    python3 -c '
import json, sys
o = json.loads(sys.argv[1])
print(o.get("median_step_ms") or o.get("step_ms_median"))' "$1"
}

args_of() { # the program and its arguments for a workload
    case $1 in
    mlp) echo "models/mlp --epochs 1 --threads 2" ;;
    cnn) echo "models/cnn --epochs 1 --threads 2" ;;
    gpt) echo "models/gpt/gpt --steps 60 --schedule constant --eval-batches 1 --threads 2" ;;
    gpt_b4) echo "models/gpt/gpt --steps 200 --batch 4 --block-size 64 --schedule constant --eval-batches 1 --threads 2" ;;
    esac
}

run() { # pass, workload, base dir, new dir, then env assignments
    local pass=$1 name=$2 bdir=$3 ndir=$4; shift 4
    local cmd
    cmd=$(args_of "$name")
    : >"$out/$pass.$name.base"; : >"$out/$pass.$name.new"
    for r in $(seq "$reps"); do
        for b in base new; do
            local dir=$bdir
            [ $b = new ] && dir=$ndir
            local line
            # shellcheck disable=SC2086
            line=$(env "$@" $dir/$cmd 2>/dev/null | tail -1)
            step_ms "$line" >>"$out/$pass.$name.$b"
        done
    done
    python3 - "$pass" "$name" "$out" <<'PY'
import statistics, sys
p, name, out = sys.argv[1:4]
b = [float(x) for x in open(f"{out}/{p}.{name}.base")]
n = [float(x) for x in open(f"{out}/{p}.{name}.new")]
ratios = [y / x for x, y in zip(b, n)]
print(f"{p:6s} {name}: base median {statistics.median(b):.2f} ms, new median "
      f"{statistics.median(n):.2f} ms, new/base {statistics.median(n) / statistics.median(b):.3f} "
      f"(paired ratios {', '.join(f'{r:.3f}' for r in ratios)})", flush=True)
PY
}

for isa in $isas; do
    case $isa in
    native)
        for w in $workloads; do run native "$w" "$base" "$new" NB_UNUSED=1; done ;;
    avx2)
        avx2_build "$base" && avx2_build "$new" || { echo "avx2: could not build"; continue; }
        for w in $workloads; do
            run avx2 "$w" "$base-avx2" "$new-avx2" ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 \
                OPENBLAS_CORETYPE=Haswell
        done ;;
    *) echo "unknown instruction set pass: $isa (native or avx2)" ;;
    esac
done
