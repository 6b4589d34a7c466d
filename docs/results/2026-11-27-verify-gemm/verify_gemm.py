# ruff: noqa  (the script as run, kept with its results)
"""Experiment (issue 13/16): the verify's GEMMs at M = 80 (B = 16, K = 4) read their weights less efficiently than
at M = 16 (gate_up: 88.6% of the copy rate against 97.8%, session 18). Other ways to run the same product, each
timed as bench_linear times (weights rotated past L2, CUDA-graph replays): cuBLAS (no workspace, as graphspec
runs it; cuBLASLt without a bias needs one), the weight split in
two along N (two GEMMs, as gate and up would be stored apart), x padded to 96 / 128 rows, and kernels/mm.py's
Triton matmul with tiles that cover every row in one M block.

    python docs/results/2026-11-27-verify-gemm/verify_gemm.py
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import common
from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
from graphspec.kernels import mm as mm_kernel

DTYPE = torch.bfloat16
TRITON = [  # block_m, block_n, block_k, split_programs, num_warps, num_stages
    (64, 64, 64, 256, 4, 6),  # the sm_90 row
    (128, 64, 64, 0, 4, 4),
    (128, 64, 128, 0, 8, 3),
    (128, 128, 64, 0, 8, 3),
    (128, 32, 128, 0, 4, 4),
    (128, 64, 64, 256, 4, 4),
    (32, 64, 128, 256, 4, 4),
    (16, 64, 128, 256, 4, 4),
]


def main() -> None:
    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(f"{common.device_name('cuda')}, copy {copy_gb_s:.0f} GB/s")
    for m in (16, 20, 80):
        for proj, (n, k) in projections("llama-8b").items():
            if proj == "lm_head":
                continue
            copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
            weights = [torch.randn(n, k, dtype=DTYPE, device="cuda") for _ in range(copies)]
            halves = [(w[: n // 2].contiguous(), w[n // 2 :].contiguous()) for w in weights]
            x = torch.randn(m, k, dtype=DTYPE, device="cuda")
            pct = lambda us: 100 * n * k * 2 / (us * 1e-6) / 1e9 / copy_gb_s
            times = {"cublas": timed_us(lambda: [F.linear(x, w) for w in weights], copies)}
            times["n_split_2"] = timed_us(lambda: [(F.linear(x, a), F.linear(x, b)) for a, b in halves], copies)
            for rows in (96, 128):
                if rows > m:
                    padded = torch.randn(rows, k, dtype=DTYPE, device="cuda")
                    times[f"pad_{rows}"] = timed_us(lambda: [F.linear(padded, w) for w in weights], copies)
            for config in TRITON:
                try:
                    times[f"triton{config}"] = timed_us(
                        lambda: [mm_kernel.mm(x, w.t(), None, *config) for w in weights], copies
                    )
                except Exception as failure:
                    times[f"triton{config}"] = float("nan")
                    print(f"  {config}: {type(failure).__name__}: {failure}")
            best = min(times, key=lambda key: times[key] if times[key] == times[key] else 1e9)
            line = ", ".join(f"{key} {us:.1f} ({pct(us):.0f}%)" for key, us in times.items())
            print(f"M={m:3d} {proj:8s} N={n:6d} K={k:5d}: {line}; best {best}", flush=True)
            weights.clear()
            halves.clear()


if __name__ == "__main__":
    main()
