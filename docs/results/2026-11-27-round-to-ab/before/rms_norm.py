# ruff: noqa  (kernels/rms_norm.py at 4cac85a, op registrations cut: the side-by-side A/B's "before")
"""graphspec::rms_norm as a Triton kernel: one tile of BLOCK_R rows x the whole last dim per program.

Rounding is the reference's (graphspec.ops.rms_norm_reference, transformers' LlamaRMSNorm): normalize
in fp32, cast to the input dtype, then multiply by the weight in that dtype (one rounding of the
exact fp32 product, which is what torch does for a bf16 * bf16 multiply).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from before.common import cdiv, check_config_table, check_device, next_power_of_2, round_to
from torch import Tensor

from graphspec.ops import rms_norm_reference

__all__ = ["CONFIGS", "rms_norm", "rms_norm_reference", "rms_norm_triton", "tile_rows"]

# tile_elems: elements per program (rows per tile = tile_elems // padded last dim, at least 1).
# CONFIGS[90] from benchmarks/bench_launch_configs.py on an H200 (2026-11-22): 1.6-1.9 us per launch at the
# step's widths and 1-5 rows; the former 8192/8 took 2.4-2.6 us at 2 and 5 rows.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 4096, "num_warps": 8},
    90: {"tile_elems": 4096, "num_warps": 4},
    "default": {"tile_elems": 4096, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MAX_DIM = 65536  # widest last dim held in registers by one tile


@triton.jit
def rms_norm_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    rows,
    dim,
    eps,
    stride_xr,
    stride_xd,
    stride_w,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Tile: rows [pid * BLOCK_R, +BLOCK_R) of the [rows, dim] view; columns padded to BLOCK_D.
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.arange(0, BLOCK_D)
    col_ok = col < dim
    mask = (row < rows)[:, None] & col_ok[None, :]
    # The weight is loaded first: nothing it needs comes from the row, and issued after the reduction
    # (whose barrier the compiler does not move loads across) its memory latency would add to the row's.
    weight = tl.load(weight_ptr + col * stride_w, mask=col_ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row[:, None] * stride_xr + col[None, :] * stride_xd, mask=mask, other=0.0)
    hidden = x.to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    out = scale_rows(hidden, inverse_rms(hidden, dim, eps), weight[None, :], dtype)
    tl.store(out_ptr + row[:, None] * dim + col[None, :], out.to(dtype), mask=mask)


@triton.jit
def inverse_rms(hidden, dim, eps):
    """1 / sqrt(mean(x^2) + eps) of each row of fp32 hidden [rows, cols] (padding columns hold 0)."""
    variance = tl.sum(hidden * hidden, 1) / dim
    return 1.0 / tl.sqrt_rn(variance + eps)  # IEEE sqrt and divide, like torch on CPU


@triton.jit
def scale_rows(hidden, inverse, weight, DTYPE: tl.constexpr):
    """The reference's rounding: hidden * inverse cast to the model dtype, then times the weight (an
    exact fp32 product) rounded once; fp32 holding DTYPE values. weight broadcasts against hidden."""
    return round_to(weight * round_to(hidden * inverse[:, None], DTYPE), DTYPE)


def tile_rows(dim: int, tile_elems: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_D) for a last dim of `dim`: the row padded to a power of 2, as many rows as fit."""
    block_d = next_power_of_2(dim)
    return max(1, tile_elems // block_d), block_d


def rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """RMSNorm over the last dim of x [..., D] with weight [D]; a new contiguous tensor of x's dtype."""
    check_device(x, weight)
    dim = x.shape[-1]
    x2 = x.reshape(-1, dim)  # a view when the leading dims collapse, else one copy
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0:
        return out
    block_r, block_d = tile_rows(dim, tile_elems)
    rms_norm_kernel[(cdiv(rows, block_r),)](
        x2, weight, out, rows, dim, eps, x2.stride(0), x2.stride(1), weight.stride(0),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return out
