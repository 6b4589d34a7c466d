# ruff: noqa  (kernels/rotary.py at 4cac85a, op registrations cut: the side-by-side A/B's "before")
"""graphspec::rotary as a Triton kernel: rotate-half rotary embedding of q and k in one launch.

Same rounding as graphspec.ops.rotary_reference, which runs in the model dtype: cos/sin are cast to
q's dtype, then q*cos and rotate_half(q)*sin are each rounded to the dtype before their sum is.
With rotate_half(x) = cat(-x2, x1) for halves x1, x2 of the head dim:
    out1 = x1*cos1 - x2*sin1,  out2 = x2*cos2 + x1*sin2   (each product rounded, then the sum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from before.common import cdiv, check_config_table, check_device, next_power_of_2, round_to
from before.rms_norm import scale_rows
from torch import Tensor

from graphspec.ops import rotary_reference

__all__ = ["CONFIGS", "rotary", "rotary_reference", "rotary_triton"]

# block_h: heads (q heads then k heads, one index space) per program.
# 90: the fastest at both prefill shapes of `benchmarks/bench_prefill_kernels.py --sweep` on an H200 (4096
# tokens of 32/8 heads x 128: 0.041 ms against 0.064 ms for the former 16/4; x 64: 0.033 against 0.037);
# the step fuses its rotary into attention, so decode barely runs this kernel.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_h": 8, "num_warps": 4},
    90: {"block_h": 8, "num_warps": 2},
    "default": {"block_h": 8, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def head_block(q_heads, kv_heads, half, T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The work of program (b * T + t, head block): token t of batch row b, BLOCK_H heads of one index
    space where [0, q_heads) are q heads and [q_heads, q_heads + kv_heads) k heads. Returns
    (b as int64, t, heads, k_heads (k head index, 0 where not a k head), is_q, is_k, col, col_ok),
    col indexing one half of the head dim."""
    bt = tl.program_id(0)  # b * T + t
    b = (bt // T).to(tl.int64)
    t = bt % T
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    is_q = heads < q_heads
    is_k = (heads >= q_heads) & (heads < q_heads + kv_heads)
    k_heads = tl.where(is_k, heads - q_heads, 0)
    col = tl.arange(0, BLOCK_HALF)  # index within one half of the head dim
    return b, t, heads, k_heads, is_q, is_k, col, col < half


@triton.jit
def rotate_heads(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    b,
    t,
    heads,
    k_heads,
    is_q,
    is_k,
    col,
    col_ok,
    half,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_cb,
    stride_ct,
    stride_cd,
    stride_sb,
    stride_st,
    stride_sd,
    q_norm_ptr,  # QK_NORM only: [D] weights of the per-head rms_norm of q and of k, before the rotation
    k_norm_ptr,
    norm_eps,
    DTYPE: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    """The rotated halves (out1, out2) [BLOCK_H, BLOCK_HALF] in DTYPE (the model dtype) of token
    (b, t) of each head of a head_block: q rows for q heads, k rows for k heads, garbage elsewhere.
    QK_NORM: each row rms_norm'ed first (q_norm weights for q heads, k_norm for k heads)."""
    # cos/sin [B, T, D] rows for (b, t), cast to the model dtype like the reference, then held in fp32.
    cos_row = cos_ptr + b * stride_cb + t * stride_ct
    sin_row = sin_ptr + b * stride_sb + t * stride_st
    cos1 = round_to(tl.load(cos_row + col * stride_cd, mask=col_ok, other=0.0).to(tl.float32), DTYPE)
    cos2 = round_to(tl.load(cos_row + (col + half) * stride_cd, mask=col_ok, other=0.0).to(tl.float32), DTYPE)
    sin1 = round_to(tl.load(sin_row + col * stride_sd, mask=col_ok, other=0.0).to(tl.float32), DTYPE)
    sin2 = round_to(tl.load(sin_row + (col + half) * stride_sd, mask=col_ok, other=0.0).to(tl.float32), DTYPE)

    # Input element (head, col) of each half: q rows for q heads, k rows for k heads (masked loads).
    q_off = b * stride_qb + heads.to(tl.int64)[:, None] * stride_qh + t * stride_qt + col[None, :] * stride_qd
    k_off = b * stride_kb + k_heads.to(tl.int64)[:, None] * stride_kh + t * stride_kt + col[None, :] * stride_kd
    q_mask = is_q[:, None] & col_ok[None, :]
    k_mask = is_k[:, None] & col_ok[None, :]
    x1 = tl.where(
        q_mask, tl.load(q_ptr + q_off, mask=q_mask, other=0.0), tl.load(k_ptr + k_off, mask=k_mask, other=0.0)
    )
    x2 = tl.where(
        q_mask,
        tl.load(q_ptr + q_off + half * stride_qd, mask=q_mask, other=0.0),
        tl.load(k_ptr + k_off + half * stride_kd, mask=k_mask, other=0.0),
    )
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if QK_NORM:  # kernels/rms_norm.py's arithmetic over the row's two halves (padding columns hold 0)
        inverse = 1.0 / tl.sqrt_rn((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * half) + norm_eps)
        is_q_row = is_q[:, None]
        w1 = tl.where(
            is_q_row,
            tl.load(q_norm_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :],
            tl.load(k_norm_ptr + col, mask=col_ok, other=0.0).to(tl.float32)[None, :],
        )
        w2 = tl.where(
            is_q_row,
            tl.load(q_norm_ptr + half + col, mask=col_ok, other=0.0).to(tl.float32)[None, :],
            tl.load(k_norm_ptr + half + col, mask=col_ok, other=0.0).to(tl.float32)[None, :],
        )
        x1 = scale_rows(x1, inverse, w1, DTYPE)
        x2 = scale_rows(x2, inverse, w2, DTYPE)
    # Each product rounded to the dtype, then the sum (a no-op chain for fp32).
    out1 = round_to(round_to(x1 * cos1[None, :], DTYPE) - round_to(x2 * sin1[None, :], DTYPE), DTYPE).to(DTYPE)
    out2 = round_to(round_to(x2 * cos2[None, :], DTYPE) + round_to(x1 * sin2[None, :], DTYPE), DTYPE).to(DTYPE)
    return out1, out2


@triton.jit
def store_heads(out_ptr, out1, out2, b, heads, t, num_heads, half, col, mask, T: tl.constexpr):
    """Store rotated halves as rows (b, heads, t) of a contiguous [B, H, T, D] output: element
    (b, h, t, d) at ((b * H + h) * T + t) * D + d."""
    dst = ((b * num_heads + heads.to(tl.int64)) * T + t)[:, None] * (2 * half) + col[None, :]
    tl.store(out_ptr + dst, out1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + dst + half, out2.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_out_ptr,
    q_heads,
    kv_heads,
    half,  # D // 2
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_cb,
    stride_ct,
    stride_cd,
    stride_sb,
    stride_st,
    stride_sd,
    T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    b, t, heads, k_heads, is_q, is_k, col, col_ok = head_block(q_heads, kv_heads, half, T, BLOCK_H, BLOCK_HALF)
    out1, out2 = rotate_heads(
        q_ptr, k_ptr, cos_ptr, sin_ptr, b, t, heads, k_heads, is_q, is_k, col, col_ok, half,
        stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
        stride_cb, stride_ct, stride_cd, stride_sb, stride_st, stride_sd, q_ptr, q_ptr, 0.0,
        q_out_ptr.dtype.element_ty, False,
    )  # fmt: skip
    store_heads(q_out_ptr, out1, out2, b, heads, t, q_heads, half, col, is_q[:, None] & col_ok[None, :], T)
    store_heads(k_out_ptr, out1, out2, b, k_heads, t, kv_heads, half, col, is_k[:, None] & col_ok[None, :], T)


def check_qk(q: Tensor, k: Tensor, kernel: str) -> None:
    """q and k as the kernels take them: same dtype and an even head dim shared by both."""
    dim = q.shape[3]
    if dim % 2 or k.dtype != q.dtype or k.shape[3] != dim:
        raise ValueError(f"{kernel} kernel: q {tuple(q.shape)} {q.dtype} and k {tuple(k.shape)} {k.dtype} do not match")


def rotary(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    block_h: int = CONFIGS["default"]["block_h"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """Rotary of q [B, Hq, T, D] and k [B, Hkv, T, D] (any strides) with cos/sin [B, T, D]; returns
    contiguous (q_out, k_out)."""
    check_device(q, k, cos, sin)
    check_qk(q, k, "rotary")
    batch, q_heads, t, dim = q.shape
    kv_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if batch * t == 0:
        return q_out, k_out
    grid = (batch * t, cdiv(q_heads + kv_heads, block_h))
    rotary_kernel[grid](
        q, k, cos, sin, q_out, k_out, q_heads, kv_heads, dim // 2,
        *q.stride(), *k.stride(), *cos.stride(), *sin.stride(),
        T=t, BLOCK_H=block_h, BLOCK_HALF=next_power_of_2(dim // 2), num_warps=num_warps,
    )  # fmt: skip
    return q_out, k_out
