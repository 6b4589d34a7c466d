#!/bin/bash
# fold_norms (models/fold_norms.py) on the H200, one device call per PART:
#   PART=tests: the GPU tests the fold touches (the scaled_silu_mul kernel at 8B/1B shapes, its row invariance, and
#               the captured end-to-end steps, which fold on CUDA by default);
#   PART=bench: bench_drafters with the norms folded and not, side by side in one call (target-only decode and
#               verify, the draft-model step and EAGLE-3 with a 16k map, B = 1 and 16, K = 4, 512 of 1024 keys),
#               ORDER="off on" (default) or "on off"; KERNEL_TESTS=1 first runs the scaled_silu_mul GPU tests;
#   PART=prefill: bench_prefill's time to first token folded and not (512 and 4096 tokens at B = 1, 2048 x 8).
#   OUT=... PART=tests|bench COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-fold-norms/run.sh
set -u
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
if [ "$PART" = prefill ]; then  # time to first token folded and not (graphspec's prefill only, no cold start)
  for fold in ${ORDER:-off on}; do
    timeout 280 python benchmarks/bench_prefill.py --shapes 512x1,4096x1,2048x8 --buckets 1,8 --modes greedy \
      --no-cold-start --no-target-only --reps 5 --fold-norms $fold --json "$OUT/prefill_$fold.json" 2>&1 \
      | tail -7 > "$OUT/prefill_$fold.log"
  done
  for fold in ${ORDER:-off on}; do echo "== fold $fold"; cat "$OUT/prefill_$fold.log"; done
elif [ "$PART" = tests ]; then
  timeout 500 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_scaled_silu_mul.py \
    tests/kernels/test_silu_mul.py tests/kernels/test_invariance.py tests/e2e/test_eagle3.py tests/e2e/test_mtp.py \
    tests/e2e/test_k_by_bucket.py tests/e2e/test_dflash.py tests/runtime/test_graphs.py tests/test_artifact.py \
    2>&1 | tail -15 > "$OUT/pytest_gpu.log"
  cat "$OUT/pytest_gpu.log"
else
  if [ "${KERNEL_TESTS:-0}" = 1 ]; then
    timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_scaled_silu_mul.py \
      tests/kernels/test_invariance.py -k "scaled" 2>&1 | tail -3 > "$OUT/pytest_kernels.log"
    cat "$OUT/pytest_kernels.log"
  fi
  args="--drafters draft_model,eagle3 --token-map-sizes 16384 --batch-sizes 1,16"
  for fold in ${ORDER:-off on}; do
    timeout 270 python benchmarks/bench_drafters.py $args --fold-norms $fold --json "$OUT/$fold.json" 2>&1 \
      | grep -v "warm-up" | tail -8 > "$OUT/$fold.log"
  done
  for fold in ${ORDER:-off on}; do echo "== fold $fold"; cat "$OUT/$fold.log"; done
fi
