"""graphspec::offset_rms_norm as a Triton kernel: the zero-centred RMSNorm of the hybrid families
(Qwen3.5, Qwen3-Next), optionally after a residual add (graphspec::add_offset_rms_norm, same kernel).

Rounding is the reference's (graphspec.ops.offset_rms_norm_reference, transformers' Qwen3NextRMSNorm):
normalize in fp32, scale by (1 + weight) in fp32, one rounding to the input dtype. With a residual, the
sum is rounded to the dtype first (torch adds two 16-bit tensors into 16 bits), as the reference's
plain `residual + x`.

Rows are addressed as an [outer, inner, D] view of the input (row_view), so the per-head q/k norms of
a fused projection's strided slice read it in place instead of through a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, round_to
from graphspec.kernels.rms_norm import MAX_DIM, inverse_rms, tile_rows
from torch import Tensor

from graphspec import library
from graphspec.ops import offset_rms_norm_reference

__all__ = ["CONFIGS", "MAX_DIM", "offset_rms_norm", "offset_rms_norm_reference", "offset_rms_norm_triton", "row_view"]

# tile_elems: elements per program (rows per tile = tile_elems // padded last dim, at least 1); rms_norm's
# rows (the same loads and reduction), not tuned for these shapes.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 4096, "num_warps": 8},
    90: {"tile_elems": 4096, "num_warps": 4},
    "default": {"tile_elems": 4096, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def offset_rms_norm_kernel(
    x_ptr,
    residual_ptr,  # read only when HAS_RESIDUAL
    weight_ptr,
    out_ptr,
    total_ptr,  # residual + x, written only when HAS_RESIDUAL
    rows,
    inner,  # rows of the input are [outer, inner] pairs: row r is (r // inner, r % inner)
    dim,
    eps,
    stride_xo,
    stride_xi,
    stride_xd,
    stride_ro,
    stride_ri,
    stride_rd,
    stride_w,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    outer, within = row // inner, row % inner
    col = tl.arange(0, BLOCK_D)
    col_ok = col < dim
    mask = (row < rows)[:, None] & col_ok[None, :]
    # The weight first: its load does not wait behind the row's reduction (rms_norm_kernel's reason).
    scale = 1.0 + tl.load(weight_ptr + col * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    x_rows = outer * stride_xo + within * stride_xi
    hidden = tl.load(x_ptr + x_rows[:, None] + col[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out_offsets = row[:, None] * dim + col[None, :]  # the outputs are contiguous [rows, dim]
    if HAS_RESIDUAL:
        r_rows = outer * stride_ro + within * stride_ri
        residual = tl.load(residual_ptr + r_rows[:, None] + col[None, :] * stride_rd, mask=mask, other=0.0)
        hidden = round_to(residual.to(tl.float32) + hidden, dtype)  # exact fp32 sum, rounded once
        tl.store(total_ptr + out_offsets, hidden.to(dtype), mask=mask)
    out = (hidden * inverse_rms(hidden, dim, eps)[:, None]) * scale[None, :]
    tl.store(out_ptr + out_offsets, round_to(out, dtype).to(dtype), mask=mask)


def row_view(x: Tensor) -> Tensor:
    """x [..., D] as [outer, inner, D]: the last two dims kept apart (a head dim and its heads can have
    any strides), the leading ones collapsed (a view for slices of contiguous tensors, else one copy)."""
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def launch(
    x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, tile_elems: int, num_warps: int
) -> tuple[Tensor, Tensor]:
    """(normed, total) of x (+ residual); total is x's placeholder when there is no residual."""
    check_device(x, weight, *(() if residual is None else (residual,)))
    dim = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    rows = x.numel() // dim if dim else 0
    if rows == 0:
        return out, total
    x3 = row_view(x)
    r3 = row_view(residual) if residual is not None else x3
    block_r, block_d = tile_rows(dim, tile_elems)
    offset_rms_norm_kernel[(cdiv(rows, block_r),)](
        x3, r3, weight, out, total, rows, x3.shape[1], dim, eps,
        x3.stride(0), x3.stride(1), x3.stride(2), r3.stride(0), r3.stride(1), r3.stride(2), weight.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return out, total


def offset_rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """Zero-centred RMSNorm over the last dim of x [..., D] with weight [D] (scaled by 1 + weight)."""
    return launch(x, None, weight, eps, tile_elems, num_warps)[0]


@library.op("graphspec::offset_rms_norm_triton", mutates_args=())
def offset_rms_norm_triton(x: Tensor, weight: Tensor, eps: float, tile_elems: int, num_warps: int) -> Tensor:
    """graphspec::offset_rms_norm lowered to offset_rms_norm_kernel; the trailing ints are CONFIG_FIELDS."""
    return offset_rms_norm(x, weight, eps, tile_elems, num_warps)


@torch.library.register_fake("graphspec::offset_rms_norm_triton")
def _(x, weight, eps, tile_elems, num_warps):
    return x.new_empty(x.shape)
