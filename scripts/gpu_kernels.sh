#!/usr/bin/env bash
# The Triton kernels on a GPU, in one device call: kernel and lowering tests (the small-shape tests
# compiled for the GPU plus the gpu-marked real-shape ones), then benchmarks/bench_kernels.py.
# Output is tee'd to $OUT (the device tool brings that folder back); the benchmark runs even when a
# test fails, and the script exits non-zero if either failed.
#
#   bash scripts/gpu_kernels.sh              # tests + benchmark table
#   bash scripts/gpu_kernels.sh --sweep      # also the attention config sweep (CONFIGS[90] comes from it)
# Time limits (seconds): TESTS_S (default 200), BENCH_S (default 260).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-/tmp/graphspec_gpu_kernels}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    "$PYTHON" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"

# No network there: no build isolation (setuptools comes from the image), no dependencies.
if ! "$PYTHON" -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q -e . >"$OUT/install.log" 2>&1; then
    echo "pip install -e . failed (see install.log); importing from the checkout" | tee -a "$OUT/env.txt"
    [ -e graphspec/kernels ] || ln -s ../kernels graphspec/kernels  # what pyproject's package-dir maps
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PYTHON" -c 'import graphspec.kernels.attention' || { echo "graphspec.kernels is not importable"; exit 1; }

status=0
timeout --kill-after=10 "${TESTS_S:-200}" "$PYTHON" -m pytest tests/kernels tests/lowering -q -p no:cacheprovider -rs \
    --durations=15 2>&1 | tee "$OUT/pytest_kernels.log" || status=1
timeout --kill-after=10 "${BENCH_S:-260}" "$PYTHON" benchmarks/bench_kernels.py --json "$OUT/bench_kernels.json" "$@" \
    2>&1 | tee "$OUT/bench_kernels.log" || status=1
echo "gpu_kernels: $([ "$status" -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$OUT/env.txt"
exit "$status"
