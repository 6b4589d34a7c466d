#!/usr/bin/env bash
# Run 2026-11-30 (results in README.md): the down projection with the scaled SwiGLU as its prologue against the three-launch MLP
# (probe.py's doc). ~1-2 minutes on an H200.   OUT=... bash docs/results/2026-11-30-down-swiglu-probe/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/down_swiglu_probe}"
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
timeout 400 python3 docs/results/2026-11-30-down-swiglu-probe/probe.py 2>&1 | tee "$OUT/probe.log"
