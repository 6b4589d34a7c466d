#!/usr/bin/env bash
# The batch-1 attention with the last split combining, against split + reduce (probe.py's doc). ~2 min on an H200.
#   OUT=... bash docs/results/2026-11-30-attention-fixup-probe/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/attention_fixup_probe}"
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
python3 -c 'import json; from benchmarks import common; print(json.dumps(common.source_info()))' | tee "$OUT/source.json"
timeout 330 python3 docs/results/2026-11-30-attention-fixup-probe/probe.py 2>&1 | tee "$OUT/probe.log"
