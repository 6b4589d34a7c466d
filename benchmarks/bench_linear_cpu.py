"""The CPU step's projections: torch.mm (MKL's sgemm, which packs the weight on every call) against
graphspec::mm_cpu (oneDNN over a weight packed once, kernels/mm_cpu.py), fp32, one torch thread.

Shapes are the demo pair's (graphspec/examples/demo_pair) projections at the row counts the step uses:
1 (a draft token), 2 (the draft's catch-up), 5 (a K=4 verify block), 20 (batch 4's verify block). Each
measurement cycles through enough distinct weights (--rotation-mb) that they stream from memory, not
from the last-level cache, as one step's weights do. Prints us per call, GB/s of weight read, the
speedup, the larger relative error of the two results against fp64, and mm_cpu over a bfloat16 copy of
the same weights (what a drafter's projections run with cpu_draft_dtype="bfloat16"; "-" on a CPU whose
oneDNN has no bfloat16 matmul).

    python benchmarks/bench_linear_cpu.py [--rows 1,2,5,20] [--threads 1] [--rotation-mb 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphspec.kernels import mm_cpu

# (name, N, K): the demo target's fused qkv, o, gate_up, down and lm_head; the draft's gate_up and lm_head.
SHAPES = (
    ("target qkv", 640, 384),
    ("target o", 384, 384),
    ("target gate_up", 2048, 384),
    ("target down", 384, 1024),
    ("target lm_head", 4096, 384),
    ("draft gate_up", 1408, 256),
    ("draft lm_head", 4096, 256),
)


def time_calls(fn, count: int, repeats: int = 3) -> float:
    """Seconds per call of fn(i) over i in range(count), after one warm pass; best of `repeats`."""
    for i in range(count):
        fn(i)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(count):
            fn(i)
        best = min(best, (time.perf_counter() - start) / count)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,5,20", help="comma-separated row counts (M)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--rotation-mb", type=int, default=128, help="distinct weights cycled per shape (default: past a 32 MB cache)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]
    print(f"torch {torch.__version__}, {args.threads} thread(s), fp32; us per call (GB/s of weight read)")
    header = f"{'projection':<16} {'N x K':>11} {'M':>3} {'torch.mm':>18} {'mm_cpu (packed)':>18} {'speedup':>8}"
    print(f"{header} {'err fp64':>9} {'bf16 packed':>12}")
    total_mm = total_packed = 0.0
    for name, n, k in SHAPES:
        count = max(2, args.rotation_mb * 2**20 // (n * k * 4))
        weights = [torch.randn(n, k) for _ in range(count)]
        entries = [mm_cpu.pack(w) for w in weights]  # kept alive: the packed copies live as long as these
        # The same values packed as bfloat16 (Runtime(cpu_draft_dtype="bfloat16") packs a drafter's so).
        halves = [w.clone() for w in weights] if mm_cpu.bfloat16_supported() else []
        entries += [mm_cpu.pack(w, torch.bfloat16) for w in halves]
        assert all(entries)
        for rows in rows_list:
            x = torch.randn(rows, k)
            plain = time_calls(lambda i, x=x, w=weights: torch.mm(x, w[i].t()), count)
            packed = time_calls(lambda i, x=x, w=weights: mm_cpu.mm_cpu(x, w[i].t()), count)
            half = time_calls(lambda i, x=x, w=halves: mm_cpu.mm_cpu(x, w[i].t()), count) if halves else None
            exact = torch.mm(x.double(), weights[0].double().t())
            error = max(
                ((torch.mm(x, weights[0].t()) - exact).norm() / exact.norm()).item(),
                ((mm_cpu.mm_cpu(x, weights[0].t()) - exact).norm() / exact.norm()).item(),
            )
            gbs = n * k * 4 / 1e9
            total_mm, total_packed = total_mm + plain, total_packed + packed
            print(
                f"{name:<16} {f'{n}x{k}':>11} {rows:>3} {plain * 1e6:9.1f} ({gbs / plain:5.1f}) "
                f"{packed * 1e6:9.1f} ({gbs / packed:5.1f}) {plain / packed:7.2f}x {error:9.1e} "
                + (f"{half * 1e6:9.1f} us" if half is not None else f"{'-':>9} us")  # no bfloat16 on this CPU
            )
        del entries, halves
    print(f"sum over the rows above: torch.mm {total_mm * 1e3:.2f} ms, mm_cpu {total_packed * 1e3:.2f} ms "
          f"({total_mm / total_packed:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
