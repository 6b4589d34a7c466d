"""graphspec::rotary_kv_write as a Triton kernel: rotary of q and k, and the KV write of the rotated k and
of v, in one launch; the rotated k goes from registers straight into the cache and never exists as a tensor.

One program per (token (b, t), block of heads) as in kernels/rotary.py, whose helpers do the rotation,
so the rounding is the reference's (bit-identical in bf16): each q head's rotated row goes to q_out,
each k head's rotated row and the same head's v row go to the cache at slot slot_ids[b], position
start_pos[b] + t, through kernels/kv_write.py's helpers: the same cast to the cache dtype, int64 cache
offsets, and the same out-of-range drop (a token whose slot or position lies outside the cache writes
no K/V; its q row is still rotated). With q_norm/k_norm (fuse_qk_norm) each head row is rms_norm'ed in
registers first, as in kernels/rotary.py's rotate_heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, next_power_of_2
from graphspec.kernels.kv_write import cache_offsets, check_kv, store_kv
from graphspec.kernels.rotary import check_qk, head_block, rotate_heads, store_heads
from torch import Tensor

from graphspec import library
from graphspec.ops import rotary_kv_write_reference

__all__ = ["CONFIGS", "rotary_kv_write", "rotary_kv_write_reference", "rotary_kv_write_triton"]

# block_h: heads (q heads then k heads, one index space) per program, as in kernels/rotary.py. A k head
# also moves its v row, but a step's K/V is small: the launch is latency bound, not bandwidth bound.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_h": 8, "num_warps": 4},
    90: {"block_h": 16, "num_warps": 4},
    "default": {"block_h": 8, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def rotary_kv_write_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,  # cache[layer, 0]: [SLOTS, Hkv, S, D]
    v_cache_ptr,  # cache[layer, 1], same strides
    slot_ptr,
    start_ptr,
    q_heads,
    kv_heads,
    half,  # D // 2
    slots,
    seq,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_vd,
    stride_cb,
    stride_ct,
    stride_cd,
    stride_sb,
    stride_st,
    stride_sd,
    stride_cache_s,  # of the K and V planes
    stride_cache_h,
    stride_cache_p,
    stride_cache_d,
    q_norm_ptr,  # QK_NORM only: [D] weights of the per-head rms_norm of q and of k, before the rotation
    k_norm_ptr,
    norm_eps,
    T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    b, t, heads, k_heads, is_q, is_k, col, col_ok = head_block(q_heads, kv_heads, half, T, BLOCK_H, BLOCK_HALF)
    out1, out2 = rotate_heads(
        q_ptr, k_ptr, cos_ptr, sin_ptr, b, t, heads, k_heads, is_q, is_k, col, col_ok, half,
        stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
        stride_cb, stride_ct, stride_cd, stride_sb, stride_st, stride_sd, q_norm_ptr, k_norm_ptr, norm_eps,
        q_out_ptr.dtype.element_ty, QK_NORM,
    )  # fmt: skip
    store_heads(q_out_ptr, out1, out2, b, heads, t, q_heads, half, col, is_q[:, None] & col_ok[None, :], T)

    # Token (b, t) lands at slot slot_ids[b], position start_pos[b] + t (b < B: no mask needed).
    slot = tl.load(slot_ptr + b)
    pos = tl.load(start_ptr + b).to(tl.int64) + t
    dst, inside = cache_offsets(
        slot, k_heads, pos, col, slots, seq, stride_cache_s, stride_cache_h, stride_cache_p, stride_cache_d
    )
    # K/V elements (k head, col) of each half; q heads and dropped targets write nothing.
    # HACK(triton<=3.9 interpreter): `block & scalar` of bools comes out as an int32 mask that tl.load
    # refuses; tl.where keeps it bool. Remove when the interpreter types mixed-shape `&` as int1.
    kv_mask = tl.where(inside, is_k[:, None] & col_ok[None, :], False)
    v_off = b * stride_vb + k_heads.to(tl.int64)[:, None] * stride_vh + t * stride_vt + col[None, :] * stride_vd
    v1 = tl.load(v_ptr + v_off, mask=kv_mask)
    v2 = tl.load(v_ptr + v_off + half * stride_vd, mask=kv_mask)
    # out1/out2 are the rotated k in the model dtype, exactly the k_out rotary would have stored.
    store_kv(k_cache_ptr, v_cache_ptr, dst, out1, v1, kv_mask)
    store_kv(k_cache_ptr, v_cache_ptr, dst + half * stride_cache_d, out2, v2, kv_mask)


def rotary_kv_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    norm_eps: float = 1e-6,
    block_h: int = CONFIGS["default"]["block_h"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> Tensor:
    """Rotary of q [B, Hq, T, D] and k [B, Hkv, T, D] with cos/sin [B, T, D], the rotated k and v
    [B, Hkv, T, D] written into cache [L, 2, SLOTS, Hkv, S, D] at positions start_pos[b] + t of slot
    slot_ids[b], layer `layer` (out-of-range targets skipped). Any input strides; returns q rotated,
    contiguous. With q_norm and k_norm ([D] contiguous weights) each head row is rms_norm'ed first."""
    check_device(q, k, v, cos, sin, cache, slot_ids, start_pos)
    check_qk(q, k, "rotary_kv_write")
    check_kv(cache, k, v, "rotary_kv_write")
    batch, q_heads, t, dim = q.shape
    if (q_norm is None) != (k_norm is None):
        raise ValueError("rotary_kv_write kernel: q_norm and k_norm come together (or neither)")
    for weight in () if q_norm is None else (q_norm, k_norm):
        if weight.shape != (dim,) or weight.stride(0) != 1 or weight.dtype != q.dtype:
            raise ValueError(f"rotary_kv_write kernel: norm weights must be contiguous [{dim}] {q.dtype}")
    kv_heads = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch * t == 0:
        return q_out
    # Layer and kind are resolved on the host: the views' data pointers carry those (int64) offsets.
    k_cache, v_cache = cache[layer, 0], cache[layer, 1]
    grid = (batch * t, cdiv(q_heads + kv_heads, block_h))
    rotary_kv_write_kernel[grid](
        q, k, v, cos, sin, q_out, k_cache, v_cache, slot_ids, start_pos, q_heads, kv_heads, dim // 2,
        cache.shape[2], cache.shape[4], *q.stride(), *k.stride(), *v.stride(), *cos.stride(), *sin.stride(),
        *k_cache.stride(), q if q_norm is None else q_norm, q if k_norm is None else k_norm, norm_eps,
        T=t, BLOCK_H=block_h, BLOCK_HALF=next_power_of_2(dim // 2), QK_NORM=q_norm is not None, num_warps=num_warps,
    )  # fmt: skip
    return q_out


@library.op("graphspec::rotary_kv_write_triton", mutates_args=("cache",))
def rotary_kv_write_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    q_norm: Tensor | None,
    k_norm: Tensor | None,
    norm_eps: float,
    block_h: int,
    num_warps: int,
) -> Tensor:
    """graphspec::rotary_kv_write lowered to rotary_kv_write_kernel; the trailing ints are CONFIG_FIELDS."""
    args = (q, k, v, cos, sin, cache, layer, slot_ids, start_pos, q_norm, k_norm, norm_eps)
    return rotary_kv_write(*args, block_h, num_warps)


@torch.library.register_fake("graphspec::rotary_kv_write_triton")
def _(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, q_norm, k_norm, norm_eps, block_h, num_warps):
    return q.new_empty(q.shape)
