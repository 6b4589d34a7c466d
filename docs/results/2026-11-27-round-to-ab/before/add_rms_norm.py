# ruff: noqa  (kernels/add_rms_norm.py at 4cac85a, op registrations cut: the side-by-side A/B's "before")
"""graphspec::add_rms_norm as a Triton kernel: residual add and RMSNorm in one pass over the row.

Returns (rms_norm(residual + x), residual + x) exactly as graphspec.ops.add_rms_norm_reference: the
sum is rounded to the model dtype first (torch adds two bf16 tensors into bf16), the norm is taken of
that rounded sum in fp32, cast to the dtype, then scaled by the weight in the dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from before.common import cdiv, check_config_table, check_device, round_to
from before.rms_norm import inverse_rms, scale_rows, tile_rows
from torch import Tensor

from graphspec.ops import add_rms_norm_reference

__all__ = ["CONFIGS", "add_rms_norm", "add_rms_norm_reference", "add_rms_norm_triton"]

# tile_elems: elements per program (rows per tile = tile_elems // padded last dim, at least 1).
# CONFIGS[90]: one row per program at the step's widths (2048, 4096), from benchmarks/bench_launch_configs.py
# on an H200 (2026-11-22): 1.8 us (hidden 2048) and 2.2 us (4096) per launch at 1-5 rows; the former
# 8192/8 packed 2-4 rows per program and took 2.9-3.1 us at 2 and 5 rows.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 4096, "num_warps": 8},
    90: {"tile_elems": 2048, "num_warps": 4},
    "default": {"tile_elems": 4096, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def add_rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    total_ptr,
    rows,
    dim,
    eps,
    stride_xr,
    stride_xd,
    stride_rr,
    stride_rd,
    stride_w,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Tile: rows [pid * BLOCK_R, +BLOCK_R) of the [rows, dim] views; columns padded to BLOCK_D.
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_D)
    col_ok = col < dim
    mask = (row < rows)[:, None] & col_ok[None, :]
    # The weight is loaded first: nothing it needs comes from the row, and issued after the reduction
    # (whose barrier the compiler does not move loads across) its memory latency would add to the row's.
    weight = tl.load(weight_ptr + col * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row[:, None] * stride_xr + col[None, :] * stride_xd, mask=mask, other=0.0)
    residual = tl.load(residual_ptr + row[:, None] * stride_rr + col[None, :] * stride_rd, mask=mask, other=0.0)
    # residual + x rounded once to the output dtype (exact fp32 sum of two 16-bit floats, then round).
    dtype = out_ptr.dtype.element_ty
    total = round_to(residual.to(tl.float32) + x.to(tl.float32), dtype)
    out_offsets = row[:, None] * dim + col[None, :]  # both outputs are contiguous [rows, dim]
    tl.store(total_ptr + out_offsets, total.to(dtype), mask=mask)
    out = scale_rows(total, inverse_rms(total, dim, eps), weight[None, :], dtype)  # rms_norm's arithmetic
    tl.store(out_ptr + out_offsets, out.to(dtype), mask=mask)


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(rms_norm(residual + x), residual + x) for x, residual [..., D] and weight [D]."""
    check_device(x, residual, weight)
    dim = x.shape[-1]
    x2, residual2 = x.reshape(-1, dim), residual.reshape(-1, dim)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0:
        return out, total
    block_r, block_d = tile_rows(dim, tile_elems)
    add_rms_norm_kernel[(cdiv(rows, block_r),)](
        x2, residual2, weight, out, total, rows, dim, eps,
        x2.stride(0), x2.stride(1), residual2.stride(0), residual2.stride(1), weight.stride(0),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return out, total
