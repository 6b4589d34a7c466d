#!/usr/bin/env bash
# 6edeece's graphspec/ and kernels/ (EAGLE-3 token maps, before fold_constants and fuse_pointwise) against
# this tree's, with this tree's benchmarks/ both times, in one device call; first the new kernels' tests on
# CUDA. Logs to $OUT.
set -u
python -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_fused_pointwise.py tests/lowering/test_fuse_pointwise.py \
    tests/passes/test_fold_constants.py 2>&1 | tail -5 | tee "$OUT/pytest_kernels.log"
ARGS="--drafters mtp,eagle3,dflash --dflash-blocks 16 --token-map-sizes 16384 --batch-sizes 1,16"
run() { timeout 230 python benchmarks/bench_drafters.py $ARGS --json "$OUT/drafters_$1.json" 2>&1 | grep -v "warm-up and capture" | tee "$OUT/drafters_$1.log"; }
run new
git checkout -q 6edeece -- graphspec kernels
run old
