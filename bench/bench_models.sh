#!/usr/bin/env bash
# bench_models.sh [BUILD] [REPEATS] - training throughput of the bundled models next to the
# PyTorch peer (torch_ref.py W1/W2/W3) measured in the same run, alternating
# runs so machine noise hits both alike. Reports per-step medians and their ratio
# (peer median step time / nabla median step time: > 1 means nabla is faster), and nabla's
# achieved GFLOP/s next to the raw GEMM rate. Needs Debian's python3-torch for the peer.
set -uo pipefail
build=${1:-build}
reps=${2:-3}
# The peer script is not part of this repository: NB_PEERS names the folder holding
# torch_ref.py. Without it only nabla's side runs.
peers=${NB_PEERS:-}
py=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -z "$peers" ] || [ ! -f "$peers/torch_ref.py" ]; then
    echo "bench_models: no peer (set NB_PEERS to the folder holding torch_ref.py)"
    peer=0
elif ! $py -c 'import torch' 2>/dev/null; then
    echo "bench_models: PyTorch is not importable by $py (apt-get install python3-torch): no peer"
    peer=0
else
    peer=1
fi
field() { $py -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

run_pair() { # name, peer workload, gflop per step, nabla command...
    local name=$1 w=$2 gflop=$3; shift 3
    for r in $(seq "$reps"); do
        local ours theirs
        ours=$("$@" 2>/dev/null | tail -1)
        echo "$ours" >> "$out/$name.nabla"
        if [ "$peer" = 1 ]; then
            local extra=()
            [ "$w" = w3 ] && extra=(--w3-steps 60)
            theirs=$($py "$peers/torch_ref.py" "$w" "${extra[@]}" 2>/dev/null | grep '^JSON ' | sed 's/^JSON //')
            echo "$theirs" >> "$out/$name.peer"
        fi
    done
    $py - "$name" "$out" "$gflop" "$peer" <<'PY'
import json, statistics, sys
name, out, gflop, peer = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
ours = [json.loads(l) for l in open(f"{out}/{name}.nabla") if l.strip()]
def step_ms(o):  # the classifiers report median_step_ms; gpt reports tokens_per_s
    return o["median_step_ms"] if "median_step_ms" in o else 16 * 128 / o["tokens_per_s"] * 1e3
ms = statistics.median(step_ms(o) for o in ours)
line = f"{name}: nabla median step {ms:.2f} ms ({gflop / ms * 1e3:.0f} GFLOP/s)"
if peer:
    theirs = [json.loads(l) for l in open(f"{out}/{name}.peer") if l.strip()]
    pm = statistics.median(t["median_ms"] for t in theirs)
    ratios = [t["median_ms"] / step_ms(o) for o, t in zip(ours, theirs)]
    line += (f", PyTorch {pm:.2f} ms; speed ratio (median of {len(ratios)} paired runs) "
             f"{statistics.median(ratios):.2f}x (runs: {', '.join(f'{r:.2f}' for r in ratios)})")
print(line)
if all("peak_rss_mib" in o for o in ours):
    mem = f"{name}: peak RSS nabla {statistics.median(o['peak_rss_mib'] for o in ours):.0f} MiB"
    if peer and all("peak_rss_mib" in t for t in theirs):
        mem += f", PyTorch {statistics.median(t['peak_rss_mib'] for t in theirs):.0f} MiB"
    print(mem)
print(f"RESULT model {name} {ms:.3f} ms")
PY
}

echo "== training throughput, 2 threads (W1 = mlp, W2 = cnn)"
run_pair mlp w1 2.448 "$build/models/mlp" --epochs 1 --threads 2
run_pair cnn w2 3.199 "$build/models/cnn" --epochs 1 --threads 2
if [ -x "$build/models/gpt/gpt" ]; then
    echo "== W3 (gpt), 2 threads"
    run_pair gpt w3 42.68 "$build/models/gpt/gpt" --steps 60 --threads 2
    echo "== the raw GEMM rate on W3's linear-layer shapes (one step's 51 calls, 39.46 of its 42.68 GFLOP)"
    "$build/bench/bench_kernels" --only=w3 --threads 2 2>/dev/null | grep -E '^(median|RESULT w3)'
fi
echo "== raw GEMM rate on the same machine, same run"
"$build/bench/bench_kernels" --only=gemm --quick 2>/dev/null | grep -E '^RESULT (matmul|dnnl_sgemm|cblas_sgemm)' | head -12
