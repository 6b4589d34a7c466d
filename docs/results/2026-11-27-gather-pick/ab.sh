#!/usr/bin/env bash
# 3c417b5's graphspec/ and kernels/ against this tree's (row-gather kernels for embedding and index_select,
# greedy drafts over a reduced vocabulary without the [B, V] scatter), with this tree's benchmarks/ both
# times (the target-only baseline picks with graphspec's argmax kernel), in one device call. Logs to $OUT.
set -u
python -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
ARGS="--drafters mtp,eagle3,dflash --dflash-blocks 16 --token-map-sizes 16384 --batch-sizes 1,16"
run() { timeout 280 python benchmarks/bench_drafters.py $ARGS --json "$OUT/drafters_$1.json" 2>&1 | grep -v "warm-up and capture" | tee "$OUT/drafters_$1.log"; }
run new
git checkout -q 3c417b5 -- graphspec kernels && rm -f kernels/embedding.py kernels/index_select.py
run old
