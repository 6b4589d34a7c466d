#!/bin/bash
# The input norm folded into q/k/v (fuse_row_scale, rotary_kv_attention's row scale) on the H200, one device call:
#   PART=bench: bench_drafters in one call: the code with both norms folded ("both"), with input_fold.diff
#               reversed (the post-attention norm alone folded, as at 3fde9a9: "post"), and unfolded ("off"); ORDER
#               (default "post both off"). K = 4, 512 of 1024 keys, B = 1 and 16, the draft-model step and EAGLE-3
#               with a 16k map. KERNEL_TESTS=1 first runs the rotary_kv_attention GPU tests (the row scale's too).
#               first/: the first call, at f3919d2 (the input norm folded at every token count of <= 80 rows).
#   PART=tests: the GPU tests the fold touches (kernels, captured end-to-end steps, which fold on CUDA by default).
#   OUT=... PART=bench|tests COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-fold-input-norm/run.sh
set -u
here=docs/results/2026-11-29-fold-input-norm
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
if [ "$PART" = tests ]; then
  timeout 540 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_rotary_kv_attention.py \
    tests/kernels/test_scaled_silu_mul.py tests/e2e/test_eagle3.py tests/e2e/test_mtp.py tests/e2e/test_k_by_bucket.py \
    tests/e2e/test_dflash.py tests/runtime/test_graphs.py tests/test_artifact.py 2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
  exit 0
fi
if [ "${KERNEL_TESTS:-0}" = 1 ]; then
  timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_rotary_kv_attention.py 2>&1 \
    | tail -4 > "$OUT/pytest_kernels.log"
  cat "$OUT/pytest_kernels.log"
fi
args="--drafters draft_model,eagle3 --token-map-sizes 16384 --batch-sizes 1,16"
for version in ${ORDER:-post both off}; do
  fold=on
  [ "$version" = off ] && fold=off
  [ "$version" = post ] && git apply -R "$here/input_fold.diff"
  timeout 180 python benchmarks/bench_drafters.py $args --fold-norms $fold --json "$OUT/$version.json" 2>&1 \
    | grep -v "warm-up" | tail -8 > "$OUT/$version.log"
  [ "$version" = post ] && git apply "$here/input_fold.diff"
done
for version in ${ORDER:-post both off}; do echo "== $version"; cat "$OUT/$version.log"; done
