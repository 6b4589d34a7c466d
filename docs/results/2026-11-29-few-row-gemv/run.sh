#!/bin/bash
# The two-row GEMV (kernels/gemv.py's few_rows_kernel at shape class "two_rows": two rows, N <= 2K) on the H200:
#   PART=bench: PROBE=1 first runs docs/results/2026-11-29-few-row-gemv-probe/probe.py, then bench_drafters at B = 1
#               (decode, the 5-row verify, draft-model and EAGLE-3 16k steps) with the two-row rows ("on") and with
#               off.diff applied ("off": gemv.shape_class names no two-row class, cuBLAS above one row as before), in
#               ORDER (default "off on off").
#   PART=tests: the GEMVs' and the fused SwiGLU GEMV's GPU tests (1, 2 and 5 rows at real shapes) and captured
#               end-to-end steps at batch 1.
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-few-row-gemv/run.sh
set -u
here=docs/results/2026-11-29-few-row-gemv
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_mm.py \
    tests/kernels/test_scaled_silu_mul_linear.py \
    tests/e2e/test_eagle3.py tests/e2e/test_generate.py tests/e2e/test_invariant.py tests/runtime/test_graphs.py \
    tests/test_artifact.py -m gpu 2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
if [ "${PROBE:-0}" = 1 ]; then
  timeout 240 python docs/results/2026-11-29-few-row-gemv-probe/probe.py 2>&1 | tail -40 > "$OUT/probe.log"
  cat "$OUT/probe.log"
fi
args="--drafters draft_model,eagle3 --token-map-sizes 16384 --batch-sizes 1"
n=0
for version in ${ORDER:-off on off}; do
  n=$((n + 1))
  [ "$version" = off ] && git apply "$here/off.diff"
  timeout 150 python benchmarks/bench_drafters.py $args --json "$OUT/$n-$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$n-$version.log"
  [ "$version" = off ] && git apply -R "$here/off.diff"
  echo "== $n $version"; cat "$OUT/$n-$version.log"
done
