#!/usr/bin/env bash
# Everything graphspec checks on a GPU, stage by stage; STAGES picks them. One device call runs at most 10
# minutes, so a full check takes several calls, e.g. (H200, 8B/1B shapes; times are rough):
#   STAGES=tests PYTEST_TARGETS="tests/drafters tests/e2e tests/kernels" bash scripts/gpu_check.sh   # GPU tests,
#   STAGES=tests,kernels PYTEST_TARGETS="tests/lowering tests/models tests/runtime tests/serve tests/test_*.py \
#       tests/tools" bash scripts/gpu_check.sh             # in two calls (all of them take over 10 minutes)
#   STAGES=step,drafters bash scripts/gpu_check.sh         # the step vs its floor, every drafter's step
#   STAGES=dflash,hybrid,prefill bash scripts/gpu_check.sh # DFlash, hybrid targets, prefill + cold start
#   STAGES=serve bash scripts/gpu_check.sh                 # serving under load
# Stages:
#   tests     every GPU test (pytest -m gpu; PYTEST_TARGETS / PYTEST_FLAGS / PYTEST_K (a -k expression, e.g.
#             "not dflash and not hybrid") narrow it; PYTEST_MARKS= (empty) runs
#             the unmarked tests of the targets too, which run on CUDA when there is one: tests/kernels' do)
#   step      benchmarks/bench_step.py (step time captured vs eager, floor, parity; BENCH_ARGS adds arguments)
#   drafters  benchmarks/bench_drafters.py (draft model, n-gram, MTP, EAGLE-3 next to decode and verify;
#             DRAFTERS_ARGS adds arguments, e.g. "--drafters mtp,dflash --token-map-sizes 32768,16384")
#   dflash    benchmarks/bench_drafters.py --drafters dflash (blocks 8 and 16 next to the verify of that width)
#   hybrid    benchmarks/bench_hybrid.py (a Qwen3.5-shaped target's MTP and n-gram steps)
#   prefill   benchmarks/bench_prefill.py (time to first token vs transformers, cold start by phase;
#             PREFILL_ARGS adds arguments, e.g. "--profile 4096x1")
#   transfer  benchmarks/bench_weight_transfer.py (weight shards to the GPU: the load's prefetch vs safe_open)
#   serve     benchmarks/bench_serve.py (continuous vs static batching under Poisson load)
#   parity    scripts/gpu_parity.py (when it exists)
#   kernels   benchmarks/bench_kernels.py (KERNELS_ARGS adds arguments, e.g. "--only bench_sample,bench_verify")
#   ab        a change measured side by side: bench_drafters (DRAFTERS_ARGS, e.g. "--drafters draft_model
#             --batch-sizes 1") once per entry of AB_ORDER (default "off on off"): "on" the tree as it is, "off" with
#             the patch AB_DIFF applied (`git apply`; reverted after the run); or, for a switch, "on" with the
#             variable AB_ON_ENV (NAME=VALUE) set and "off" without it; one log and JSON per run
#             (ab_<n>_<on|off>.*). Runs on one machine back to back: the spread between machines is larger than
#             most effects measured (docs/BENCHMARKS.md). E.g. STAGES=ab AB_DIFF=docs/results/X/off.diff, or
#             STAGES=ab AB_ON_ENV=GRAPHSPEC_PDL=0 (the "on" runs in plain stream order)
# The package is installed from this checkout without network first (graphspec.kernels maps to kernels/).
# Logs and JSON go to $OUT (the device tool brings that folder back); a stage that fails or times out does
# not stop the later ones, and the script exits non-zero if any stage failed. Each stage's time limit can be
# overridden (TESTS_S, STEP_S, DRAFTERS_S, DFLASH_S, HYBRID_S, PREFILL_S, TRANSFER_S, SERVE_S, PARITY_S, KERNELS_S,
# AB_S: each run of the ab stage).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-/tmp/graphspec_gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
PYTEST_TARGETS="${PYTEST_TARGETS:-tests}"
PYTEST_FLAGS="${PYTEST_FLAGS:--q -x}"
PYTEST_MARKS="${PYTEST_MARKS--m gpu}"  # unset: -m gpu; set to empty: every test of PYTEST_TARGETS
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
# Which code ran: the working files' git tree id (benchmarks/common.py source_info; `git log --all --format='%H %T' |
# grep TREE` finds the commit). The device copies the working tree, and its .git can lag behind it. Every
# benchmark's JSON records the same, and each ab run its own (the patched files).
"$PYTHON" -c 'import json; from benchmarks import common; print("source", json.dumps(common.source_info()))' 2>&1 |
    tee -a "$SUMMARY"

