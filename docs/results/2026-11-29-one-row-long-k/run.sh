#!/bin/bash
# The one-row GEMV's long-K rows (branch one-row-long-k: K >= 4N takes 4 x 1024 tiles; at the benchmark pairs only
# the 1B draft's down projection, an in-place residual add) on the H200:
#   PART=bench: bench_drafters at B = 1 (decode, verify, draft-model step) with the long-K rows ("on") and with
#               off.diff applied ("off": every one-row product on the one-row tiles, as on main), in ORDER (default
#               "off on off"). Only the draft-model step should move (16 layers x 3 one-row forwards).
#   PART=tests: the GEMV's GPU tests (real shapes incl. the 1B down) and the captured end-to-end steps at batch 1.
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-one-row-long-k/run.sh
set -u
here=docs/results/2026-11-29-one-row-long-k
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/e2e/test_generate.py \
    tests/runtime/test_graphs.py tests/test_artifact.py -m gpu 2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
args="--drafters draft_model --batch-sizes 1"
n=0
for version in ${ORDER:-off on off}; do
  n=$((n + 1))
  [ "$version" = off ] && git apply "$here/off.diff"
  timeout 150 python benchmarks/bench_drafters.py $args --json "$OUT/$n-$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$n-$version.log"
  [ "$version" = off ] && git apply -R "$here/off.diff"
  echo "== $n $version"; cat "$OUT/$n-$version.log"
done
