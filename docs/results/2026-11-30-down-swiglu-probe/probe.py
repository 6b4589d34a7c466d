# ruff: noqa  (a probe: measures one idea, not part of the package)
"""Probe (issue 16, 2026-11-30; results in README.md: 4-19x slower, not kept): the folded MLP's scaled SwiGLU as the down projection's prologue.

A K = 4 verify at batch 1 runs each layer's MLP as three launches: the gate/up product (the tensor-core few-row
kernel, plain launch), graphspec::scaled_silu_mul (2.6 us a launch at 5 rows, docs/results/2026-11-30-verify-dot-pdl
profile: 82 us a verify), the down product adding into the residual in place. The fused gate/up + SwiGLU (one kernel
streaming gate and up rows) was measured slower (docs/results/2026-11-29-few-row-swiglu: the squares and the two dots
cost the dot rate). Here the SwiGLU moves to the other side: the down kernel reads the gate/up rows (from L2, a few KB
a step) and computes silu(r g) (r u), rounded once as scaled_silu_mul does, into the dot's operand; r (the row scale
of the folded post-attention norm) from the residual rows in a loop before the K loop. The output goes to another
buffer (the residual cannot be added into in place: other programs still read it for r).

Times L layers of the MLP as one CUDA graph, each chain on graphspec's own kernels and config rows:
  three      gate/up (gemv, its class's sm_90 row) -> scaled_silu_mul kernel -> down (gemv, in place)
  fused      gate/up (the same) -> this probe's down with the SwiGLU prologue (one tile per run, TILES)
and checks fused's output against three's (max abs difference; equal bits expected where r is summed in the same
order, else within a bf16 ulp of the activations).

    python docs/results/2026-11-30-down-swiglu-probe/probe.py            # H200: 8B at 2 and 5 rows, 1B at 2 and 5
    TRITON_INTERPRET=1 python docs/results/2026-11-30-down-swiglu-probe/probe.py --check-cpu
    TRITON_INTERPRET=1 python docs/results/2026-11-30-down-swiglu-probe/probe.py --dry-cpu  # main's flow, tiny
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from graphspec.ops import scaled_silu_mul_reference  # noqa: E402

EPS = 1e-5
MODELS = {"llama-8b": (4096, 14336, 32), "llama-1b": (2048, 8192, 16)}  # hidden, intermediate, layers
TILES = [(32, 256, 4, 4), (32, 128, 4, 4), (32, 128, 6, 4), (16, 256, 4, 4), (32, 256, 3, 8)]  # BN, BK, stages, warps


@triton.jit
def down_swiglu_kernel(
    gu_ptr, res_ptr, w_ptr, out_ptr, M, N, I, eps,
    BN: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr, STAGES: tl.constexpr, LIBDEVICE_EXP: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    # out[m, n] = res[m, n] + sum_k a[m, k] w[n, k], a = silu(r g) (r u) rounded to the dtype, g / u = gu[m, k] /
    # gu[m, I + k], r = rsqrt(mean(res[m, :]^2) + eps). N = hidden (w's rows), I = intermediate (its columns).
    rows = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
    ms = tl.arange(0, 16)
    m_ok = ms < M
    squares = tl.zeros((16,), tl.float32)
    for h0 in range(0, N, BH):  # scaled_silu_mul's order: BH-wide chunks, each summed, then added
        cols = h0 + tl.arange(0, BH)
        h = tl.load(res_ptr + ms[:, None] * N + cols[None, :], mask=m_ok[:, None] & (cols < N)[None, :], other=0.0)
        h = h.to(tl.float32)
        squares += tl.sum(h * h, axis=1)
    scale = tl.rsqrt(squares / N + eps)[:, None]
    addend = tl.load(res_ptr + ms[None, :] * N + rows[:, None], mask=m_ok[None, :], other=0.0)
    dtype = out_ptr.dtype.element_ty
    w_rows = w_ptr + rows[:, None] * I
    gu_rows = gu_ptr + ms[:, None] * (2 * I)
    acc = tl.zeros((BN, 16), tl.float32)
    for k0 in tl.range(0, I, BK, num_stages=STAGES):
        cols = k0 + tl.arange(0, BK)
        w = tl.load(w_rows + cols[None, :])
        gate = tl.load(gu_rows + cols[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32) * scale
        up = tl.load(gu_rows + I + cols[None, :], mask=m_ok[:, None], other=0.0).to(tl.float32) * scale
        if LIBDEVICE_EXP:
            e = libdevice.exp(-gate)
        else:
            e = tl.exp(-gate)
        act = (tl.div_rn(gate, 1.0 + e) * up).to(dtype)
        if UPCAST:  # the interpreter's tl.dot on 16-bit operands is wrong (kernels/gemv.py's HACK)
            w, act = w.to(tl.float32), act.to(tl.float32)
        acc = tl.dot(w, tl.trans(act), acc, input_precision="ieee" if UPCAST else "tf32")
    acc += addend.to(tl.float32)
    tl.store(out_ptr + ms[None, :] * N + rows[:, None], acc.to(dtype), mask=m_ok[None, :])


def down_swiglu(gate_up, res, w_down, out, tile, scale_block=2048):
    bn, bk, stages, warps = tile
    m, n = res.shape
    inter = w_down.shape[1]
    assert n % bn == 0 and inter % bk == 0 and gate_up.shape == (m, 2 * inter) and m <= 16
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    down_swiglu_kernel[(n // bn,)](
        gate_up, res, w_down, out, m, n, inter, EPS, BN=bn, BK=bk, BH=scale_block, STAGES=stages,
        LIBDEVICE_EXP=not interpret, UPCAST=interpret, num_warps=warps,
    )  # fmt: skip
    return out


def reference(gate_up, res, w_down):
    act = scaled_silu_mul_reference(gate_up, res, EPS)
    return (res.float() + act.float() @ w_down.float().t()).to(res.dtype)


def check_cpu() -> None:
    """The kernel against the reference (fp32 sums of the rounded activations), tiny shapes under the interpreter."""
    g = torch.Generator().manual_seed(0)
    for m in (2, 5):
        for dtype in (torch.float32, torch.bfloat16):
            hidden, inter = 64, 256
            res = (torch.randn(m, hidden, generator=g) * 3).to(dtype)
            gate_up = torch.randn(m, 2 * inter, generator=g).to(dtype)
            w = (torch.randn(hidden, inter, generator=g) / inter**0.5).to(dtype)
            out = down_swiglu(gate_up, res, w, torch.empty_like(res), (32, 128, 2, 4))
            want = reference(gate_up, res, w)
            diff = (out.float() - want.float()).abs().max().item()
            tol = 1e-4 if dtype == torch.float32 else 2**-6 * want.float().abs().max().item()
            print(f"m={m} {dtype}: max |diff| {diff:.2e} (tolerance {tol:.1e})")
            assert diff <= tol, diff
    print("check-cpu: OK")


def main(device: str = "cuda", models: dict = MODELS, tiles: list = TILES, scale_block: int = 2048) -> None:
    from benchmarks import common
    from graphspec.kernels import gemv
    from graphspec.kernels import scaled_silu_mul as ssm

    print(f"{common.device_name(device)}, copy {common.measure_copy_bandwidth(device)['gb_s']:.0f} GB/s")
    swiglu = ssm.CONFIGS[90]

    def product(x, w, addend=None, out=None):  # graphspec's GEMV/dot kernels with the row the registry would pick
        klass = gemv.shape_class(x, w.t(), addend)
        assert klass is not None, (x.shape, w.shape)
        config = gemv.CLASS_CONFIGS[klass][90]
        fields = {key: config[key] for key in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
        return gemv.gemv(x, w.t(), addend, out, **fields), klass

    for model, (hidden, inter, layers) in models.items():
        g = torch.Generator(device=device).manual_seed(0)
        weights = [
            (
                torch.randn(2 * inter, hidden, generator=g, device=device).to(torch.bfloat16) / hidden**0.5,
                torch.randn(hidden, inter, generator=g, device=device).to(torch.bfloat16) / inter**0.5,
            )
            for _ in range(layers)
        ]
        for m in (2, 5):
            start = torch.randn(m, hidden, generator=g, device=device).to(torch.bfloat16)
            res = start.clone()
            buffers = [torch.empty_like(res), torch.empty_like(res)]
            classes = set()

            def three():
                for w_gu, w_down in weights:
                    gate_up, klass = product(res, w_gu)
                    act = ssm.scaled_silu_mul(gate_up, res, EPS, swiglu["tile_elems"], swiglu["num_warps"])
                    _, down_class = product(act, w_down, res, res)
                    classes.update((klass, down_class))
                return res

            def fused(tile):
                src = res
                for i, (w_gu, w_down) in enumerate(weights):
                    gate_up, _ = product(src, w_gu)
                    src = down_swiglu(gate_up, src, w_down, buffers[i % 2], tile, scale_block)
                return src

            res.copy_(start)
            want = three().clone()
            base = common.time_fn(three, device, reps=30, warmup=2)["ms"] * 1e3 / layers
            line = [f"three {base:.2f} us/layer ({'+'.join(sorted(classes))})"]
            for tile in tiles:
                res.copy_(start)
                got = fused(tile)
                diff = (got.float() - want.float()).abs().max().item()
                res.copy_(start)
                us = common.time_fn(lambda: fused(tile), device, reps=30, warmup=2)["ms"] * 1e3 / layers
                line.append("fused {}x{} s{} w{}: {:.2f} (max diff {:.1e})".format(*tile, us, diff))
            print(f"{model} M={m}: " + "; ".join(line), flush=True)
        weights.clear()
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-cpu", action="store_true")
    parser.add_argument("--dry-cpu", action="store_true", help="main's chains at tiny shapes on the CPU (interpreter)")
    parser.add_argument("--scale-block", type=int, default=2048, help="columns of x a step of the row-scale loop")
    parser.add_argument("--tiles", default="", help="BNxBKsSTAGESwWARPS,... (default: TILES)")
    args = parser.parse_args()
    tiles = TILES
    if args.tiles:
        tiles = [
            tuple(int(v) for v in t.replace("x", " ").replace("s", " ").replace("w", " ").split())
            for t in args.tiles.split(",")
        ]
    if args.check_cpu:
        check_cpu()
    elif args.dry_cpu:
        main("cpu", {"tiny": (64, 256, 2)}, [(32, 128, 2, 4)])
    else:
        main(tiles=tiles, scale_block=args.scale_block)