STAGES="${STAGES:-tests,kernels}"
wants() { [[ ",$STAGES," == *",$1,"* ]]; }
# shellcheck disable=SC2086  # PYTEST_TARGETS, PYTEST_FLAGS and the *_ARGS are word lists on purpose
if wants tests; then
    # PYTEST_K: a -k expression, passed as one argument (PYTEST_FLAGS is split on spaces, quotes and all)
    stage "gpu tests" "${TESTS_S:-450}" "$OUT/pytest_gpu.log" \
        "$PYTHON" -m pytest $PYTEST_MARKS $PYTEST_TARGETS $PYTEST_FLAGS ${PYTEST_K:+-k "$PYTEST_K"} -p no:cacheprovider \
        -rs --durations=10
fi
if wants step; then
    stage "bench_step" "${STEP_S:-300}" "$OUT/bench_step.log" \
        "$PYTHON" benchmarks/bench_step.py --json "$OUT/bench_step.json" ${BENCH_ARGS:-}
fi
if wants drafters; then
    stage "bench_drafters" "${DRAFTERS_S:-300}" "$OUT/bench_drafters.log" \
        "$PYTHON" benchmarks/bench_drafters.py --batch-sizes 1,4,16 --json "$OUT/bench_drafters.json" ${DRAFTERS_ARGS:-}
fi
if wants dflash; then
    stage "bench_dflash" "${DFLASH_S:-240}" "$OUT/bench_dflash.log" \
        "$PYTHON" benchmarks/bench_drafters.py --drafters dflash --batch-sizes 1,4,16 --json "$OUT/bench_dflash.json"
fi
if wants hybrid; then
    stage "bench_hybrid" "${HYBRID_S:-150}" "$OUT/bench_hybrid.log" \
        "$PYTHON" benchmarks/bench_hybrid.py --json "$OUT/bench_hybrid.json"
fi
if wants prefill; then
    stage "bench_prefill" "${PREFILL_S:-380}" "$OUT/bench_prefill.log" \
        "$PYTHON" benchmarks/bench_prefill.py --json "$OUT/bench_prefill.json" ${PREFILL_ARGS:-}
fi
if wants transfer; then
    stage "bench_weight_transfer" "${TRANSFER_S:-150}" "$OUT/bench_weight_transfer.log" \
        "$PYTHON" benchmarks/bench_weight_transfer.py
fi
if wants serve; then
    stage "bench_serve" "${SERVE_S:-280}" "$OUT/bench_serve.log" \
        "$PYTHON" benchmarks/bench_serve.py --json "$OUT/bench_serve.json" --plot "$OUT/bench_serve.svg"
fi
if wants parity && [ -f scripts/gpu_parity.py ]; then
    stage "gpu_parity" "${PARITY_S:-300}" "$OUT/gpu_parity.log" "$PYTHON" scripts/gpu_parity.py
fi
if wants kernels; then
    stage "bench_kernels" "${KERNELS_S:-90}" "$OUT/bench_kernels.log" "$PYTHON" benchmarks/bench_kernels.py ${KERNELS_ARGS:-}
fi
if wants ab; then
    if [ -n "${AB_DIFF:-}" ] && { [ ! -f "$AB_DIFF" ] || ! git apply --check "$AB_DIFF"; }; then
        echo "=== ab: AB_DIFF ($AB_DIFF) is not a patch that applies to this tree" | tee -a "$SUMMARY"
        failed=1
    elif [ -z "${AB_DIFF:-}" ] && [[ "${AB_ON_ENV:-}" != ?*=* ]]; then
        echo "=== ab: needs AB_DIFF (a patch) or AB_ON_ENV (NAME=VALUE), got '${AB_ON_ENV:-}'" | tee -a "$SUMMARY"
        failed=1
    else
        run=0
        for version in ${AB_ORDER:-off on off}; do
            run=$((run + 1))
            setting=()  # `env NAME=VALUE` before the command for an "on" run of AB_ON_ENV
            [ "$version" = on ] && [ -n "${AB_ON_ENV:-}" ] && setting=(env "$AB_ON_ENV")
            [ "$version" = off ] && [ -n "${AB_DIFF:-}" ] && git apply "$AB_DIFF"
            stage "ab $run $version" "${AB_S:-200}" "$OUT/ab_${run}_${version}.log" ${setting[@]+"${setting[@]}"} \
                "$PYTHON" benchmarks/bench_drafters.py --json "$OUT/ab_${run}_${version}.json" ${DRAFTERS_ARGS:-}
            [ "$version" = off ] && [ -n "${AB_DIFF:-}" ] && git apply -R "$AB_DIFF"
        done
    fi
fi

echo "=== gpu_check: $([ "$failed" -eq 0 ] && echo PASSED || echo FAILED)" | tee -a "$SUMMARY"
exit "$failed"
