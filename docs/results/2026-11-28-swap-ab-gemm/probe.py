# ruff: noqa  (the script as run, kept with its results)
"""Experiment (issues 13/16): can a swap-AB Triton GEMM beat cuBLAS on the verify's 80-row GEMMs?

At B = 16, K = 4 the verify's gate_up reads its weights at 87% of the copy rate against 97% at 16 rows
(docs/results/2026-11-27-verify-gemm): the 80 rows pad to 128 in cuBLAS's and kernels/mm.py's tiles, so the
tensor cores do 1.6x the work while the weights stream. Swap-AB puts the weight rows on the MMA's M side
(64/128 per warpgroup) and the 80 token rows on its N side as two dots of 64 + 16 columns: no padded work.
Weights and x come through TMA descriptors, pipelined over K. Also timed: cuBLAS asked for the other
orientation (mm(W, x^T), output [N, M]) and Inductor's max-autotune choice, if it compiles.

    python docs/results/2026-11-28-swap-ab-gemm/probe.py [--rows 16,80] [--inductor]

Timing as benchmarks/bench_linear.py: weights rotated past L2, CUDA-graph replays, us per call, % of the
device-to-device copy rate.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import common
from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us

DTYPE = torch.bfloat16


@triton.jit
def swap_ab_kernel(
    w_desc,
    x0_desc,
    x1_desc,
    out_ptr,
    M,
    N,
    K,
    BN: tl.constexpr,
    BK: tl.constexpr,
    M0: tl.constexpr,
    M1: tl.constexpr,
    STAGES: tl.constexpr,
):
    """out[M, N] = x[M, K] @ W[N, K]^T; program p owns weight rows p*BN .. p*BN+BN-1, all M rows of x:
    acc0 [BN, M0] over x rows 0..M0-1, acc1 [BN, M1] over rows M0..M0+M1-1 (M1 = 0: none)."""
    n0 = tl.program_id(0) * BN
    acc0 = tl.zeros((BN, M0), dtype=tl.float32)
    acc1 = tl.zeros((BN, M1 if M1 > 0 else 16), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        w = w_desc.load([n0, k0])  # [BN, BK]
        x0 = x0_desc.load([0, k0])  # [M0, BK]
        acc0 = tl.dot(w, tl.trans(x0), acc0)
        if M1 > 0:
            x1 = x1_desc.load([M0, k0])  # [M1, BK]
            acc1 = tl.dot(w, tl.trans(x1), acc1)
    cols = n0 + tl.arange(0, BN)
    rows0 = tl.arange(0, M0)
    out0 = tl.trans(acc0).to(out_ptr.dtype.element_ty)  # [M0, BN]
    tl.store(out_ptr + rows0[:, None] * N + cols[None, :], out0, mask=(rows0[:, None] < M) & (cols[None, :] < N))
    if M1 > 0:
        rows1 = M0 + tl.arange(0, M1)
        out1 = tl.trans(acc1).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows1[:, None] * N + cols[None, :], out1, mask=(rows1[:, None] < M) & (cols[None, :] < N))


def split_rows(m: int) -> tuple[int, int]:
    """(M0, M1): powers of two (>= 16, the MMA's smallest N here) covering m rows with little padding."""
    if m <= 16:
        return 16, 0
    m0 = 1 << (m.bit_length() - 1)  # the largest power of two <= m
    if m0 == m:
        return m0, 0
    rest = m - m0
    m1 = max(16, 1 << (rest - 1).bit_length())
    return (m0, m1) if m1 < m0 else (2 * m0, 0)


class SwapAB:
    def __init__(self, weights: list[torch.Tensor], x: torch.Tensor, bn: int, bk: int, stages: int, warps: int):
        self.m, self.k = x.shape
        self.n = weights[0].shape[0]
        self.m0, self.m1 = split_rows(self.m)
        self.bn, self.bk, self.stages, self.warps = bn, bk, stages, warps
        self.w_descs = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in weights]
        self.x0 = TensorDescriptor.from_tensor(x, [self.m0, bk])
        self.x1 = TensorDescriptor.from_tensor(x, [max(self.m1, 16), bk])
        self.out = torch.empty(self.m, self.n, dtype=x.dtype, device=x.device)

    def __call__(self, index: int) -> torch.Tensor:
        grid = (triton.cdiv(self.n, self.bn),)
        swap_ab_kernel[grid](
            self.w_descs[index],
            self.x0,
            self.x1,
            self.out,
            self.m,
            self.n,
            self.k,
            BN=self.bn,
            BK=self.bk,
            M0=self.m0,
            M1=self.m1,
            STAGES=self.stages,
            num_warps=self.warps,
        )
        return self.out


