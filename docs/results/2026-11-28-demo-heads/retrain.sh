#!/usr/bin/env bash
# The demo MTP and EAGLE-3 heads trained again on the device (2026-11-28), 195 s each (they had 80 s in the
# pair's run, still improving). Carry build/corpus_stdlib; the extra-corpus packages are the device's own, as
# the pair's run recorded them. Copies the new heads and metadata.json to $OUT.
set -u
OUT=${OUT:-/tmp/heads_out}
PAIR=graphspec/examples/demo_pair
mkdir -p /tmp/stdlib "$OUT" && tar xzf build/corpus_stdlib/stdlib.tar.gz -C /tmp/stdlib
python3 -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=. python3 tools/retrain_demo_heads.py --stdlib /tmp/stdlib --seconds "${HEAD_SECONDS:-195}" >"$OUT/retrain.log" 2>&1
echo "exit $?"
grep -v "^Loading\|it/s\]" "$OUT/retrain.log" | tail -8
cp -r "$PAIR/mtp" "$PAIR/eagle3" "$PAIR/metadata.json" "$OUT/"
