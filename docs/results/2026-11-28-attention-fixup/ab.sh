#!/bin/bash
# A/B of the last-split combination (fixup.diff: min_split_keys, FIXUP) in one device call, on the tree at
# 0f9a0f9: GPU attention tests and the drafters' bench with the change applied, then without it.
#   OUT=... AB_DRAFTERS=eagle3 AB_BATCHES=1,16 bash docs/results/2026-11-28-attention-fixup/ab.sh
set -u
here=docs/results/2026-11-28-attention-fixup
python -m pip install --no-deps --no-build-isolation -q -e . > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
cp kernels/attention.py /tmp/attention_before.py
cp tests/kernels/test_attention.py /tmp/test_attention_before.py
git apply "$here/fixup.diff"
timeout 150 python -m pytest -q -m gpu tests/kernels/test_attention.py tests/kernels/test_rotary_kv_attention.py \
  tests/kernels/test_block_attention.py 2>&1 | tail -4 | tee "$OUT/pytest_attention.log"
args="--drafters ${AB_DRAFTERS:-eagle3,mtp} --token-map-sizes 16384 --batch-sizes ${AB_BATCHES:-16}"
timeout 200 python benchmarks/bench_drafters.py $args --json "$OUT/new.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/new.log"
cp /tmp/attention_before.py kernels/attention.py
cp /tmp/test_attention_before.py tests/kernels/test_attention.py
timeout 200 python benchmarks/bench_drafters.py $args --json "$OUT/old.json" 2>&1 | grep -v "warm-up" | tail -4 | tee "$OUT/old.log"