CONFIGS = [  # bn, bk, stages, warps
    (64, 128, 4, 4),
    (64, 128, 6, 4),
    (64, 256, 3, 4),
    (128, 64, 6, 4),
    (128, 128, 4, 4),
    (128, 128, 4, 8),
    (128, 128, 3, 8),
    (64, 64, 8, 4),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="16,80")
    parser.add_argument("--projections", default="gate_up,down,qkv,o")
    parser.add_argument("--inductor", action="store_true")
    args = parser.parse_args()
    copy_gb_s = common.measure_copy_bandwidth("cuda")["gb_s"]
    print(
        f"{common.device_name('cuda')}, triton {triton.__version__}, torch {torch.__version__}, copy {copy_gb_s:.0f} GB/s"
    )
    shapes = projections("llama-8b")
    for m in [int(r) for r in args.rows.split(",")]:
        for proj in args.projections.split(","):
            n, k = shapes[proj]
            copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
            weights = [torch.randn(n, k, dtype=DTYPE, device="cuda") / k**0.5 for _ in range(copies)]
            x = torch.randn(m, k, dtype=DTYPE, device="cuda")
            exact = x.float() @ weights[0].float().T
            err = lambda out: ((out.float() - exact).norm() / exact.norm()).item()
            pct = lambda us: 100 * n * k * 2 / (us * 1e-6) / 1e9 / copy_gb_s
            times, errors = {}, {}
            times["cublas"] = timed_us(lambda: [F.linear(x, w) for w in weights], copies)
            errors["cublas"] = err(F.linear(x, weights[0]))
            xt = x.t()
            times["cublas_NxM"] = timed_us(lambda: [torch.mm(w, xt) for w in weights], copies)
            errors["cublas_NxM"] = err(torch.mm(weights[0], xt).t())
            for bn, bk, stages, warps in CONFIGS:
                name = f"swap{bn}x{bk}s{stages}w{warps}"
                try:
                    run = SwapAB(weights, x, bn, bk, stages, warps)
                    errors[name] = err(run(0).clone())
                    times[name] = timed_us(lambda: [run(i) for i in range(copies)], copies)
                except Exception as failure:
                    print(f"  {name}: {type(failure).__name__}: {str(failure)[:200]}")
            if args.inductor:
                try:
                    compiled = torch.compile(
                        lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs", dynamic=False
                    )
                    compiled(x, weights[0])
                    errors["inductor"] = err(compiled(x, weights[0]))
                    times["inductor"] = timed_us(lambda: [compiled(x, w) for w in weights], copies)
                except Exception as failure:
                    print(f"  inductor: {type(failure).__name__}: {str(failure)[:200]}")
            best = min((t, key) for key, t in times.items())[1]
            line = ", ".join(f"{key} {us:.1f} ({pct(us):.0f}%, err {errors[key]:.1e})" for key, us in times.items())
            print(f"M={m:3d} {proj:8s} N={n:6d} K={k:5d} split {split_rows(m)}: {line}; best {best}", flush=True)
            weights.clear()


if __name__ == "__main__":
    main()
