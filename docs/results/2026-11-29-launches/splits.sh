#!/bin/bash
# Decode attention without split-K where the batch's (row, KV head) programs alone nearly fill the GPU (B = 16 at
# 8 KV heads): the step at a 512-token context and at 8000 of 8192, with CONFIGS[90] as it is (2 programs per SM:
# 2 splits at B = 16) and with splits.diff (1 per SM: no split, no reduce launch), in one device call.
#   OUT=... bash docs/results/2026-11-29-launches/splits.sh
set -u
here=docs/results/2026-11-29-launches
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
timeout 150 python -m pytest -q -m gpu tests/e2e/test_invariant.py tests/runtime/test_graphs.py 2>&1 | tail -4 \
  | tee "$OUT/pytest_gpu_e2e.log"
short="--drafters mtp,eagle3 --token-map-sizes 16384 --batch-sizes 4,16"
long="--drafters ngram --batch-sizes 16 --max-seq-len 8192 --context 8000"
run() {  # run NAME ARGS: one bench of the tree as it is now
  timeout 170 python benchmarks/bench_drafters.py $2 --json "$OUT/$1.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/$1.log"
}
run short_split "$short"
run long_split "$long"
git apply "$here/splits.diff" && run short_nosplit "$short" && run long_nosplit "$long"
git apply -R "$here/splits.diff"
