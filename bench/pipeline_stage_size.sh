#!/usr/bin/env bash
# pipeline_stage_size.sh [BUILD] [ROUNDS] - how large a pipeline stage must be for the measured
# bubble to approach the ideal one (docs/distributed.md, "Cost"). The gpt program on 2 ranks
# (--pp 2, 1F1B, 8 micro-batches, 1 thread a rank) for GPTs of 4 layers from width 8 and
# context 8 (stages of a fraction of a millisecond) to width 256 and context 128; each is also run in
# one process with the same 8 micro-batches, whose step time / 8 / 2 is one stage's compute for
# one micro-batch (forward and backward). The sizes are alternated within each of ROUNDS rounds
# (default 3); each figure is the median over the rounds. The per-micro-batch overhead is the
# smallest model's (width 8: almost no work) pipeline step time / (m + p - 1), less its
# compute: the cost of a micro-batch slot itself (the sends, receives, waits and the
# schedule). The excess of the bubble over the ideal follows (1 - ideal) o / (c + o) for a
# stage's compute c and overhead o per micro-batch (docs/distributed.md, "Cost").
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
gpt=$build/models/gpt/gpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp)
text=$(mktemp)
trap 'rm -f "$out" "$text"' EXIT
bible gen1:1-rev22:21 > "$text" 2>/dev/null ||
    python3 -c "import sys; sys.stdout.write('In the beginning was the word. ' * 40000)" > "$text"
# width context batch: 8 micro-batches of batch/8 sequences
sizes=("8 8 8" "16 16 8" "64 32 8" "64 64 16" "128 64 16" "128 128 16" "256 128 32")
one() { # ranks width context batch
    local np=$1 C=$2 T=$3 B=$4 pp=()
    [ "$np" -gt 1 ] && pp=(--pp "$np")
    mpirun --oversubscribe -np "$np" "$gpt" "${pp[@]}" --microbatches 8 --batch "$B" \
        --n-layer 4 --n-head 4 --n-embd "$C" --block-size "$T" --steps 30 --eval-every 0 \
        --eval-batches 1 --threads 1 --schedule constant --data "$text" |
        tail -1 | sed "s/^/$np $C $T $B /" >> "$out"
}
for _ in $(seq "$rounds"); do
    for s in "${sizes[@]}"; do
        # shellcheck disable=SC2086
        one 1 $s
        # shellcheck disable=SC2086
        one 2 $s
    done
done
python3 - "$out" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    np_, C, T, B, js = line.split(" ", 4)
    runs.setdefault((int(C), int(T), int(B)), {}).setdefault(int(np_), []).append(json.loads(js))
med = lambda rs, k: statistics.median(r[k] for r in rs)
rows = []
for (C, T, B), r in sorted(runs.items(), key=lambda kv: kv[0][0] * kv[0][0] * kv[0][1] * kv[0][2]):
    c = med(r[1], "step_ms_median") / 8 / 2
    rows.append((C, T, B, c, med(r[2], "step_ms_median"), med(r[2], "bubble"), r[2][0]["bubble_ideal"]))
over = rows[0][4] / (8 + 2 - 1) - rows[0][3]
print(f"{'width':>5} {'context':>7} {'batch':>5} {'stage ms/micro':>14} {'pp step ms':>10} "
      f"{'bubble':>7} {'ideal':>6} {'excess':>7} {'(1-ideal)o/(c+o)':>16}")
for C, T, B, c, step, bub, ideal in rows:
    print(f"{C:5d} {T:7d} {B:5d} {c:14.3f} {step:10.2f} {bub:7.3f} {ideal:6.3f} {bub - ideal:7.3f} "
          f"{(1 - ideal) * over / (c + over):16.3f}")
print(f"per-micro-batch overhead o (the smallest model: pp step / (m + p - 1) - stage ms/micro): "
      f"{over:.3f} ms; medians of {len(next(iter(runs.values()))[2])} rounds")
EOF
