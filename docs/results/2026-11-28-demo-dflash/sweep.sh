#!/usr/bin/env bash
# The demo DFlash drafter's sweep as run on the device (2026-11-28): which target layers it reads and how
# deep it is, the same training seconds each. The shipped drafter (session 10) reads layers 1, 3, 5 of the
# 8-layer target (z-lab's spread, which stops at layer L - 3) with one layer; its held-out slot-1 agreement
# (0.445) sits far below the MTP head's first draft (0.75), which reads the target's last layer.
#   run: bash docs/results/2026-11-28-demo-dflash/sweep.sh   (carry build/corpus_stdlib; writes $OUT/*.log)
set -u
OUT=${OUT:-/tmp/sweep_out}
mkdir -p /tmp/stdlib "$OUT" && tar xzf build/corpus_stdlib/stdlib.tar.gz -C /tmp/stdlib
python3 -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1
SECONDS_EACH=${SECONDS_EACH:-110}
run() {
    local name=$1
    shift
    PYTHONPATH=. python3 tools/train_demo_dflash.py --device cuda --stdlib /tmp/stdlib --seconds "$SECONDS_EACH" \
        --batch-size 32 --seq-len 512 --anchors 64 --corpus-mb 30 --eval-every 500 --out "/tmp/sweep/$name" "$@" \
        >"$OUT/$name.log" 2>&1
    echo "$name: $(grep -o "'step': [0-9]*" "$OUT/$name.log" | tail -1) $(grep -o "'heldout_top1_agreement_by_slot': \[[^]]*\]" "$OUT/$name.log" | tail -1)"
}
nvidia-smi --query-gpu=name --format=csv,noheader
run base_135_l1 --layers 1
run ids_147_l1 --layers 1 --target-layer-ids 1,4,7
run ids_147_l2 --layers 2 --target-layer-ids 1,4,7
run ids_357_l2 --layers 2 --target-layer-ids 3,5,7
