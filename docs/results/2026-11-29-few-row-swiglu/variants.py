# ruff: noqa  (a probe, kept with its results)
"""Probe 2 (issue 16, 2026-11-29 23:18 UTC): why the first few-row fused SwiGLU kernel ran at half the probe's dot rate
(8B gate/up at 5 rows: 110 us against cuBLAS + scaled_silu_mul's 60.7; run/probe.log). Variants of one kernel:
SQ: x's squares for the row scale 0 = none (scale 1: timing only), 1 = elementwise [16, BK] (the first kernel's), 2 =
the diagonal of an x @ x^T dot, 3 = the same from a second load of x (its own buffer), 4 = a loop over x before the
main loop; JOIN: gate and up rows interleaved in one [2 BN, BK] weight tile and one dot (split
after), else two [BN, BK] tiles and two dots; PEEL: the first weight tile loaded before the loop (PDL's early tile).

    python docs/results/2026-11-29-few-row-swiglu/variants.py
    TRITON_INTERPRET=1 python docs/results/2026-11-29-few-row-swiglu/variants.py --check-cpu
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from graphspec import ops


@triton.jit
def variant_kernel(
    x_ptr, w_ptr, out_ptr, M, inter, K, eps,
    BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, SQ: tl.constexpr, JOIN: tl.constexpr,
    PEEL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    ms = tl.arange(0, 16)
    m_ok = ms < M
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * K
    if JOIN:
        i = tl.arange(0, 2 * BN)
        n = pid * BN + i // 2
        w_rows = w_ptr + (n + (i % 2) * inter).to(tl.int64)[:, None] * K
        acc = tl.zeros((2 * BN, 16), tl.float32)
    else:
        rows = pid * BN + tl.arange(0, BN)
        gate_rows = w_ptr + rows.to(tl.int64)[:, None] * K
        up_rows = gate_rows + inter.to(tl.int64) * K
        acc_g = tl.zeros((BN, 16), tl.float32)
        acc_u = tl.zeros((BN, 16), tl.float32)
    sq_e = tl.zeros((16, BK), tl.float32)
    sq_d = tl.zeros((16, 16), tl.float32)
    start = 0
    if SQ == 4:
        for k0 in tl.range(0, K, 512):
            xcols = k0 + tl.arange(0, 512)
            xs = tl.load(x_rows + xcols[None, :], mask=m_ok[:, None] & (xcols < K)[None, :], other=0.0).to(tl.float32)
            sq_e2 = tl.sum(xs * xs, 1)
            sq_d += tl.where(ms[:, None] == ms[None, :], sq_e2[:, None], 0.0)
    if PEEL:
        cols = tl.arange(0, BK)
        w = tl.load(w_rows + cols[None, :])
        x = tl.load(x_rows + cols[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        if SQ == 1:
            sq_e += x.to(tl.float32) * x.to(tl.float32)
        if SQ == 2 or SQ == 3:
            sq_d = tl.dot(x, tl.trans(x), sq_d, input_precision="ieee")
        start = BK
    for k0 in tl.range(start, K, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + cols[None, :], mask=m_ok[:, None], other=0.0)
        if UPCAST:
            x = x.to(tl.float32)
        if JOIN:
            w = tl.load(w_rows + cols[None, :])
            if UPCAST:
                w = w.to(tl.float32)
            acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee")
        else:
            g = tl.load(gate_rows + cols[None, :])
            u = tl.load(up_rows + cols[None, :])
            if UPCAST:
                g, u = g.to(tl.float32), u.to(tl.float32)
            acc_g = tl.dot(g, tl.trans(x), acc_g, input_precision="ieee")
            acc_u = tl.dot(u, tl.trans(x), acc_u, input_precision="ieee")
        if SQ == 1:
            sq_e += x.to(tl.float32) * x.to(tl.float32)
        if SQ == 2:
            sq_d = tl.dot(x, tl.trans(x), sq_d, input_precision="ieee")
        if SQ == 3:
            x2 = tl.load(x_rows + cols[None, :], mask=m_ok[:, None], other=0.0, cache_modifier=".cg")
            if UPCAST:
                x2 = x2.to(tl.float32)
            sq_d = tl.dot(x2, tl.trans(x2), sq_d, input_precision="ieee")
    if SQ == 1:
        ss = tl.sum(sq_e, 1)
    elif SQ >= 2:
        ss = tl.sum(tl.where(ms[:, None] == ms[None, :], sq_d, 0.0), 1)
    else:
        ss = tl.full((16,), 1.0, tl.float32) * K
    scale = tl.rsqrt(ss / K + eps)[None, :]
    if JOIN:
        gate, up = tl.split(tl.permute(tl.reshape(acc, (BN, 2, 16)), (0, 2, 1)))
        rows = pid * BN + tl.arange(0, BN)
    else:
        gate, up = acc_g, acc_u
    dtype = out_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32) * scale
    up = up.to(dtype).to(tl.float32) * scale
    out = tl.div_rn(gate, 1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + ms.to(tl.int64)[None, :] * inter + rows[:, None], out.to(dtype), mask=m_ok[None, :])


def launch(x, w, out, bn, bk, stages, warps, sq, join, peel):
    inter = w.shape[0] // 2
    variant_kernel[(inter // bn,)](
        x, w, out, x.shape[0], inter, x.shape[1], 1e-5, BN=bn, BK=bk, STAGES=stages, SQ=sq, JOIN=join, PEEL=peel,
        UPCAST=os.environ.get("TRITON_INTERPRET") == "1", num_warps=warps,
    )  # fmt: skip
    return out


VARIANTS = [  # bn, bk, stages, warps, sq, join, peel
    (32, 128, 4, 4, 0, 1, 0),
    (32, 128, 4, 4, 2, 1, 0),
    (32, 128, 4, 4, 3, 1, 0),
    (32, 128, 3, 4, 3, 1, 0),
    (32, 256, 3, 4, 3, 1, 0),
    (32, 128, 4, 4, 4, 1, 0),
    (32, 128, 3, 4, 4, 1, 0),
    (32, 256, 3, 4, 4, 1, 0),
    (32, 128, 4, 4, 3, 1, 1),
    (32, 128, 4, 4, 4, 1, 1),
]
REPEATS = 20  # launches whose outputs must be bitwise equal (a race would show as run-to-run differences)


def check_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    for m in (2, 5):
        x = (torch.randn(m, 256, generator=g) * 3).to(torch.bfloat16)
        w = (torch.randn(128, 256, generator=g) / 16).to(torch.bfloat16)
        exact = ops.scaled_silu_mul_linear_reference(x.double(), w.double().t(), 1e-5)
        for v in VARIANTS:
            if v[4] == 0 or v[0] * 2 > 64:
                continue
            out = launch(x, w, torch.empty(m, 64, dtype=torch.bfloat16), *v[:4], *v[4:])
            err = ((out.double() - exact).norm() / exact.norm()).item()
            print(m, v, f"{err:.1e}")
            assert err < 1e-2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    if parser.parse_args().check_cpu:
        check_cpu()
        return
    from benchmarks import common
    from benchmarks.bench_linear import ROTATE_BYTES, projections, timed_us
    from graphspec.kernels import scaled_silu_mul as unfused

    swiglu = unfused.CONFIGS[90]
    print(f"{common.device_name('cuda')}, copy {common.measure_copy_bandwidth('cuda')['gb_s']:.0f} GB/s")
    for model in ("llama-8b", "llama-1b"):
        n, k = projections(model)["gate_up"]
        copies = max(2, -(-ROTATE_BYTES // (n * k * 2)))
        weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(copies)]
        for m in (2, 5, 16):
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda") * 3
            exact = ops.scaled_silu_mul_linear_reference(x.double(), weights[0].double().t(), 1e-5)
            cublas = timed_us(
                lambda: [
                    unfused.scaled_silu_mul(x @ w.t(), x, 1e-5, swiglu["tile_elems"], swiglu["num_warps"])
                    for w in weights
                ],
                copies,
            )
            parts = [f"cublas+swiglu {cublas:.1f}"]
            out = torch.empty(m, n // 2, dtype=torch.bfloat16, device="cuda")
            for v in VARIANTS:
                try:
                    got = launch(x, weights[0], out, *v).clone()
                    err = ((got.double() - exact).norm() / exact.norm()).item()
                    same = all(torch.equal(launch(x, weights[0], out, *v), got) for _ in range(REPEATS))
                    us = timed_us(lambda: [launch(x, w, out, *v) for w in weights], copies)
                    parts.append(
                        "{}x{}s{}w{} sq{} join{} peel{}".format(*v)
                        + f" {us:.1f} (err {err:.1e}{'' if same else ', VARIES'})"
                    )
                except Exception as failure:
                    parts.append(f"{v}: {type(failure).__name__} {str(failure)[:80]}")
            print(f"{model} M={m}: " + "; ".join(parts), flush=True)
        weights.clear()


if __name__ == "__main__":
    main()
