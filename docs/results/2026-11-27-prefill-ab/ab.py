# ruff: noqa  (the script as run, kept with its results; its kernels now taken from git)
"""Side by side on one GPU, per layer, CUDA graphs, bf16:
- prefill attention: fd14864's kernel (its block's K/V stored from the diagonal loop) against 4cac85a's, both
  taken from git (../2026-11-27-round-to-ab/before.py); run 1 (ab_run1.log) had the scale folded into the exp2
  argument too, a variant never committed;
- silu_mul at prefill sizes: the package kernel against two probe variants of it: its two roundings
  through the hardware conversion (cvt.rn, bit-identical on the GPU), and that plus exp2.approx and an
  approximate divide (not bit-identical: how much the exact math costs).

    python docs/results/2026-11-27-prefill-ab/ab.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[2])]
sys.path.insert(0, str(HERE.parent / "2026-11-27-round-to-ab"))
import before as before_at  # noqa: E402

before = before_at.load("4cac85a", ["common", "prefill_attention"])["prefill_attention"]
_now = before_at.load("fd14864", ["common", "prefill_attention", "silu_mul"])
prefill_attention, silu_mul, round_to = _now["prefill_attention"], _now["silu_mul"], _now["common"].round_to

from benchmarks import common  # noqa: E402


@triton.jit
def silu_mul_probe(x_ptr, out_ptr, rows, inter, col_blocks, stride_xr,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, FAST_MATH: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    row = (pid // col_blocks).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (row < rows)[:, None] & (col < inter)[None, :]
    gate_ptr = x_ptr + row[:, None] * stride_xr + col[None, :]
    gate = tl.load(gate_ptr, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptr + inter, mask=mask, other=0.0).to(tl.float32)
    if FAST_MATH:
        silu = (gate / (1.0 + tl.exp(-gate))).to(tl.bfloat16).to(tl.float32)
    else:
        silu = tl.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + row[:, None] * inter + col[None, :], (silu * up).to(tl.bfloat16), mask=mask)


@triton.jit
def round_probe(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, round_to(x, tl.bfloat16).to(tl.bfloat16), mask=offs < n)


def attention_rows() -> None:
    print("\nprefill attention, per layer (ms): before (4cac85a) / now")
    for name, hq, hkv, d, prefix, t, rows in (
        ("8B heads, 4096", 32, 8, 128, 0, 4096, 1),
        ("8B heads, 2048", 32, 8, 128, 0, 2048, 1),
        ("8B heads, 512 after 3584", 32, 8, 128, 3584, 512, 1),
        ("8B heads, 512 x 8 rows", 32, 8, 128, 0, 512, 8),
        ("1B heads, 4096", 32, 8, 64, 0, 4096, 1),
        ("Qwen3.5 x256, 4096", 16, 4, 256, 0, 4096, 1),
    ):
        qkv = torch.randn(rows, t, (hq + 2 * hkv) * d, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.view(rows, t, hq + 2 * hkv, d).transpose(1, 2).split((hq, hkv, hkv), dim=1)
        cache = torch.randn(1, 2, rows, hkv, prefix + t, d, device="cuda", dtype=torch.bfloat16)
        slots = torch.arange(rows, device="cuda")
        start = torch.full((rows,), prefix, device="cuda")
        row = prefill_attention.CONFIGS[(90, "head_dim_256") if d == 256 else 90]
        args = (q, k, v, cache, 0, slots, start, d**-0.5, *row.values())
        cache_a, cache_b = cache.clone(), cache.clone()
        out_a = before.prefill_attention(q, k, v, cache_a, *args[4:])
        out_b = prefill_attention.prefill_attention(q, k, v, cache_b, *args[4:])
        same_cache = torch.equal(cache_a, cache_b)
        diff = ((out_a.float() - out_b.float()).norm() / out_a.float().norm()).item()
        times = []
        for module in (before, prefill_attention, before, prefill_attention):
            times.append(common.time_fn(lambda m=module: m.prefill_attention(*args), "cuda", reps=30)["ms"])
        print(
            f"  {name:28} {min(times[0::2]):.4f} / {min(times[1::2]):.4f}  "
            f"(runs {' '.join(f'{x:.4f}' for x in times)}; caches equal {same_cache}; outputs rel diff {diff:.1e})"
        )


def silu_rows() -> None:
    print("\nsilu_mul (ms): package / cvt roundings (exact) / fast math (inexact), bytes floor at 4.8 TB/s")
    for rows, inter in ((4096, 14336), (4096, 8192), (512, 14336)):
        gate_up = torch.randn(rows, 2 * inter, device="cuda", dtype=torch.bfloat16) * 4
        config = silu_mul.CONFIGS[(90, "many_rows") if rows >= silu_mul.MANY_ROWS else 90]
        block_r, block_c = silu_mul.tile_shape(inter, config["tile_elems"])
        col_blocks = triton.cdiv(inter, block_c)
        outs = {}

        def probe(fast: bool, gate_up=gate_up, inter=inter, block_r=block_r, block_c=block_c, col_blocks=col_blocks):
            out = torch.empty(gate_up.shape[0], inter, device="cuda", dtype=torch.bfloat16)
            silu_mul_probe[(triton.cdiv(gate_up.shape[0], block_r) * col_blocks,)](
                gate_up, out, gate_up.shape[0], inter, col_blocks, gate_up.stride(0),
                BLOCK_R=block_r, BLOCK_C=block_c, FAST_MATH=fast, num_warps=config["num_warps"],
            )  # fmt: skip
            return out

        fns = {
            "package": lambda gate_up=gate_up, config=config: silu_mul.silu_mul(gate_up, *config.values()),
            "cvt": lambda: probe(False),
            "fast": lambda: probe(True),
        }
        for label, fn in fns.items():
            outs[label] = fn()
        reference = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        ms = {label: min(common.time_fn(fn, "cuda", reps=30)["ms"] for _ in range(2)) for label, fn in fns.items()}
        floor = 3 * rows * inter * 2 / 4.8e9
        mismatches = {label: int((out != reference).sum()) for label, out in outs.items()}
        print(
            f"  {rows} x {inter}: {ms['package']:.4f} / {ms['cvt']:.4f} / {ms['fast']:.4f}  floor {floor:.4f}  "
            f"elements unequal to torch: {mismatches}"
        )


def round_check() -> None:
    """round_to against the hardware conversion on every fp32 bit pattern class that matters."""
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 24,), device="cuda", dtype=torch.int32)
    x = bits.view(torch.float32)
    out = torch.empty(x.shape, device="cuda", dtype=torch.bfloat16)
    round_probe[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    hw = x.to(torch.bfloat16)
    same = (out.view(torch.int16) == hw.view(torch.int16)) | (out.isnan() & hw.isnan())
    print(f"\nround_to vs torch's fp32 -> bf16 on {x.numel()} random bit patterns: {int((~same).sum())} differ")


def main() -> int:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    attention_rows()
    silu_rows()
    round_check()
    return 0


if __name__ == "__main__":
    sys.exit(main())
