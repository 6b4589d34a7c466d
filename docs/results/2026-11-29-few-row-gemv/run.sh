#!/bin/bash
# The few-row GEMV (branch few-row-gemv: kernels/gemv.py's few_rows_kernel for 2 to 8 rows) on the H200:
#   PART=bench: PROBE=1 (default) first runs docs/results/2026-11-29-few-row-gemv-probe/probe.py (pick FEW_ROWS_CONFIGS
#               from it), then bench_drafters at B = 1 (decode, the 5-row verify, draft-model and EAGLE-3 16k steps) with
#               the few-row rows ("on") and with off.diff applied ("off": no few_rows rows, cuBLAS above one row as on
#               main), in ORDER (default "off on off").
#   PART=tests: the GEMV's GPU tests (1, 2 and 5 rows at real shapes) and captured end-to-end steps at batch 1.
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-few-row-gemv/run.sh
set -u
here=docs/results/2026-11-29-few-row-gemv
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_mm.py \
    tests/e2e/test_eagle3.py tests/e2e/test_generate.py tests/e2e/test_invariant.py tests/runtime/test_graphs.py \
    tests/test_artifact.py -m gpu 2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
if [ "${PROBE:-1}" = 1 ]; then
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
