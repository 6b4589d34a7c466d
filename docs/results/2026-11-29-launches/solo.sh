#!/bin/bash
# Ran at 0b663e8 (solo rows were reverted after). Solo rows (kernels/attention.py solo_keys: where the batch's tiles fill the GPU, a row of up to 1024 keys is its
# first split's alone, no reduce) on the GPU in one device call: the attention GPU tests, then bench_drafters at
# B = 16 (512 of 1024 keys, and 8000 of 8192) with solo_off.diff applied (solo_keys 0: 2 splits, as before) and
# without it, and issue 13's table (B = 1, 4, 16, 64; bucket 64 at K = 1) on the final code.
#   OUT=... bash docs/results/2026-11-29-launches/solo.sh
set -u
here=docs/results/2026-11-29-launches
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
timeout 130 python -m pytest -q -m gpu tests/kernels/test_attention.py tests/kernels/test_rotary_kv_attention.py \
  tests/kernels/test_block_attention.py tests/kernels/test_invariance.py tests/e2e/test_eagle3.py 2>&1 | tail -4 \
  | tee "$OUT/pytest_gpu.log"
short="--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes 16"
long="--drafters ngram --batch-sizes 16 --max-seq-len 8192 --context 8000"
run() {  # run NAME ARGS: one bench of the tree as it is now
  timeout 170 python benchmarks/bench_drafters.py $2 --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/$1.log"
}
git apply "$here/solo_off.diff" && run short_off "$short" && run long_off "$long"
git apply -R "$here/solo_off.diff" && run long_on "$long"
run table "--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes 1,4,16,64 --k-by-bucket 64:1"
