#!/bin/bash
# The fused one-row gate/up GEMV + scaled SwiGLU (branch gemv-swiglu, kernels/scaled_silu_mul_linear.py) on the H200:
#   PART=bench: bench_drafters at B = 1 (decode, verify, draft-model and EAGLE-3 16k steps) with the fused op ("on") and
#               with decoder.diff reversed ("off": the decoder emits the GEMV + scaled_silu_mul as on main), in ORDER
#               (default "off on off"); PROBE=1 first runs docs/results/2026-11-29-gemv-swiglu-probe/probe.py (the
#               kernel alone against the two it replaces).
#   PART=tests: the kernel's GPU tests and the captured end-to-end steps at batch 1.
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-gemv-swiglu/run.sh
set -u
here=docs/results/2026-11-29-gemv-swiglu
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_silu_mul_linear.py tests/kernels/test_gemv.py \
    tests/e2e/test_eagle3.py tests/e2e/test_generate.py tests/runtime/test_graphs.py tests/test_artifact.py -m gpu 2>&1 \
    | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
if [ "${PROBE:-1}" = 1 ]; then
  timeout 120 python docs/results/2026-11-29-gemv-swiglu-probe/probe.py 2>&1 | tail -4 > "$OUT/probe.log"
  cat "$OUT/probe.log"
fi
args="--drafters draft_model,eagle3 --token-map-sizes 16384 --batch-sizes 1"
n=0
for version in ${ORDER:-off on off}; do
  n=$((n + 1))
  [ "$version" = off ] && git apply -R "$here/decoder.diff"
  timeout 150 python benchmarks/bench_drafters.py $args --json "$OUT/$n-$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$n-$version.log"
  [ "$version" = off ] && git apply "$here/decoder.diff"
  echo "== $n $version"; cat "$OUT/$n-$version.log"
done
