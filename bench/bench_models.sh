#!/usr/bin/env bash
# bench_models.sh [BUILD] [REPEATS] - training throughput of the bundled models next to their
# peers, measured in the same run with the runs alternated so machine noise hits all alike:
#   W1 mlp, W2 cnn, W3 gpt      against PyTorch's torch_ref.py W1 / W2 / W3 (NB_PEERS);
#   W3 and W3b (gpt --batch 4 --block-size 64) against llm.c's CPU trainer (LLMC_DIR);
#   W3 in bf16 autocast against nabla's own fp32 W3.
# Reports per-step medians and paired ratios (peer step / nabla step: > 1 means nabla is
# faster), nabla's achieved GFLOP/s, and the CPU they came from.
#
# Environment:
#   NB_PEERS     folder holding torch_ref.py (not part of this repository); without it no
#                PyTorch runs.
#   NB_TORCH_PY  the python that has torch (default /usr/bin/python3, e.g. a venv's python
#                with PyTorch 2.x from PyPI).
#   LLMC_DIR     llm.c built as its README beside the peers says (train_gpt2 reading LLMC_B
#                and LLMC_T); LLMC_BIN names the binary in it (default train_gpt2).
#   ISA=avx2     measure what a CPU without AVX-512 runs: BUILD should then be an x86-64-v3
#                build (meson -Dnative=false -Dc_args=-march=x86-64-v3), and oneDNN, MKL,
#                PyTorch's own kernels and OpenBLAS are held to AVX2 for every program
#                (ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS,
#                ATEN_CPU_CAPABILITY, OPENBLAS_CORETYPE); LLMC_BIN should then be an llm.c
#                built with -march=x86-64-v3. Default: the CPU's own best (ISA=native).
#   BASE         a second nabla build (e.g. the previous main, built the same way) run in the
#                same rotation as BUILD and reported as a peer: base/nabla > 1 means BUILD is
#                faster. With ISA=avx2 it should be an x86-64-v3 build too.
#   WORKLOADS    any of "mlp cnn gpt gpt_b4 gpt_bf16" (default all).
#   THREADS      threads of every program (default 2). On a machine other jobs keep busy, 1
#                thread measures each program's own work (every one gets its share of a
#                core), where 2-thread runs also measure how each threading runtime copes
#                with the contention (OpenMP teams that spin or wait at barriers suffer most).
set -uo pipefail
build=${1:-build}
reps=${2:-3}
peers=${NB_PEERS:-}
py=${NB_TORCH_PY:-/usr/bin/python3}
isa=${ISA:-native}
workloads=${WORKLOADS:-mlp cnn gpt gpt_b4 gpt_bf16}
llmc=${LLMC_DIR:-}
llmc_bin=${LLMC_BIN:-train_gpt2}
th=${THREADS:-2}
base=${BASE:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

if [ "$isa" = avx2 ]; then
    export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
    export ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell
fi
echo "bench_models: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family" \
     "$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ') model" \
     "$(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | tr -d ' ');" \
     "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512');" \
     "instruction sets measured: $isa; build $build; $reps rounds; $th threads"
[ -n "$base" ] && echo "bench_models: base build $base"
uptime
peer=0
if [ -z "$peers" ] || [ ! -f "$peers/torch_ref.py" ]; then
    echo "bench_models: no PyTorch peer (set NB_PEERS to the folder holding torch_ref.py)"
elif ! $py -c 'import torch' 2>/dev/null; then
    echo "bench_models: PyTorch is not importable by $py (set NB_TORCH_PY): no PyTorch peer"
else
    peer=1
    $py -c 'import torch; print("PyTorch", torch.__version__, "CPU capability",
        torch.backends.cpu.get_cpu_capability())' 2>/dev/null
fi
have_llmc=0
if [ -n "$llmc" ] && [ -x "$llmc/$llmc_bin" ]; then have_llmc=1; fi

nabla_ms() { # the median step in ms from nabla's last JSON line
    python3 -c 'import json, sys; o = json.loads(sys.argv[1])
print(o.get("median_step_ms") or o.get("step_ms_median"))' "$1"
}
torch_ms() { # the median step of torch_ref.py's JSON line
    python3 -c 'import json, sys; print(json.loads(sys.argv[1])["median_ms"])' "$1"
}
llmc_ms() { # the median of llm.c's "step N: ... (took X ms)" lines
    python3 -c 'import re, statistics, sys
t = [float(x) for x in re.findall(r"\(took ([0-9.]+) ms\)", sys.stdin.read())]
print(statistics.median(t) if t else "nan")'
}

