#!/usr/bin/env bash
# One device call (2026-11-30, as run at 2b27cf8, whose tree held top_logits.diff): the top-k probe, the sampling
# kernels' GPU tests, then the sampling step with candidates.top_logits ("on", the tree) and with one torch.topk over
# whole rows ("off": off.diff, the reverse of top_logits.diff's kernels/candidates.py part), back to back. The change
# lost and was reverted; to run this again, apply top_logits.diff and write off.diff as its reverse first.
#   OUT=... bash docs/results/2026-11-30-topk/run.sh
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/topk}"
HERE=docs/results/2026-11-30-topk
mkdir -p "$OUT"
python3 -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >/dev/null 2>&1
timeout 60 python3 "$HERE/probe.py" >"$OUT/probe_h200.log" 2>&1
cat "$OUT/probe_h200.log"
TESTS="tests/kernels/test_candidates.py tests/kernels/test_sample.py tests/kernels/test_verify_rejection.py"
# shellcheck disable=SC2086
timeout 100 python3 -m pytest -q -p no:cacheprovider $TESTS -k "candidates or real or replays or q_that" \
    >"$OUT/pytest_gpu.log" 2>&1
tail -3 "$OUT/pytest_gpu.log"
bench() {  # bench NAME: the sampling step next to the greedy step at batch 1
    timeout 170 python3 benchmarks/bench_step.py --sampling --batch-sizes 1 --no-piecewise --no-stock \
        --self-draft none --parity-steps 0 --eager-steps 1 --json "$OUT/$1.json" >"$OUT/$1.log" 2>&1
    echo "$1: $(grep -E '^8B/1B +1 ' "$OUT/$1.log")"
}
bench on
git apply "$HERE/off.diff" && bench off && git apply -R "$HERE/off.diff"
git status --short
# The 100k-draw distribution tests last, in what time is left.
# shellcheck disable=SC2086
timeout 100 python3 -m pytest -q -p no:cacheprovider $TESTS -k "follow_process_logits or emits_target" \
    >"$OUT/pytest_gpu_draws.log" 2>&1
tail -3 "$OUT/pytest_gpu_draws.log"
