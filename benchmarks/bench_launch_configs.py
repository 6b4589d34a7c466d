"""Launch-bound kernels of the decode step (add_rms_norm, rms_norm, silu_mul, attention's split-K reduce)
under each config of a small grid, at the step's real shapes: time per launch inside a CUDA graph of
back-to-back launches on one stream, as the captured step runs them.

    python benchmarks/bench_launch_configs.py            # both benchmark pairs' shapes, ~30 s on an H200
    python benchmarks/bench_launch_configs.py --json out.json

At batch 1 these kernels move a few kilobytes: their time is launch latency plus one reduction, so
the config that wins is the one with the shortest critical path, which the table shows per shape
(the current choice, CONFIGS[90] or the reduce's module constants, is marked *).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphspec.kernels import add_rms_norm, attention, rms_norm, silu_mul
from graphspec.kernels.common import next_power_of_2

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
    "attention_reduce": [(16, 4), (16, 2), (16, 1), (8, 1), (8, 2), (32, 4), (32, 2)],  # (chunk, num_warps)
}
# attention_reduce: 32 q heads, SPLITS partials per row (the split count of a batch-1 step on an H200),
# head dim 128 (8B) / 64 (1B); its "rows" are tokens, so rows x 32 output rows.
SPLITS = 33
Q_HEADS = 32
HEAD_DIM = {"llama-8b": 128, "llama-1b": 64}
CURRENT = {
    "add_rms_norm": tuple(add_rms_norm.CONFIGS[90].values()),
    "rms_norm": tuple(rms_norm.CONFIGS[90].values()),
    "silu_mul": tuple(silu_mul.CONFIGS[90].values()),
    "attention_reduce": attention.reduce_launch(SPLITS, HEAD_DIM["llama-8b"], fixed_splits=False),
}


def chain(op: str, model: str, rows: int, width: int, config: tuple[int, int]):
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
    if op == "attention_reduce":
        out_rows, dim = rows * Q_HEADS, HEAD_DIM[model]
        part_out = torch.randn(out_rows * SPLITS, dim, device="cuda")
        part_lse = torch.randn(out_rows * SPLITS, device="cuda")
        out = torch.empty(out_rows, dim, device="cuda", dtype=DTYPE)
        calls[op] = lambda: attention.attention_reduce_kernel[(out_rows,)](
            part_out, part_lse, out, SPLITS, HEAD_DIM=dim, BLOCK_SPLITS=next_power_of_2(SPLITS), CHUNK=tile_elems,
            num_warps=num_warps,
        )  # fmt: skip
    call = calls[op]

    def run() -> None:
        for _ in range(CHAIN):
            call()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(GRID), help="comma list of GRID ops to time")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    ops = args.ops.split(",")
    rows_out = []
    print(f"{torch.cuda.get_device_name()}: us per launch, {CHAIN} launches per CUDA graph (* = current choice)")
    for op, grid in ((op, GRID[op]) for op in ops):
        for model in HIDDEN:
            width = (INTERMEDIATE if op == "silu_mul" else HIDDEN)[model]
            for rows in ROWS:
                results = {}
                for config in grid:
                    timing = common.time_fn(chain(op, model, rows, width, config), "cuda", reps=20)
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
        common.write_json(args.json, rows_out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
