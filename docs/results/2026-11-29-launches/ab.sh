#!/bin/bash
# This session's launch cuts (argmax looks the drafts' target ids up itself; one rope-tables launch per forward)
# on the GPU in one device call: their GPU tests, then bench_drafters with before.diff applied (the call sites
# as at fb2e35c; the new op and argument registered but unused) and without it.
#   OUT=... bash docs/results/2026-11-29-launches/ab.sh
set -u
here=docs/results/2026-11-29-launches
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
timeout 200 python -m pytest -q -m gpu tests/kernels/test_argmax.py tests/kernels/test_rope_tables.py \
  tests/kernels/test_invariance.py tests/e2e/test_mtp.py tests/e2e/test_eagle3.py 2>&1 | tail -4 | tee "$OUT/pytest_gpu.log"
args="--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes ${AB_BATCHES:-1,16}"
run() {  # run NAME: one bench of the tree as it is now
  timeout 200 python benchmarks/bench_drafters.py $args --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/$1.log"
}
git apply "$here/before.diff" && run before
git apply -R "$here/before.diff" && run after
