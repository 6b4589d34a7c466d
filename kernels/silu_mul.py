"""graphspec::silu_mul as a Triton kernel: SwiGLU silu(gate) * up of a fused gate/up projection.

Rounding is the reference's (graphspec.ops.silu_mul_reference: F.silu(gate) * up in the input dtype):
torch's CUDA silu computes x / (1 + exp(-x)) in fp32 (expf, IEEE divide) and rounds to the dtype; the
multiply by up is one rounding of the exact fp32 product (two bf16/fp16 significands fit in fp32). The
kernel does the same steps with libdevice's expf and div_rn, so 16-bit outputs are bit-identical to
torch on the GPU. Under the interpreter exp is numpy's, an fp32 ulp away from torch's CPU exp now and
then, so CPU results can differ from torch's CPU silu by one 16-bit ulp in rare elements.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, interpreting, next_power_of_2, round_to
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library
from graphspec.ops import silu_mul_reference

__all__ = ["CONFIGS", "row_count", "shape_class", "silu_mul", "silu_mul_reference", "silu_mul_triton", "tile_shape"]

# tile_elems: outputs per program: BLOCK_C = min(tile_elems, padded I) columns x tile_elems // BLOCK_C rows.
# CONFIGS[90] from benchmarks/bench_launch_configs.py on an H200 (2026-11-22): 512 outputs per program
# took 1.4-1.5 us per launch at I 8192 and 14336, 1-5 rows (1024: 1.6 us). 80 and default are untuned.
# (90, "many_rows"): prefill chunks of MANY_ROWS rows or more, from `benchmarks/bench_prefill_kernels.py
# --sweep` on an H200 (2026-11-27, 466fc1d; 2048 outputs per program against 512: 0.108 against 0.119 ms at
# 4096 x 14336, 0.018 against 0.021 ms at 512 x 14336).
CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    80: {"tile_elems": 1024, "num_warps": 4},
    90: {"tile_elems": 512, "num_warps": 4},
    (90, "many_rows"): {"tile_elems": 2048, "num_warps": 4},
    "default": {"tile_elems": 1024, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MANY_ROWS = 512
SCALE_BLOCK = 2048  # elements of the scale row summed per iteration (graphspec::scaled_silu_mul)


def row_count(gate_up: Tensor) -> int:
    """Rows of gate_up [..., 2I]: the product of its leading dims."""
    return gate_up.numel() // max(1, gate_up.shape[-1]) if gate_up.dim() else 1


def shape_class(gate_up: Tensor, *_: object) -> str | None:
    """The config row's shape class (lowering/registry.py): a prefill chunk's many rows take wider tiles."""
    return "many_rows" if row_count(gate_up) >= MANY_ROWS else None


@triton.jit
def silu_mul_kernel(
    x_ptr,
    out_ptr,
    h_ptr,  # HAS_SCALE: the rows [rows, hidden] gate_up projects, whose RMSNorm row scale multiplies gate and up
    rows,
    inter,  # I: gate is columns [0, I) of a row, up columns [I, 2I)
    col_blocks,
    stride_xr,
    stride_xc,
    hidden,
    stride_hr,
    eps,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    pid = tl.program_id(0)
    row = (pid // col_blocks).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = (pid % col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (row < rows)[:, None] & (col < inter)[None, :]
    gate_ptr = x_ptr + row[:, None] * stride_xr + col[None, :] * stride_xc
    gate = tl.load(gate_ptr, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptr + inter * stride_xc, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    if HAS_SCALE:  # graphspec::scaled_silu_mul: r = rsqrt(mean(h^2) + eps), every program reads its rows whole
        squares = tl.zeros([BLOCK_R], tl.float32)
        for start in range(0, hidden, BLOCK_H):  # a fixed order for a given hidden size: row-invariant
            cols = start + tl.arange(0, BLOCK_H)
            h_mask = (row < rows)[:, None] & (cols < hidden)[None, :]
            h = tl.load(h_ptr + row[:, None] * stride_hr + cols[None, :], mask=h_mask, other=0.0).to(tl.float32)
            squares += tl.sum(h * h, axis=1)
        scale = tl.rsqrt(squares / hidden + eps)[:, None]
        gate, up = gate * scale, up * scale
    if LIBDEVICE_EXP:  # __nv_expf, what torch's CUDA silu calls (tl.exp is ex2.approx-based)
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice
        e = tl.exp(-gate)
    if HAS_SCALE:  # the reference's fp32 silu and product, one rounding
        out = tl.div_rn(gate, 1.0 + e) * up
    else:
        silu = round_to(tl.div_rn(gate, 1.0 + e), dtype)  # torch's silu: fp32 math, one rounding
        out = round_to(silu * up, dtype)  # exact product, rounded once, as torch's 16-bit multiply
    tl.store(out_ptr + row[:, None] * inter + col[None, :], out.to(dtype), mask=mask)


def tile_shape(inter: int, tile_elems: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_C) for I = `inter`: columns up to tile_elems (a power of 2), rows fill the rest."""
    tile = next_power_of_2(tile_elems)  # tl.arange needs powers of 2
    block_c = min(next_power_of_2(inter), tile)
    return tile // block_c, block_c


def silu_mul(
    gate_up: Tensor,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    scale_of: Tensor | None = None,
    eps: float = 0.0,
) -> Tensor:
    """silu(gate) * up of gate_up [..., 2I] (any strides); a new contiguous [..., I] of its dtype. With
    scale_of [..., H] (contiguous rows): gate and up first multiplied by its rows' rsqrt(mean(x^2) + eps)."""
    check_device(gate_up)
    width = gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"silu_mul kernel: last dim {width} of gate_up is odd")
    inter = width // 2
    out = torch.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype, device=gate_up.device)
    x2 = gate_up.reshape(-1, width)  # a view when the leading dims collapse (any row stride), else a copy
    rows = x2.shape[0]
    h2 = x2 if scale_of is None else scale_of.reshape(-1, scale_of.shape[-1])
    if scale_of is not None and (h2.shape[0] != rows or h2.stride(-1) != 1):
        raise ValueError(f"scaled silu_mul kernel: scale_of {list(scale_of.shape)} is not {rows} unit-stride rows")
    if rows == 0 or inter == 0:
        return out
    block_r, block_c = tile_shape(inter, tile_elems)
    col_blocks = cdiv(inter, block_c)
    hidden = h2.shape[-1]
    silu_mul_kernel[(cdiv(rows, block_r) * col_blocks,)](
        x2, out, h2, rows, inter, col_blocks, x2.stride(0), x2.stride(1), hidden, h2.stride(0), eps,
        BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_H=min(next_power_of_2(hidden), SCALE_BLOCK),
        HAS_SCALE=scale_of is not None, LIBDEVICE_EXP=not interpreting(), num_warps=num_warps,
    )  # fmt: skip
    return out


@library.op("graphspec::silu_mul_triton", mutates_args=())
def silu_mul_triton(gate_up: Tensor, tile_elems: int, num_warps: int) -> Tensor:
    """graphspec::silu_mul lowered to silu_mul_kernel; the trailing ints are CONFIG_FIELDS."""
    return silu_mul(gate_up, tile_elems, num_warps)


@torch.library.register_fake("graphspec::silu_mul_triton")
def _(gate_up, tile_elems, num_warps):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))
