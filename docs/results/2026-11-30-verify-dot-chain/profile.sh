#!/usr/bin/env bash
# Prepared for the next device call (2026-11-30, not run): why the tensor-core kernel loses the five-row verify in the
# step (4.366 -> 4.475 ms) when the chain probe had it ahead. Kernel profiles of the draft-model step at B = 1 in
# plain stream order (GRAPHSPEC_PDL=0: each kernel's time its own), the verify's products on cuBLAS ("cublas") and on
# the kernel (five_rows.diff: gemv.DOT_MAX_ROWS 2 -> 8), then both with PDL (step times only). Compare the verify's
# per-product kernel times in profile_*.log.   OUT=... bash docs/results/2026-11-30-verify-dot-chain/profile.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/verify_dot_profile}"
HERE=docs/results/2026-11-30-verify-dot-chain
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
bench() {  # bench NAME [ENV...]: bench_drafters draft model at B = 1, with --profile 1 when GRAPHSPEC_PDL=0
    local name=$1
    shift
    env "$@" timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes 1 \
        $([[ " $* " == *" GRAPHSPEC_PDL=0 "* ]] && echo --profile 1) --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
    echo "$name: $(grep -E '^ +1 ' "$OUT/$name.log" | head -1 | tr -s ' ')"
}
bench profile_cublas GRAPHSPEC_PDL=0
git apply "$HERE/five_rows.diff"
bench profile_dot GRAPHSPEC_PDL=0
bench pdl_dot GRAPHSPEC_PDL=1
git apply -R "$HERE/five_rows.diff"
bench pdl_cublas GRAPHSPEC_PDL=1
git status --short
