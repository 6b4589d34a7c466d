#!/bin/bash
# Batch 2 with and without the two-row GEMV (kernels/gemv.py "two_rows": two rows, N <= 2K), and the GPU tests of the
# GEMV kernels after their loads moved into shared helpers, on the H200:
#   PART=bench: bench_drafters at B = 2 (the target's 2-row decode; the draft model's step, whose draft forwards are
#               2-row) as the tree is ("on") and with $DIFF applied ("off"), in ORDER (default "off on off"). The 2-row
#               decode was never measured when the two-row GEMV landed. DIFF=off.diff (call 1, at 8ef09ab): no
#               two-row class, two rows on cuBLAS; DIFF=uncapped.diff (call 2, after TWO_ROWS_MAX_N = 3072 came of
#               call 1): the two-row class at every narrow width, as at 8ef09ab.
#   PART=tests: the GEMVs', mm's and the fused SwiGLU GEMV's GPU tests, captured end-to-end steps at batch 1.
#   OUT=... PART=bench|tests DIFF=uncapped.diff COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-two-rows-b2/run.sh
set -u
DIFF=${DIFF:-uncapped.diff}
here=docs/results/2026-11-29-two-rows-b2
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_mm.py \
    tests/kernels/test_scaled_silu_mul_linear.py tests/e2e/test_generate.py tests/runtime/test_graphs.py -m gpu 2>&1 \
    | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
args="--drafters draft_model --batch-sizes 2"
n=0
for version in ${ORDER:-off on off}; do
  n=$((n + 1))
  [ "$version" = off ] && git apply "$here/$DIFF"
  timeout 150 python benchmarks/bench_drafters.py $args --json "$OUT/$n-$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$n-$version.log"
  [ "$version" = off ] && git apply -R "$here/$DIFF"
  echo "== $n $version"; cat "$OUT/$n-$version.log"
done
