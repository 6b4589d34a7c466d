#!/usr/bin/env bash
# d710d40's kernels/attention.py against today's: the kernel probe at the step's shapes, then bench_drafters
# (MTP and DFlash block 16, plain and with a 16k token map, B = 1 and 16, next to target decode and verify)
# with each file in turn, in one device call. Run from the repository root; logs to $OUT.
set -u
cp kernels/attention.py /tmp/attention_new.py
timeout 100 python docs/results/2026-11-27-attention-splits/probe.py --variants "" 2>&1 | tee "$OUT/probe3.log"
ARGS="--drafters mtp,dflash --dflash-blocks 16 --token-map-sizes 16384 --batch-sizes 1,16"
for version in old new; do
    if [ "$version" = old ]; then git show d710d40:kernels/attention.py >kernels/attention.py; else cp /tmp/attention_new.py kernels/attention.py; fi
    timeout 230 python benchmarks/bench_drafters.py $ARGS --json "$OUT/drafters_$version.json" 2>&1 | grep -v "warm-up and capture" | tee "$OUT/drafters_$version.log"
done
cp /tmp/attention_new.py kernels/attention.py
