#!/usr/bin/env bash
# bench_llama.sh [BUILD] [REPEATS] [THREADS] - the Llama's training step (bench_llama, the
# default config at batch 16 x 128) next to its PyTorch peer (llama_peer.py, the same
# architecture in plain PyTorch) in the same run, alternating the two so machine noise hits
# both alike. Prints each pair and the median ratio (peer step time / nabla step time: > 1
# means nabla is faster), in f32 and with bf16 autocast. PY names a Python with PyTorch 2.x
# (default: python3); STEPS and WARMUP the timed and untimed steps of each run (30, 5).
set -uo pipefail
build=${1:-build}
reps=${2:-5}
threads=${3:-2}
py=${PY:-python3}
steps=(--steps "${STEPS:-30}" --warmup "${WARMUP:-5}")
here=$(cd "$(dirname "$0")" && pwd)
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "bench_llama: PyTorch is not importable by $py (set PY): no peer"
    exit 1
fi
for mode in f32 bf16; do
    flag=()
    [ "$mode" = bf16 ] && flag=(--bf16)
    ratios=()
    for r in $(seq "$reps"); do
        ours=$("$build/bench/bench_llama" --threads "$threads" "${steps[@]}" "${flag[@]}" | tail -1)
        theirs=$("$py" "$here/llama_peer.py" --threads "$threads" "${steps[@]}" "${flag[@]}" |
                 tail -1)
        o=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["median_step_ms"])' "$ours")
        t=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["median_ms"])' "$theirs")
        ratio=$("$py" -c "print(f'{$t / $o:.2f}')")
        echo "$mode run $r: nabla $o ms, PyTorch $t ms, ratio $ratio"
        ratios+=("$ratio")
    done
    "$py" -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; print(f'$mode: median ratio {statistics.median(r):.2f}x over {len(r)} paired runs')" "${ratios[@]}"
done
