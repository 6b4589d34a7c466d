#!/bin/bash
# The one-row GEMV (kernels/gemv.py) on the H200, one device call each:
#   PART=bench: bench_linear at M = 1 and 5 (the llama pair's projections, lm_head too: cuBLAS vs the GEMV), then
#               bench_drafters at B = 1 (decode, verify, draft-model and EAGLE-3 16k steps) with the GEMV ("on") and
#               with gemv_registry.diff reversed ("off": the registry and lower_kernels before the GEMV, cuBLAS at
#               one row), in ORDER (default "off on off on"); LINEAR=0 skips bench_linear. first/: the first call (at
#               0793f9b; its "off" runs failed: the diff then lacked lower_kernels.py).
#   PART=tests: the GPU tests the GEMV touches (kernels, captured end-to-end steps at batch 1, artifacts).
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-gemv/run.sh
set -u
here=docs/results/2026-11-29-gemv
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
if [ "$PART" = tests ]; then
  timeout 420 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_mm.py \
    tests/e2e/test_eagle3.py tests/e2e/test_mtp.py tests/e2e/test_k_by_bucket.py tests/e2e/test_dflash.py \
    tests/runtime/test_graphs.py tests/test_artifact.py tests/e2e/test_generate.py tests/e2e/test_invariant.py -m gpu 2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  timeout 120 python -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py 2>&1 | tail -4 >> "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
if [ "${LINEAR:-1}" = 1 ]; then
  timeout 150 python benchmarks/bench_linear.py --pairs llama --rows 1,5 --json "$OUT/linear.json" 2>&1 \
    | tail -24 > "$OUT/linear.log"
  cat "$OUT/linear.log"
fi
args="--drafters draft_model,eagle3 --token-map-sizes 16384 --batch-sizes 1"
n=0
for version in ${ORDER:-off on off on}; do
  n=$((n + 1))
  [ "$version" = off ] && git apply -R "$here/gemv_registry.diff"
  timeout 150 python benchmarks/bench_drafters.py $args --json "$OUT/$n-$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$n-$version.log"
  [ "$version" = off ] && git apply "$here/gemv_registry.diff"
  echo "== $n $version"; cat "$OUT/$n-$version.log"
done
