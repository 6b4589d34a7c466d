#!/usr/bin/env bash
# The demo DFlash drafter's training as run on the device (2026-11-28), with the sweep's pick as arguments:
#   OUT=... bash docs/results/2026-11-28-demo-dflash/train.sh --layers 2 --target-layer-ids 1,4,7
# (carry build/corpus_stdlib). Trains into the pair's dflash/ and records the run and the files' hashes in
# its metadata.json, then copies both to $OUT.
set -u
OUT=${OUT:-/tmp/train_out}
PAIR=graphspec/examples/demo_pair
mkdir -p /tmp/stdlib "$OUT" && tar xzf build/corpus_stdlib/stdlib.tar.gz -C /tmp/stdlib
python3 -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=. python3 tools/train_demo_dflash.py --device cuda --stdlib /tmp/stdlib --seconds "${TRAIN_SECONDS:-480}" \
    --batch-size 32 --seq-len 512 --anchors 64 --corpus-mb 30 --gen-sequences "${GEN:-2048}" --gen-batch 256 \
    --out "$PAIR/dflash" --metadata "$PAIR/metadata.json" "$@" >"$OUT/train.log" 2>&1
echo "exit $?"
grep -o "'step': [0-9]*\|'heldout_top1_agreement_by_slot': \[[^]]*\]" "$OUT/train.log" | paste - - | tail -4
cp -r "$PAIR/dflash" "$OUT/" && cp "$PAIR/metadata.json" "$OUT/"
