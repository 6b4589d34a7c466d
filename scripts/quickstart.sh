#!/usr/bin/env bash
# Set up on a fresh machine and run the main job on the built-in example: compile the shipped
# demo pair (a small trained target + draft, graphspec/examples/demo_pair) into a serving artifact,
# then generate Python code with speculative decoding and print tokens/s and acceptance.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check torch==2.13.0
python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
DEMO=graphspec/examples/demo_pair
graphspec compile "$DEMO/target" --draft "$DEMO/draft" -k 4 --batch-sizes 1,2 \
    --dtype float32 --device cpu --max-seq-len 512 --out artifacts/demo --dump-dir artifacts/demo_dumps
graphspec inspect artifacts/demo
graphspec generate artifacts/demo --prompt "def fibonacci(n):" --max-new-tokens 96
graphspec generate artifacts/demo --prompt "class Stack:
    def __init__(self):" --max-new-tokens 96 --temperature 0.7 --seed 0
