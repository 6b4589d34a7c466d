"""graphspec::kv_write as a Triton kernel: K and V of a step written into the cache in one launch.

The reference (graphspec.ops.kv_write) runs two index_put launches per layer, one for K and one for V;
this kernel writes both from one program per tile of BLOCK_R (batch row, head, token) rows x the head
dim. It is a copy, so it is bit-identical to the reference: k/v in the cache's dtype are moved as raw
bits; k/v in another dtype are converted like torch's .to(cache.dtype) (round to nearest even).

Out-of-range targets, where the reference would raise (or wrap a negative index around), are dropped
instead: a row whose slot is outside [0, SLOTS) or whose position start_pos[b] + t is outside [0, S)
writes nothing. The runtime guarantees start_pos + T <= S and valid slots, so this only matters for
bugs: a bad position then cannot scribble over another slot's memory. Two rows that target the same
(slot, position) (padded rows all write to the spare slot) leave one of the two writes, as index_put
without accumulate does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, next_power_of_2, round_to
from torch import Tensor

from graphspec import library
from graphspec.ops import kv_write as kv_write_reference  # the op itself is the torch reference

__all__ = ["CONFIGS", "kv_write", "kv_write_reference", "kv_write_triton", "tile_rows"]

# tile_elems: elements of K (and as many of V) per program; rows per tile = tile_elems // padded D.
# Not tuned on hardware yet: a step's K/V is small (B*T*Hkv*D), so the launch is latency bound and
# any tile that gives a few programs per SM at large batch does.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 2048, "num_warps": 4},
    90: {"tile_elems": 2048, "num_warps": 4},
    "default": {"tile_elems": 2048, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
MAX_DIM = 4096  # widest head dim held in registers by one tile


@triton.jit
def cache_offsets(slot, h, pos, col, slots, seq, stride_cs, stride_ch, stride_cp, stride_cd):
    """Offsets [rows, cols] of head h, position pos, elements col of slot `slot` in one (layer, kind)
    plane [SLOTS, Hkv, S, D] of the cache, and whether (slot, pos) lies inside it: out-of-range
    targets are dropped (module docstring), so no write leaves the row's own slot plane."""
    slot = slot.to(tl.int64)
    pos = pos.to(tl.int64)
    inside = (slot >= 0) & (slot < slots) & (pos >= 0) & (pos < seq)
    # int64 all the way: one layer's K plane of an H200-sized cache passes 2**31 elements.
    offsets = (slot * stride_cs + h.to(tl.int64) * stride_ch + pos * stride_cp)[:, None] + col[None, :] * stride_cd
    return offsets, inside


@triton.jit
def store_kv(k_cache_ptr, v_cache_ptr, offsets, k, v, mask):
    """Store k and v at `offsets` of the K and V planes. A cache-dtype input is stored as loaded (a bit
    copy); another dtype is rounded like torch's .to(), through round_to because the interpreter
    truncates fp32->bf16 casts."""
    dtype = k_cache_ptr.dtype.element_ty
    if k.dtype != dtype:
        k = round_to(k.to(tl.float32), dtype).to(dtype)
    if v.dtype != dtype:
        v = round_to(v.to(tl.float32), dtype).to(dtype)
    tl.store(k_cache_ptr + offsets, k, mask=mask)
    tl.store(v_cache_ptr + offsets, v, mask=mask)


@triton.jit
def kv_write_kernel(
    k_cache_ptr,  # cache[layer, 0]: [SLOTS, Hkv, S, D]
    v_cache_ptr,  # cache[layer, 1], same strides
    slot_ptr,
    start_ptr,
    k_ptr,
    v_ptr,
    rows,  # B * Hkv * T
    kv_heads,
    t_len,
    slots,
    seq,
    dim,
    stride_cs,
    stride_ch,
    stride_cp,
    stride_cd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_vd,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Rows of this tile: (b, h, t) flattened as (b * Hkv + h) * T + t; int32 is enough (fits checks it).
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = row < rows
    t = row % t_len
    h = (row // t_len) % kv_heads
    b = row // (t_len * kv_heads)
    slot = tl.load(slot_ptr + b, mask=row_ok, other=0)
    pos = tl.load(start_ptr + b, mask=row_ok, other=0).to(tl.int64) + t
    col = tl.arange(0, BLOCK_D)
    dst, inside = cache_offsets(slot, h, pos, col, slots, seq, stride_cs, stride_ch, stride_cp, stride_cd)
    mask = (row_ok & inside)[:, None] & (col < dim)[None, :]

    b = b.to(tl.int64)
    h = h.to(tl.int64)
    t = t.to(tl.int64)
    k = tl.load(k_ptr + (b * stride_kb + h * stride_kh + t * stride_kt)[:, None] + col[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + (b * stride_vb + h * stride_vh + t * stride_vt)[:, None] + col[None, :] * stride_vd, mask=mask)
    store_kv(k_cache_ptr, v_cache_ptr, dst, k, v, mask)


def tile_rows(dim: int, tile_elems: int) -> tuple[int, int]:
    """(BLOCK_R, BLOCK_D) for head dim `dim`: D padded to a power of 2, as many rows as fit."""
    block_d = next_power_of_2(dim)
    return max(1, next_power_of_2(tile_elems) // block_d), block_d  # tl.arange needs powers of 2


def check_kv(cache: Tensor, k: Tensor, v: Tensor, kernel: str) -> None:
    """k and v [B, Hkv, T, D] of one shape that fits a cache [L, 2, SLOTS, Hkv, S, D]."""
    _, kv_heads, _, dim = k.shape
    if cache.dim() != 6 or tuple(v.shape) != tuple(k.shape) or cache.shape[3] != kv_heads or cache.shape[5] != dim:
        shapes = f"k {tuple(k.shape)}, v {tuple(v.shape)}, cache {tuple(cache.shape)}"
        raise ValueError(f"{kernel} kernel: {shapes} do not fit [B, Hkv, T, D] into [L, 2, SLOTS, Hkv, S, D]")


def kv_write(
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    k: Tensor,
    v: Tensor,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> None:
    """Write k, v [B, Hkv, T, D] (any strides) into cache [L, 2, SLOTS, Hkv, S, D] at positions
    start_pos[b] + t of slot slot_ids[b], layer `layer`; out-of-range targets are skipped."""
    check_device(cache, slot_ids, start_pos, k, v)
    check_kv(cache, k, v, "kv_write")
    batch, kv_heads, t, dim = k.shape
    rows = batch * kv_heads * t
    if rows == 0 or dim == 0:
        return
    # Layer and kind are resolved on the host: the views' data pointers carry those (int64) offsets.
    k_cache, v_cache = cache[layer, 0], cache[layer, 1]
    block_r, block_d = tile_rows(dim, tile_elems)
    kv_write_kernel[(cdiv(rows, block_r),)](
        k_cache, v_cache, slot_ids, start_pos, k, v, rows, kv_heads, t, cache.shape[2], cache.shape[4], dim,
        *k_cache.stride(), *k.stride(), *v.stride(),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip


@library.op("graphspec::kv_write_triton", mutates_args=("cache",))
def kv_write_triton(
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    k: Tensor,
    v: Tensor,
    tile_elems: int,
    num_warps: int,
) -> None:
    """graphspec::kv_write lowered to kv_write_kernel; the trailing ints are CONFIG_FIELDS."""
    kv_write(cache, layer, slot_ids, start_pos, k, v, tile_elems, num_warps)


@torch.library.register_fake("graphspec::kv_write_triton")
def _(cache, layer, slot_ids, start_pos, k, v, tile_elems, num_warps):
    return None
