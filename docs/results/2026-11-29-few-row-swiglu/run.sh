#!/usr/bin/env bash
# Device call (2026-11-29 23:10 UTC): the few-row fused gate/up + scaled SwiGLU kernel in isolation (probe.py), the
# draft-model step with it (on) and without it (off: off.diff, the decoder fuses one-row MLPs only) back to back,
# then its GPU tests. PART=probe|ab|tests|all. Ran at 5f56160; the kernel was reverted: `git apply kernel.diff` first.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/few_row_swiglu}"
PART="${PART:-all}"
HERE=docs/results/2026-11-29-few-row-swiglu
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
if [[ $PART == probe || $PART == all ]]; then
    timeout 150 python3 "$HERE/probe.py" 2>&1 | tee "$OUT/probe.log"
fi
bench() {  # bench NAME: the draft-model step at batch 1, one log and JSON
    timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes ${BATCHES:-1} \
        --json "$OUT/$1.json" >"$OUT/$1.log" 2>&1
    echo "$1: $(grep -E '^ +[0-9]+ ' "$OUT/$1.log" | head -4 | tr -s ' ' | tr '\n' ';')"
}
if [[ $PART == ab || $PART == all ]]; then
    git apply "$HERE/off.diff" && bench ab_1_off; git apply -R "$HERE/off.diff"
    bench ab_2_on
    git apply "$HERE/off.diff" && bench ab_3_off; git apply -R "$HERE/off.diff"
fi
if [[ $PART == tests || $PART == all ]]; then
    timeout 240 python3 -m pytest -q -m gpu tests/kernels/test_scaled_silu_mul_linear.py tests/e2e/test_pdl.py \
        tests/e2e/test_k_by_bucket.py 2>&1 | tail -15 | tee "$OUT/pytest_gpu.log"
fi
