#!/usr/bin/env bash
# Set up on a fresh machine and run the main job on the built-in example: compile the shipped
# demo pair (a small trained target + draft, graphspec/examples/demo_pair) into a serving artifact,
# generate Python code with speculative decoding, then time it next to transformers on this machine,
# and every drafter of the demo target (draft model, MTP head, EAGLE-3 head, DFlash drafter, n-gram) side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# The demo models are tiny: one thread is fastest, and far faster on a shared machine.
export OMP_NUM_THREADS=1
DEMO=graphspec/examples/demo_pair
graphspec compile "$DEMO/target" --draft "$DEMO/draft" -k 4 --batch-sizes 1,2 \
    --dtype float32 --device cpu --max-seq-len 512 --out artifacts/demo --dump-dir artifacts/demo_dumps
graphspec inspect artifacts/demo
graphspec generate artifacts/demo --prompt "def read_lines(path):
    with open(path) as f:" --max-new-tokens 96
graphspec generate artifacts/demo --prompt "class Stack:
    def __init__(self):" --max-new-tokens 96 --temperature 0.7 --seed 0
# The same target with a head as its drafter: a head directory (config.json + model.safetensors, trained
# for this target; it reads the target's hidden states and uses the target's embedding) is passed as
# --draft like a draft model. EAGLE-3 here; the MTP head (SGLang's NextN layout) is $DEMO/mtp.
graphspec compile "$DEMO/target" --draft "$DEMO/eagle3" -k 4 --batch-sizes 1 \
    --dtype float32 --device cpu --max-seq-len 512 --out artifacts/demo_eagle3
graphspec generate artifacts/demo_eagle3 --prompt "import os


def list_files(path):" --max-new-tokens 96
# The same prompt, greedy, side by side in one process: transformers' greedy (the target alone) and
# assisted generation (same draft) against graphspec's compiled step (Inductor on the CPU: the first
# call compiles it, about a minute, cached on disk afterwards); tokens/s, tokens per step, same output.
# Then every drafter of the demo target side by side (draft model, MTP head, EAGLE-3 head, DFlash block
# drafter, n-gram lookup: no model): tokens per step and tokens/s, each compiled on its first call.
python benchmarks/bench_cpu.py --quick --artifact artifacts/demo --drafters draft,mtp,eagle3,dflash,ngram
