"""graphspec::gdn_gates as a Triton kernel: a Gated DeltaNet layer's per-head gates in one launch (the
reference is seven torch kernels: two casts, exp, add, softplus, negate and multiply, sigmoid).

Arithmetic is the reference's (graphspec.ops.gdn_gates_reference, transformers' Gated DeltaNet), each
step in fp32 as torch computes it: g = -exp(A_log) * softplus(a + dt_bias) with softplus(x) = x above 20
and log1p(exp(x)) below (torch's threshold), beta = sigmoid(b) = 1 / (1 + exp(-b)) rounded to b's dtype.
On the GPU exp and log1p are libdevice's (torch's CUDA calls); the interpreter has no libdevice and
takes numpy's exp and log1p written with log (Goldberg's form), a few fp32 ulps away.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, interpreting, next_power_of_2, round_to
from graphspec.kernels.offset_rms_norm import row_view
from torch import Tensor
from triton.language.extra import libdevice

from graphspec import library
from graphspec.ops import gdn_gates_reference

__all__ = ["CONFIGS", "gdn_gates", "gdn_gates_reference", "gdn_gates_triton"]

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch.nn.functional.softplus's default: above it softplus(x) is x

# tile_elems: gates per program (rows of Hv heads); untuned (a step has B * (K+1) rows of 16-64 heads).
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 1024, "num_warps": 4},
    90: {"tile_elems": 1024, "num_warps": 4},
    "default": {"tile_elems": 1024, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def gdn_gates_kernel(
    a_ptr,
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    rows,
    inner,  # row r is (r // inner, r % inner) of the [outer, inner, Hv] views of a and b
    heads,
    stride_ao,
    stride_ai,
    stride_ah,
    stride_bo,
    stride_bi,
    stride_bh,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    outer, within = row // inner, row % inner
    head = tl.arange(0, BLOCK_H)
    head_ok = head < heads
    mask = (row < rows)[:, None] & head_ok[None, :]
    a_log = tl.load(a_log_ptr + head, mask=head_ok, other=0.0).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + head, mask=head_ok, other=0.0).to(tl.float32)
    a_rows = outer * stride_ao + within * stride_ai
    a = tl.load(a_ptr + a_rows[:, None] + head[None, :] * stride_ah, mask=mask, other=0.0).to(tl.float32)
    b_rows = outer * stride_bo + within * stride_bi
    b = tl.load(b_ptr + b_rows[:, None] + head[None, :] * stride_bh, mask=mask, other=0.0).to(tl.float32)
    x = a + dt_bias[None, :]
    if LIBDEVICE:
        decay = libdevice.exp(a_log)
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, libdevice.log1p(libdevice.exp(x)))
        e = libdevice.exp(-b)
    else:
        decay = tl.exp(a_log)
        e_x = tl.exp(x)
        u = 1.0 + e_x  # log1p(e) as log(u) * e / (u - 1) (Goldberg): accurate where u rounds e away
        log1p = tl.where(u == 1.0, e_x, tl.log(u) * (e_x / tl.where(u == 1.0, 1.0, u - 1.0)))
        softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, log1p)
        e = tl.exp(-b)
    offsets = row[:, None] * heads + head[None, :]  # both outputs are contiguous [rows, Hv]
    tl.store(g_ptr + offsets, -decay[None, :] * softplus, mask=mask)
    dtype = beta_ptr.dtype.element_ty
    tl.store(beta_ptr + offsets, round_to(tl.div_rn(1.0, 1.0 + e), dtype).to(dtype), mask=mask)


def gdn_gates(
    a: Tensor,
    b: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(g fp32, beta in b's dtype), both new contiguous [..., Hv], of a, b [..., Hv] (any strides) and
    A_log, dt_bias [Hv]."""
    check_device(a, b, a_log, dt_bias)
    if b.shape != a.shape or a_log.shape != dt_bias.shape or a_log.shape != a.shape[-1:]:
        raise ValueError(
            f"gdn_gates kernel: a {tuple(a.shape)}, b {tuple(b.shape)}, A_log {tuple(a_log.shape)} and dt_bias "
            f"{tuple(dt_bias.shape)} do not agree"
        )
    heads = a.shape[-1]
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    rows = a.numel() // heads if heads else 0
    if rows == 0:
        return g, beta
    a3, b3 = row_view(a), row_view(b)
    block_h = next_power_of_2(heads)
    block_r = max(1, next_power_of_2(tile_elems) // block_h)
    gdn_gates_kernel[(cdiv(rows, block_r),)](
        a3, b3, a_log.contiguous(), dt_bias.contiguous(), g, beta, rows, a3.shape[1], heads,
        a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1), b3.stride(2),
        BLOCK_R=block_r, BLOCK_H=block_h, LIBDEVICE=not interpreting(), num_warps=num_warps,
    )  # fmt: skip
    return g, beta


@library.op("graphspec::gdn_gates_triton", mutates_args=())
def gdn_gates_triton(
    a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor, tile_elems: int, num_warps: int
) -> tuple[Tensor, Tensor]:
    """graphspec::gdn_gates lowered to gdn_gates_kernel; the trailing ints are CONFIG_FIELDS."""
    return gdn_gates(a, b, a_log, dt_bias, tile_elems, num_warps)


@torch.library.register_fake("graphspec::gdn_gates_triton")
def _(a, b, a_log, dt_bias, tile_elems, num_warps):
    return a.new_empty(a.shape, dtype=torch.float32), b.new_empty(b.shape)
