"""Launch-bound kernels of the decode step (add_rms_norm, rms_norm, silu_mul) under each config of a small
grid, at the step's real shapes: time per launch inside a CUDA graph of back-to-back launches on one
stream, as the captured step runs them.

    python benchmarks/bench_launch_configs.py            # both benchmark pairs' shapes, ~30 s on an H200
    python benchmarks/bench_launch_configs.py --json out.json

At batch 1 these kernels move a few kilobytes: their time is launch latency plus one reduction, so
the config that wins is the one with the shortest critical path, which the table shows per shape
(the current CONFIGS row is marked *).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import add_rms_norm, rms_norm, silu_mul

from benchmarks import common

DTYPE = torch.bfloat16
CHAIN = 200  # launches per captured graph
ROWS = (1, 2, 5)  # draft forwards (1, 2 tokens) and the target's verify (K+1 = 5) at batch 1
HIDDEN = {"llama-8b": 4096, "llama-1b": 2048}
INTERMEDIATE = {"llama-8b": 14336, "llama-1b": 8192}
GRID = {
    "add_rms_norm": [(8192, 8), (8192, 4), (4096, 4), (4096, 8), (4096, 2), (2048, 4), (2048, 2), (16384, 16)],
    "rms_norm": [(8192, 8), (8192, 4), (4096, 4), (4096, 2), (2048, 2)],
    "silu_mul": [(1024, 4), (2048, 4), (2048, 8), (512, 4), (512, 2), (1024, 2), (4096, 8)],
}
CURRENT = {
    "add_rms_norm": tuple(add_rms_norm.CONFIGS[90].values()),
    "rms_norm": tuple(rms_norm.CONFIGS[90].values()),
    "silu_mul": tuple(silu_mul.CONFIGS[90].values()),
}


def chain(op: str, rows: int, width: int, config: tuple[int, int]):
    """A closure running CHAIN launches of `op` with `config` (one stream: each starts after the last)."""
    tile_elems, num_warps = config
    knobs = {"tile_elems": tile_elems, "num_warps": num_warps}
    x = torch.randn(rows, width, device="cuda", dtype=DTYPE)
    weight = torch.randn(width, device="cuda", dtype=DTYPE)
    residual = torch.randn_like(x)
    gate_up = torch.randn(rows, 2 * width, device="cuda", dtype=DTYPE)
    calls = {
        "add_rms_norm": lambda: add_rms_norm.add_rms_norm(x, residual, weight, 1e-5, **knobs),
        "rms_norm": lambda: rms_norm.rms_norm(x, weight, 1e-5, **knobs),
        "silu_mul": lambda: silu_mul.silu_mul(gate_up, **knobs),
    }
    call = calls[op]

    def run() -> None:
        for _ in range(CHAIN):
            call()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows_out = []
    print(f"{torch.cuda.get_device_name()}: us per launch, {CHAIN} launches per CUDA graph (* = CONFIGS[90])")
    for op, grid in GRID.items():
        for model in HIDDEN:
            width = (INTERMEDIATE if op == "silu_mul" else HIDDEN)[model]
            for rows in ROWS:
                results = {}
                for config in grid:
                    timing = common.time_fn(chain(op, rows, width, config), "cuda", reps=20)
                    assert timing["mode"] == "cuda_graph", f"{op} {config}: capture failed"
                    results[config] = timing["ms"] * 1e3 / CHAIN
                best = min(results, key=results.get)
                cells = "  ".join(
                    f"{c[0]}/{c[1]}{'*' if c == CURRENT[op] else ''}={us:.2f}" for c, us in results.items()
                )
                print(f"{op:13s} {model:9s} M={rows}: best {best} {results[best]:.2f} us | {cells}", flush=True)
                rows_out.append(
                    {"op": op, "model": model, "rows": rows, "us": {str(c): us for c, us in results.items()}}
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows_out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
