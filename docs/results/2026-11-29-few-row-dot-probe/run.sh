#!/usr/bin/env bash
# Device call (2026-11-29 22:58 UTC): the tensor-core few-row probe, then a kernel profile of the draft-model step
# in plain stream order (GRAPHSPEC_PDL=0: under PDL a kernel's profiled time includes its wait for the one before).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/few_row_dot}"
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log -1 --format=%H >>"$OUT/gpu.txt" 2>/dev/null
timeout 330 python3 docs/results/2026-11-29-few-row-dot-probe/probe.py ${PROBE_ARGS:-} 2>&1 | tee "$OUT/probe.log"
GRAPHSPEC_PDL=0 timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes 1 --profile 1 \
    --json "$OUT/profile.json" >"$OUT/profile.log" 2>&1
tail -60 "$OUT/profile.log"
