#!/usr/bin/env bash
# Device call (2026-11-29 23:27 UTC): the next kernels launched during the attention. bench_drafters (draft model, B = 1)
# back to back: "cur" = the tree; "A" = a.diff (the attention lets the next kernel launch as it starts, the reduce
# before its wait: the o GEMV's programs launch and ask for their first weight tile while the attention runs); "B" = A +
# b_gemv.diff (the one-row GEMV asks for two weight tiles before its wait).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/early_trigger}"
HERE=docs/results/2026-11-29-early-trigger
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
bench() {
    timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes 1 --json "$OUT/$1.json" \
        >"$OUT/$1.log" 2>&1
    echo "$1: $(grep -E '^ +1 ' "$OUT/$1.log" | head -2 | tr -s ' ' | tr '\n' ';')"
}
variant() {  # variant NAME DIFF...: bench with the diffs applied, then revert them
    local name=$1
    shift
    for d in "$@"; do git apply "$HERE/$d"; done
    bench "$name"
    for d in "$@"; do git apply -R "$HERE/$d"; done
}
for run in ${ORDER:-1_cur 2_A 3_B 4_cur}; do
    case $run in
        *_cur) bench "$run" ;;
        *_A) variant "$run" a.diff ;;
        *_B) variant "$run" a.diff b_gemv.diff ;;
    esac
done
git status --short
