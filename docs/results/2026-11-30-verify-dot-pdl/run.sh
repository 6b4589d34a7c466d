#!/usr/bin/env bash
# Why the tensor-core kernel loses the five-row verify only with PDL (2026-11-30 profile: PDL off, cuBLAS 4.374 ->
# dot 4.341 ms; PDL on, 4.346 -> 4.472). The draft-model step at B = 1 with the verify on cuBLAS (the code as it is)
# and on the dot kernel (five_rows.diff) launched three ways: with PDL as now, plainly (five_rows_plain.diff), and
# with PDL but no early trigger (five_rows_no_trigger.diff).   OUT=... bash docs/results/2026-11-30-verify-dot-pdl/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/verify_dot_pdl}"
HERE=docs/results/2026-11-30-verify-dot-pdl
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
bench() {  # bench NAME [DIFF]
    local name=$1 diff=${2:-}
    [[ -n $diff ]] && git apply "$HERE/$diff"
    timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes 1 --json "$OUT/$name.json" \
        >"$OUT/$name.log" 2>&1
    [[ -n $diff ]] && git apply -R "$HERE/$diff"
    echo "$name: $(grep -E '^ +1 ' "$OUT/$name.log" | head -1 | tr -s ' ')"
}
bench cublas_1
bench dot_pdl five_rows.diff
bench dot_plain five_rows_plain.diff
bench dot_no_trigger five_rows_no_trigger.diff
bench cublas_2
git status --short
