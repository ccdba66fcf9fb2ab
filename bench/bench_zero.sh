#!/usr/bin/env bash
# bench_zero.sh [BUILD] [ROUNDS] - ZeRO against DDP on a GPT of ~85M parameters (12 layers,
# width 768, byte vocabulary), per rank: model-state bytes, peak allocator bytes and peak
# RSS during training on 2 and 4 ranks, and step time on 2 ranks. Each configuration is one
# `mpirun ... bench_zero --stage S` (bench_zero.c); the stages are alternated within each of
# ROUNDS rounds (default 3) and each figure is the median over the rounds, so a busy
# machine slows every configuration alike. Ratios are to DDP (stage 0) measured in the same
# rounds. Extra arguments for bench_zero go in BENCH_ZERO_ARGS (e.g. "--layers 2 --width
# 128" for a quick look).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
bin=$build/bench/bench_zero
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
one() { mpirun --oversubscribe -np "$1" "$bin" --stage "$2" ${BENCH_ZERO_ARGS:-} | grep '^RESULT' >> "$out"; }
for r in $(seq "$rounds"); do
    for s in 0 1 2 3; do one 2 "$s"; done
done
for s in 0 1 2 3; do one 4 "$s"; done # memory only: deterministic, one round
python3 - "$out" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(f.split("=") for f in line.split()[2:])
    rows.setdefault((int(kv["ranks"]), int(kv["stage"])), []).append(kv)
def med(rs, k): return statistics.median(float(r[k]) for r in rs)
P = int(next(iter(rows.values()))[0]["params"])
print(f"GPT, {P / 1e6:.1f}M parameters, AdamW f32; per rank, max over the ranks; "
      f"medians of {len(rows.get((2, 0), []))} alternated runs on 2 ranks")
print(f"{'ranks':>5} {'stage':>5} {'state MiB':>10} {'x DDP':>6} {'comm MiB':>9} "
      f"{'alloc peak':>10} {'x DDP':>6} {'RSS peak':>9} {'x DDP':>6} {'step s':>7} {'x DDP':>6}")
for n in sorted({k[0] for k in rows}):
    base = rows.get((n, 0))
    for s in range(4):
        rs = rows.get((n, s))
        if not rs: continue
        mib = lambda k: med(rs, k) / 2**20
        ratio = lambda k: med(rs, k) / med(base, k) if base else float("nan")
        step = f"{med(rs, 'step'):7.3f} {ratio('step'):6.2f}" if n == 2 else f"{'-':>7} {'-':>6}"
        print(f"{n:>5} {s:>5} {mib('state'):10.1f} {ratio('state'):6.3f} {mib('comm'):9.1f} "
              f"{mib('alloc'):10.1f} {ratio('alloc'):6.3f} {mib('rss'):9.1f} {ratio('rss'):6.3f} "
              f"{step}")
EOF
