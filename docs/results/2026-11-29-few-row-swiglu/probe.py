# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16, 2026-11-29 23:08 UTC): the few-row fused gate/up GEMM + scaled SwiGLU (kernels/scaled_silu_mul_linear.py's
swiglu_rows_kernel) against what it replaces (cuBLAS's gate/up matmul, then graphspec's scaled_silu_mul kernel), us per
call with the weights rotated past L2 (benchmarks/bench_linear.py's timing), at the 8B and 1B MLPs and 2-16 rows;
a few config rows around the sm_90 one.

    git apply docs/results/2026-11-29-few-row-swiglu/kernel.diff   # the kernel as measured (not landed)
    python docs/results/2026-11-29-few-row-swiglu/probe.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import common
from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
from graphspec.kernels import scaled_silu_mul as unfused
from graphspec.kernels import scaled_silu_mul_linear as kernel

CONFIGS = [  # block_n, block_k, num_warps, num_stages; the first is the sm_90 few_rows row
    tuple(kernel.CONFIGS[(90, "few_rows")].values()),
    (32, 128, 4, 3),
    (32, 128, 4, 5),
    (16, 256, 4, 4),
    (32, 256, 4, 3),
    (64, 64, 4, 4),
    (16, 128, 4, 6),
    (32, 128, 8, 4),
]


def main() -> None:
    copy = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(f"{common.device_name('cuda')}, copy {copy:.0f} GB/s")
    swiglu = unfused.CONFIGS[90]
    for model in ("llama-8b", "llama-1b"):
        n, k = projections(model)["gate_up"]
        copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(copies)]
        for m in (2, 5, 8, 16):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda") * 3
            reference = unfused.scaled_silu_mul(x @ weights[0].t(), x, 1e-5, swiglu["tile_elems"], swiglu["num_warps"])
            times = {
                "cublas+swiglu": timed_us(
                    lambda: [
                        unfused.scaled_silu_mul(x @ w.t(), x, 1e-5, swiglu["tile_elems"], swiglu["num_warps"])
                        for w in weights
                    ],
                    copies,
                )
            }
            for config in CONFIGS:
                name = "{}x{} w{} s{}".format(*config)
                out = kernel.scaled_silu_mul_linear(x, weights[0].t(), 1e-5, *config)
                diff = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                times[name] = timed_us(
                    lambda: [kernel.scaled_silu_mul_linear(x, w.t(), 1e-5, *config) for w in weights], copies
                )
                times[name + f" (diff {diff:.1e})"] = times.pop(name)
            line = ", ".join(f"{key} {us:.1f}" for key, us in times.items())
            print(f"{model} gate/up {n}x{k} M={m}: {line}", flush=True)
        weights.clear()


if __name__ == "__main__":
    main()
