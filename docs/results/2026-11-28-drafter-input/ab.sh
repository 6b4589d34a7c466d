#!/bin/bash
# The MTP / EAGLE-3 input in one launch and row gathers for the accepted rows (this session's change), on
# the GPU in one device call: its GPU tests, then the drafters' bench with the drafters before the change
# (before.diff applied: the kernel stays registered but no drafter calls it) and after, alternating.
#   OUT=... bash docs/results/2026-11-28-drafter-input/ab.sh
set -u
here=docs/results/2026-11-28-drafter-input
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 170 python -m pytest -q -m gpu tests/kernels/test_embed_norm_concat.py tests/e2e/test_mtp.py \
  tests/e2e/test_eagle3.py 2>&1 | tail -4 | tee "$OUT/pytest_gpu.log"
args="--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes ${AB_BATCHES:-1,16}"
run() {  # run NAME: one bench of the tree as it is now
  timeout 190 python benchmarks/bench_drafters.py $args --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/$1.log"
}
git apply "$here/before.diff" && run before
git apply -R "$here/before.diff" && run after