# one round of a contender: appends its median step (ms) to $out/<key>
run_nabla() { local key=$1; shift; nabla_ms "$("$@" 2>/dev/null | tail -1)" >>"$out/$key"; }
run_base() { # the same command line with BASE's program instead of BUILD's
    [ -n "$base" ] || return 0
    local key=$1 prog=$2; shift 2
    run_nabla "$key" "$base/${prog#"$build"/}" "$@"
}
run_torch() {
    local key=$1 w=$2; shift 2
    torch_ms "$($py "$peers/torch_ref.py" "$w" --threads "$th" "$@" 2>/dev/null | grep '^JSON ' | sed 's/^JSON //')" \
        >>"$out/$key"
}
run_llmc() {
    local key=$1 b=$2 t=$3
    (cd "$llmc" && OMP_NUM_THREADS=$th LLMC_B=$b LLMC_T=$t "./$llmc_bin" 2>/dev/null) | llmc_ms \
        >>"$out/$key"
}

report() { # name, gflop per step, nabla key, then pairs of (peer label, peer key)
    local name=$1 gflop=$2 ours=$3; shift 3
    python3 - "$out" "$name" "$gflop" "$ours" "$@" <<'PY'
import statistics, sys
out, name, gflop, ours = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
rest = sys.argv[5:]
def load(k):
    try:
        return [float(x) for x in open(f"{out}/{k}") if x.strip() and x.strip() != "nan"]
    except OSError:
        return []
n = load(ours)
if not n:
    print(f"{name}: no nabla result"); sys.exit()
ms = statistics.median(n)
line = f"{name}: nabla {ms:.2f} ms/step ({gflop / ms * 1e3:.0f} GFLOP/s; rounds {', '.join(f'{x:.1f}' for x in n)})"
for label, key in zip(rest[::2], rest[1::2]):
    p = load(key)
    if not p: continue
    r = [b / a for a, b in zip(n, p)]
    line += (f"; {label} {statistics.median(p):.2f} ms, {label}/nabla {statistics.median(r):.2f}x "
             f"(paired {', '.join(f'{x:.2f}' for x in r)})")
print(line, flush=True)
print(f"RESULT model {name} {ms:.3f} ms")
PY
}

gpt="$build/models/gpt/gpt"
for w in $workloads; do
    echo "$w: load$(uptime | sed 's/.*load average//')"
    case $w in
    mlp)
        for r in $(seq "$reps"); do
            run_nabla mlp "$build/models/mlp" --epochs 1 --threads "$th"
            run_base mlp.base "$build/models/mlp" --epochs 1 --threads "$th"
            [ $peer = 1 ] && run_torch mlp.torch w1
        done
        report "W1 mlp" 2.448 mlp base mlp.base PyTorch mlp.torch ;;
    cnn)
        for r in $(seq "$reps"); do
            run_nabla cnn "$build/models/cnn" --epochs 1 --threads "$th"
            run_base cnn.base "$build/models/cnn" --epochs 1 --threads "$th"
            [ $peer = 1 ] && run_torch cnn.torch w2
        done
        report "W2 cnn" 3.199 cnn base cnn.base PyTorch cnn.torch ;;
    gpt)
        for r in $(seq "$reps"); do
            run_nabla gpt "$gpt" --steps 60 --schedule constant --eval-batches 1 --threads "$th"
            run_base gpt.base "$gpt" --steps 60 --schedule constant --eval-batches 1 --threads "$th"
            [ $peer = 1 ] && run_torch gpt.torch w3 --w3-steps 60
            [ $have_llmc = 1 ] && run_llmc gpt.llmc 16 128
        done
        report "W3 gpt" 42.68 gpt base gpt.base PyTorch gpt.torch llm.c gpt.llmc ;;
    gpt_b4)
        for r in $(seq "$reps"); do
            run_nabla gpt_b4 "$gpt" --steps 200 --batch 4 --block-size 64 --schedule constant \
                --eval-batches 1 --threads "$th"
            run_base gpt_b4.base "$gpt" --steps 200 --batch 4 --block-size 64 --schedule constant \
                --eval-batches 1 --threads "$th"
            [ $have_llmc = 1 ] && run_llmc gpt_b4.llmc 4 64
        done
        report "W3b gpt --batch 4 --block-size 64" 5.13 gpt_b4 base gpt_b4.base llm.c gpt_b4.llmc ;;
    gpt_bf16)
        for r in $(seq "$reps"); do
            run_nabla gpt_bf16 "$gpt" --steps 60 --schedule constant --eval-batches 1 --threads "$th" \
                --precision bf16
            run_nabla gpt_fp32 "$gpt" --steps 60 --schedule constant --eval-batches 1 --threads "$th"
        done
        report "W3 gpt bf16 autocast" 42.68 gpt_bf16 "nabla-fp32" gpt_fp32 ;;
    *) echo "bench_models: unknown workload $w" ;;
    esac
done
