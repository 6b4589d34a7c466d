#!/bin/bash
# wave_block_n (kernels/attention.py, sm 90: 128) on the H200 in one device call: the attention GPU tests, then
# bench_drafters at B = 16 before (before.diff: wave_block_n 0, the config as it was) and after, at 512 of 1024
# keys (EAGLE-3, with and without a 16k map) and at 8000 of 8192 (n-gram).
#   OUT=... COMMIT=$(git rev-parse --short HEAD) bash docs/results/2026-11-29-attention-wave/ab.sh
set -u
here=docs/results/2026-11-29-attention-wave
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
echo "${COMMIT:-unknown}" > "$OUT/commit.txt"
timeout 110 python -m pytest -q -m gpu tests/kernels/test_attention.py tests/kernels/test_rotary_kv_attention.py \
  tests/kernels/test_block_attention.py 2>&1 | tail -3 > "$OUT/pytest_gpu.log"
short="--drafters eagle3 --token-map-sizes 16384 --batch-sizes 16"
long="--drafters ngram --batch-sizes 16 --max-seq-len 8192 --context 8000"
run() {  # run NAME LIMIT ARGS: one bench of the tree as it is now
  timeout "$2" python benchmarks/bench_drafters.py $3 --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -4 > "$OUT/$1.log"
}
git apply "$here/before.diff" && run short_before 120 "$short" && run long_before 70 "$long"
git apply -R "$here/before.diff" && run short_after 120 "$short" && run long_after 70 "$long"
cat "$OUT"/*.log
