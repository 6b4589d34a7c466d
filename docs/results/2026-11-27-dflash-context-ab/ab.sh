#!/usr/bin/env bash
# A/B of ca55bbc's DFlash step change (change.diff: the context rows projected in the block's GEMM, the
# context k norm folded into rotary_kv_write) in one device call: the DFlash bench with the change, without it
# (change.diff reverted in the working tree), and with it again. AB_TESTS: GPU tests to run first.
#   OUT=... AB_TESTS="tests/kernels/test_rotary_kv_write.py" bash docs/results/2026-11-27-dflash-context-ab/ab.sh
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
OUT=${OUT:-/tmp/dflash_ab}
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >"$OUT/install.log" 2>&1
# shellcheck disable=SC2086  # word lists on purpose
if [ -n "${AB_TESTS:-}" ]; then
    timeout 170 python3 -m pytest -m gpu $AB_TESTS -q -p no:cacheprovider -rs >"$OUT/pytest_gpu.log" 2>&1
    echo "gpu tests: exit $? ($(tail -1 "$OUT/pytest_gpu.log"))" | tee -a "$OUT/summary.txt"
fi
run() {
    # shellcheck disable=SC2086
    timeout "${AB_RUN_S:-200}" python3 benchmarks/bench_drafters.py --drafters dflash --dflash-blocks 8 --batch-sizes 1 \
        --token-map-sizes 16384 ${AB_ARGS:-} --json "$OUT/$1.json" >"$OUT/$1.log" 2>&1
    echo "$1: exit $?" | tee -a "$OUT/summary.txt"
    grep -A2 "median ms" "$OUT/$1.log" | tee -a "$OUT/summary.txt" || true
}
run after_1
if git apply -R "$HERE/change.diff"; then
    run before
    git apply "$HERE/change.diff" || echo "change.diff did not apply again: after_2 is not the change" | tee -a "$OUT/summary.txt"
fi
run after_2
git diff --stat -- graphspec kernels | tail -1 | tee -a "$OUT/summary.txt"  # empty: the tree is as it came
