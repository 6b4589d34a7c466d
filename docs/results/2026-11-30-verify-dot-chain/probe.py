# ruff: noqa  (a probe, kept with its results)
"""Probe (issue 16, 2026-11-30): a verify's few-row products as a chain, cuBLAS against a tensor-core Triton kernel
launched with programmatic dependent launch.

docs/results/2026-11-29-few-row-dot-probe timed each 5-row product alone, back to back with itself: the best
weight-stationary dot kernel per 8B projection came within 0.4-1 us of cuBLAS, and nothing was built. Alone, a
kernel's ramp (first weight tiles in flight) and tail (last programs) are paid in full either way. In the step the
products follow each other, and a Triton kernel launched with PDL can ask for its first weight tile before it waits
for the kernel ahead (as the one-row GEMVs do: docs/BENCHMARKS.md 2026-11-29, a decode 3.976 -> 3.894 ms with PDL
and early tiles): cuBLAS cannot. This times L layers of the verify's four products (q/k/v, o, gate/up, down; each
product's input the previous one's output, sliced to its K) as one CUDA graph:

  cublas       torch.mm
  dot          the dot kernel in plain stream order
  dot_pdl      launched with PDL, waiting first
  dot_early    launched with PDL, the first weight tile asked for before the wait

    python docs/results/2026-11-30-verify-dot-chain/probe.py [--rows 5,8] [--layers 16]
    TRITON_INTERPRET=1 python docs/results/2026-11-30-verify-dot-chain/probe.py --check-cpu
"""

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from graphspec.kernels.common import let_later_kernels_launch, wait_for_earlier_kernels  # noqa: E402

HIDDEN, QKV, INTER = 4096, 6144, 14336  # Llama-3.1-8B
# (name, N, K, (BN, BK, stages, warps)): the 2026-11-29 probe's best "dotw" tile per projection at 5 rows
PRODUCTS = [
    ("qkv", QKV, HIDDEN, (16, 256, 4, 2)),
    ("o", HIDDEN, HIDDEN, (32, 256, 4, 4)),
    ("gate_up", 2 * INTER, HIDDEN, (64, 128, 4, 4)),
    ("down", HIDDEN, INTER, (32, 256, 4, 4)),
]
BM = 16


@triton.jit
def dot_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
               EARLY: tl.constexpr, UPCAST: tl.constexpr, BM: tl.constexpr, USE_PDL: tl.constexpr = False):  # fmt: skip
    n_rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, BM)
    m_ok = ms < M
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    first = tl.arange(0, BK)
    if EARLY:
        w_first = tl.load(w_ptr + n_rows[:, None] * K + first[None, :])
    wait_for_earlier_kernels(USE_PDL)
    if EARLY:
        x_first = tl.load(x_ptr + ms[:, None] * stride_xm + first[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            w_first, x_first = w_first.to(tl.float32), x_first.to(tl.float32)
        acc = tl.dot(w_first, tl.trans(x_first), acc, input_precision="ieee")
    for k0 in tl.range(BK if EARLY else 0, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_ptr + n_rows[:, None] * K + cols[None, :])
        x = tl.load(x_ptr + ms[:, None] * stride_xm + cols[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    let_later_kernels_launch(USE_PDL)
    tl.store(out_ptr + ms[None, :] * N + n_rows[:, None], acc.to(out_ptr.dtype.element_ty), mask=m_ok[None, :])


def dot(x, w, out, tile, mode):
    bn, bk, stages, warps = tile
    m, k = x.shape
    n = w.shape[0]
    on_gpu = x.device.type == "cuda"
    pdl = {"USE_PDL": True, "launch_pdl": True} if on_gpu and mode in ("dot_pdl", "dot_early") else {}
    dot_kernel[(n // bn,)](x, w, out, m, n, k, x.stride(0), BN=bn, BK=bk, STAGES=stages, EARLY=mode == "dot_early",
                           UPCAST=x.device.type != "cuda", BM=BM, num_warps=warps, **pdl)  # fmt: skip
    return out


def chain(layers, x, outs, mode):
    """One forward: per layer q/k/v from x, o from q/k/v's first HIDDEN columns, gate/up from o, down from gate/up's
    first INTER columns back into x's buffer."""
    for weights in layers:
        src = x
        for (name, n, k, tile), w, out in zip(PRODUCTS, weights, outs):
            if name == "down":
                out = x
            if mode == "cublas":
                torch.mm(src[:, :k], w.t(), out=out)
            else:
                dot(src[:, :k], w, out, tile, mode)
            src = out
    return x


def make(layers, rows, device, scale=1):
    g = torch.Generator(device=device).manual_seed(0)
    ws = [
        [
            torch.randn(n // scale, k // scale, generator=g, device=device).to(torch.bfloat16) * 0.02
            for _, n, k, _ in PRODUCTS
        ]
        for _ in range(layers)
    ]
    x = torch.randn(rows, HIDDEN // scale, generator=g, device=device).to(torch.bfloat16)
    outs = [torch.empty(rows, n // scale, device=device, dtype=torch.bfloat16) for _, n, _, _ in PRODUCTS]
    return ws, x, outs


def check_cpu() -> None:
    """Each mode's dot equals torch.mm (fp32 sums of bf16 products, tiny shapes under the interpreter)."""
    global PRODUCTS, HIDDEN, INTER
    for mode in ("dot", "dot_early"):
        g = torch.Generator().manual_seed(1)
        for m in (5, 8):
            x = torch.randn(m, 512, generator=g).to(torch.bfloat16)
            w = torch.randn(64, 512, generator=g).to(torch.bfloat16)
            out = torch.empty(m, 64, dtype=torch.bfloat16)
            dot(x, w, out, (16, 128, 2, 4), mode)
            expected = (x.float() @ w.float().t()).to(torch.bfloat16)
            assert (out.float() - expected.float()).abs().max() <= 0.02 * expected.float().abs().max(), mode
    print("dot == mm (bf16 rounding) for", ("dot", "dot_early"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--rows", default="5,8")
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    if args.check_cpu:
        check_cpu()
        return
    from benchmarks import common

    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(torch.cuda.get_device_name(), torch.__version__, "triton", triton.__version__, flush=True)
    print("| rows | layers | " + " | ".join(f"{m} us" for m in MODES) + " | best dot - cublas, per layer |")
    print("| ---: | ---: | " + " | ".join("---:" for _ in MODES) + " | ---: |")
    for rows in (int(r) for r in args.rows.split(",")):
        ws, x, outs = make(args.layers, rows, "cuda")
        us = {}
        for mode in MODES + MODES:  # twice, interleaved: the lower
            value = common.time_fn(lambda: chain(ws, x, outs, mode), "cuda", reps=30, warmup=2)["ms"] * 1e3
            us[mode] = min(us.get(mode, value), value)
        best = min(us[m] for m in MODES if m != "cublas")
        print(f"| {rows} | {args.layers} | " + " | ".join(f"{us[m]:.1f}" for m in MODES)
              + f" | {(best - us['cublas']) / args.layers:+.2f} |", flush=True)  # fmt: skip
        del ws


MODES = ["cublas", "dot", "dot_pdl", "dot_early"]

if __name__ == "__main__":
    main()
