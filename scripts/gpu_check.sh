#!/usr/bin/env bash
# Everything graphspec checks on a GPU, in one device call (< 9 minutes on an H200):
#   1. install the package from this checkout without network (graphspec.kernels maps to kernels/),
#   2. every GPU test (pytest -m gpu: runtime, passes, kernels, e2e ...),
#   3. benchmarks/bench_step.py (step time captured vs eager, floor, parity),
#   4. benchmarks/bench_drafters.py (step time per drafter next to the target-only forwards),
#   5. scripts/gpu_parity.py, benchmarks/bench_hybrid.py and benchmarks/bench_kernels.py when they exist.
# Logs and JSON go to $OUT (the device tool brings that folder back); a stage that fails or times out
# does not stop the later ones, and the script exits non-zero if any stage failed.
#
#   bash scripts/gpu_check.sh                      # everything
#   PYTEST_TARGETS="tests/runtime" PYTEST_FLAGS="-q" bash scripts/gpu_check.sh   # a subset, no -x
# Stage time limits (seconds) can be overridden: TESTS_S, BENCH_S, DRAFTERS_S, PARITY_S, HYBRID_S, KERNELS_S; BENCH=0 skips
# stage 3, DRAFTERS=0 stage 4, EXTRAS=0 stage 5, BENCH_ARGS adds arguments to bench_step.py (e.g. "--no-piecewise
# --self-draft none").
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-/tmp/graphspec_gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
PYTEST_TARGETS="${PYTEST_TARGETS:-tests}"
PYTEST_FLAGS="${PYTEST_FLAGS:--q -x}"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
failed=0

stage() {  # stage NAME SECONDS LOG COMMAND...: run with a time limit, tee the log, record the status
    local name=$1 limit=$2 log=$3
    shift 3
    local begin=$SECONDS
    echo "=== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    echo "=== $name: exit $status after $((SECONDS - begin))s" | tee -a "$SUMMARY"
    [ "$status" -eq 0 ] || failed=1
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    "$PYTHON" -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee -a "$SUMMARY"

# No network there: no build isolation (setuptools comes from the image), no dependencies.
if ! "$PYTHON" -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >"$OUT/install.log" 2>&1; then
    # Fallback: import from the checkout; graphspec.kernels is a link to kernels/ (see pyproject's package-dir).
    echo "pip install -e . failed (see install.log); using PYTHONPATH" | tee -a "$SUMMARY"
    [ -e graphspec/kernels ] || ln -s ../kernels graphspec/kernels
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$PYTHON" -c 'import graphspec, graphspec.kernels' >>"$SUMMARY" 2>&1; then
    echo "graphspec is not importable; stopping" | tee -a "$SUMMARY"
    exit 1
fi

# shellcheck disable=SC2086  # PYTEST_TARGETS, PYTEST_FLAGS and BENCH_ARGS are word lists on purpose
stage "gpu tests" "${TESTS_S:-170}" "$OUT/pytest_gpu.log" \
    "$PYTHON" -m pytest -m gpu $PYTEST_TARGETS $PYTEST_FLAGS -p no:cacheprovider -rs --durations=10
if [ "${BENCH:-1}" = 1 ]; then
    stage "bench_step" "${BENCH_S:-300}" "$OUT/bench_step.log" \
        "$PYTHON" benchmarks/bench_step.py --json "$OUT/bench_step.json" ${BENCH_ARGS:-}
fi
if [ "${DRAFTERS:-1}" = 1 ]; then
    stage "bench_drafters" "${DRAFTERS_S:-420}" "$OUT/bench_drafters.log" \
        "$PYTHON" benchmarks/bench_drafters.py --json "$OUT/bench_drafters.json"
fi
if [ "${EXTRAS:-1}" = 1 ] && [ -f scripts/gpu_parity.py ]; then
    stage "gpu_parity" "${PARITY_S:-300}" "$OUT/gpu_parity.log" "$PYTHON" scripts/gpu_parity.py
fi
if [ "${EXTRAS:-1}" = 1 ] && [ -f benchmarks/bench_hybrid.py ]; then
    stage "bench_hybrid" "${HYBRID_S:-300}" "$OUT/bench_hybrid.log" \
        "$PYTHON" benchmarks/bench_hybrid.py --json "$OUT/bench_hybrid.json"
fi
if [ "${EXTRAS:-1}" = 1 ] && [ -f benchmarks/bench_kernels.py ]; then
    stage "bench_kernels" "${KERNELS_S:-90}" "$OUT/bench_kernels.log" "$PYTHON" benchmarks/bench_kernels.py
fi

echo "=== gpu_check: $([ "$failed" -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$SUMMARY"
exit "$failed"
