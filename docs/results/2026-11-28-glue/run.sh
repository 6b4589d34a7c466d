#!/usr/bin/env bash
# GPU tests of fold_constants / fuse_pointwise / EAGLE-3 token maps, then the A/B of the two passes in one
# process each (bench_drafters --skip-passes: the same tree, the passes left out of every step and of the
# target-only forwards). Logs to $OUT.
set -u
python -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
if [ -n "${AB_ONLY:-}" ]; then  # the A/B alone (the second call of 2026-11-28: the first one's A/B ran out of time)
    run() { timeout ${AB_S:-150} python benchmarks/bench_drafters.py --drafters mtp,eagle3 --token-map-sizes 16384 \
        --batch-sizes ${AB_BATCHES:-1,16} --json "$OUT/drafters_$1.json" "${@:2}" 2>&1 | grep -v "warm-up and capture" | tee "$OUT/drafters_$1.log"; }
    run without --skip-passes fold_constants,fuse_pointwise
    run with
    exit 0
fi
timeout 100 python -m pytest -q -p no:cacheprovider tests/kernels/test_fused_pointwise.py tests/lowering/test_fuse_pointwise.py \
    2>&1 | tail -3 | tee "$OUT/pytest_kernels.log"
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/e2e/test_eagle3.py tests/e2e/test_mtp.py tests/e2e/test_dflash.py \
    tests/e2e/test_ngram.py tests/e2e/test_generate.py tests/test_artifact.py -rs 2>&1 | tail -6 | tee "$OUT/pytest_gpu.log"
ARGS="--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes ${AB_BATCHES:-1,16}"
run() { timeout ${AB_S:-150} python benchmarks/bench_drafters.py $ARGS --json "$OUT/drafters_$1.json" "${@:2}" 2>&1 | grep -v "warm-up and capture" | tee "$OUT/drafters_$1.log"; }
run without --skip-passes fold_constants,fuse_pointwise
run with
