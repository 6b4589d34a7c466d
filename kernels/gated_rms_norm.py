"""graphspec::gated_rms_norm as a Triton kernel: the Gated DeltaNet's output norm, RMSNorm of x scaled by
the weight, times silu(gate), in one pass over each head's row.

Rounding is the reference's (graphspec.ops.gated_rms_norm_reference, transformers' Qwen3NextRMSNormGated):
normalize in fp32 and round to the dtype, scale by the weight in the dtype (one rounding of the exact
product), multiply by silu(gate) computed in fp32, one last rounding. silu is x / (1 + exp(-x)) with
libdevice's expf and an IEEE divide, as torch's CUDA silu (numpy's exp under the interpreter).
Rows of x and of the gate are addressed as [outer, inner, D] views (offset_rms_norm.row_view): the gate
is a strided slice of the fused input projection and is read in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, interpreting, round_to
from graphspec.kernels.offset_rms_norm import row_view
from graphspec.kernels.rms_norm import MAX_DIM, inverse_rms, tile_rows
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library
from graphspec.ops import gated_rms_norm_reference

__all__ = ["CONFIGS", "MAX_DIM", "gated_rms_norm", "gated_rms_norm_reference", "gated_rms_norm_triton"]

# tile_elems: elements per program (rows per tile = tile_elems // padded head dim); untuned.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 2048, "num_warps": 4},
    90: {"tile_elems": 2048, "num_warps": 4},
    "default": {"tile_elems": 2048, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def gated_rms_norm_kernel(
    x_ptr,
    gate_ptr,
    weight_ptr,
    out_ptr,
    rows,
    inner,  # row r is (r // inner, r % inner) of the [outer, inner, D] views
    dim,
    eps,
    stride_xo,
    stride_xi,
    stride_xd,
    stride_go,
    stride_gi,
    stride_gd,
    stride_w,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    outer, within = row // inner, row % inner
    col = tl.arange(0, BLOCK_D)
    col_ok = col < dim
    mask = (row < rows)[:, None] & col_ok[None, :]
    weight = tl.load(weight_ptr + col * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    x_rows = outer * stride_xo + within * stride_xi
    hidden = tl.load(x_ptr + x_rows[:, None] + col[None, :] * stride_xd, mask=mask, other=0.0).to(tl.float32)
    g_rows = outer * stride_go + within * stride_gi
    gate = tl.load(gate_ptr + g_rows[:, None] + col[None, :] * stride_gd, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    normed = round_to(hidden * inverse_rms(hidden, dim, eps)[:, None], dtype)
    scaled = round_to(weight[None, :] * normed, dtype)
    if LIBDEVICE_EXP:  # __nv_expf, what torch's CUDA silu calls
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice
        e = tl.exp(-gate)
    out = round_to(scaled * tl.div_rn(gate, 1.0 + e), dtype)
    tl.store(out_ptr + row[:, None] * dim + col[None, :], out.to(dtype), mask=mask)


def gated_rms_norm(
    x: Tensor,
    gate: Tensor,
    weight: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """RMSNorm of x [..., D] scaled by weight [D], times silu(gate [..., D]); a new contiguous tensor."""
    check_device(x, gate, weight)
    if gate.shape != x.shape:
        raise ValueError(f"gated_rms_norm kernel: gate {tuple(gate.shape)} is not x's shape {tuple(x.shape)}")
    dim = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x.numel() // dim if dim else 0
    if rows == 0:
        return out
    x3, g3 = row_view(x), row_view(gate)
    block_r, block_d = tile_rows(dim, tile_elems)
    gated_rms_norm_kernel[(cdiv(rows, block_r),)](
        x3, g3, weight, out, rows, x3.shape[1], dim, eps,
        x3.stride(0), x3.stride(1), x3.stride(2), g3.stride(0), g3.stride(1), g3.stride(2), weight.stride(0),
        BLOCK_R=block_r, BLOCK_D=block_d, LIBDEVICE_EXP=not interpreting(), num_warps=num_warps,
    )  # fmt: skip
    return out


@library.op("graphspec::gated_rms_norm_triton", mutates_args=())
def gated_rms_norm_triton(
    x: Tensor, gate: Tensor, weight: Tensor, eps: float, tile_elems: int, num_warps: int
) -> Tensor:
    """graphspec::gated_rms_norm lowered to gated_rms_norm_kernel; the trailing ints are CONFIG_FIELDS."""
    return gated_rms_norm(x, gate, weight, eps, tile_elems, num_warps)


@torch.library.register_fake("graphspec::gated_rms_norm_triton")
def _(x, gate, weight, eps, tile_elems, num_warps):
    return x.new_empty(x.shape)
