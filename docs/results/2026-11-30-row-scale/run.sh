#!/usr/bin/env bash
# Device call (2026-11-30): the folded input norm's row scale in the attention. Per launch (the prologue probe):
# the tree's row_inverse_rms (squares accumulated across loop steps, summed once) at ROW_TILE 2048/4096/8192, and
# the previous form (accumulate.diff reverted: a cross-warp sum per loop step). Then bench_drafters (draft model,
# B = 1) back to back: "cur" = the tree; "fold" = fold_verify.diff (the verify's and catch-up's input norms folded too).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/row_scale}"
HERE=docs/results/2026-11-30-row-scale
PROBE=docs/results/2026-11-30-attention-prologue-probe/probe.py
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; git log -1 --format=%H 2>/dev/null; } | tee "$OUT/gpu.txt"
bench() {
    timeout 200 python3 benchmarks/bench_drafters.py --drafters draft_model --batch-sizes 1 --json "$OUT/$1.json" \
        >"$OUT/$1.log" 2>&1
    echo "$1: $(grep -E '^ +1 ' "$OUT/$1.log" | head -2 | tr -s ' ' | tr '\n' ';')"
}
for run in ${ORDER:-probe 1_cur 2_fold 3_fold 4_cur}; do
    case $run in
        probe)
            for tile in 2048 4096 8192; do timeout 100 python3 $PROBE --row-tile $tile 2>&1 | tee "$OUT/probe_$tile.log"; done
            git apply -R $HERE/accumulate.diff
            timeout 100 python3 $PROBE 2>&1 | tee "$OUT/probe_previous.log"
            git apply $HERE/accumulate.diff
            ;;
        *_cur) bench "$run" ;;
        *_fold) git apply $HERE/fold_verify.diff; bench "$run"; git apply -R $HERE/fold_verify.diff ;;
    esac
done
git status --short
