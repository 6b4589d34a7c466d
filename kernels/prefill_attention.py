"""graphspec::prefill_attention as a flash-style Triton kernel: one prefill chunk of T tokens per row.

Semantics are graphspec.ops.prefill_attention_reference: k and v [B, Hkv, T, D] are written into the
cache [L, 2, SLOTS, Hkv, S, D] at positions start_pos[b] + t of slot slot_ids[b]; query t of q
[B, Hq, T, D] (position start_pos[b] + t) attends causally to the row's cached prefix (positions
< start_pos[b], written by earlier chunks) and the chunk's keys 0..t; GQA maps q head h to kv head
h // (Hq // Hkv). The output is token-major [B, T, Hq, D].

One program handles one (query block of BLOCK_M tokens, row b, q head): the prefix keys come from the
cache, the chunk's own keys straight from k and v (not read back from the cache), so no program reads
what another writes: the programs of q head g * GROUP store the chunk's keys and values of their query
block into the cache, and nothing in this launch reads those cache positions. The chunk loop stops at
the block's last query (causal), so a chunk costs about half of its full T x T scores; only the blocks
that straddle the diagonal (and the prefix's last partial block) are masked, the others load and attend
without masks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import cdiv, check_config_table, check_device, fit_shared_memory, round_to
from torch import Tensor

from graphspec import library
from graphspec.ops import prefill_attention_reference

__all__ = ["CONFIGS", "prefill_attention", "prefill_attention_reference", "prefill_attention_triton", "shape_class"]

# block_m: queries per program; block_n: keys per loop step; num_warps/num_stages: Triton launch knobs.
# 90: the fastest or within 1% of it for every shape of `benchmarks/bench_prefill_kernels.py --sweep`
# on an H200 (8B heads x 128 at 4096 and 2048 tokens and 512 after a 3584 prefix, 1B heads x 64 at 4096:
# docs/BENCHMARKS.md); 80 is the usual flash-attention-2 tile, untuned; "default" is small so the
# interpreter stays quick.
# (90, "head_dim_256"): Qwen3.5 / Qwen3-Next attention heads, the fastest of the same sweep at 4096 tokens
# (0.342 ms against 0.472 with the row for 128; 2026-11-27, docs/results/2026-11-27-prefill-attention-ab).
CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    80: {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2},
    90: {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 3},
    (90, "head_dim_256"): {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2},
    "default": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2},
}
CONFIG_FIELDS = check_config_table(CONFIGS)
HEAD_DIMS = (64, 128, 256)  # head dims the kernel is tested for (256: Qwen3.5 / Qwen3-Next attention)
LOG2E = 1.4426950408889634


def shape_class(q: Tensor, *_: object) -> str | None:
    """The config row's shape class (lowering/registry.py): heads of 256 take their own tiles."""
    return "head_dim_256" if q.shape[-1] == 256 else None


@triton.jit
def _attend(
    q, k, v, scores_mask, m_i, l_i, acc, qk_scale,
    MASKED: tl.constexpr, PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):  # fmt: skip
    """One online-softmax update of (m_i, l_i, acc) with keys k and values v [BLOCK_N, D]; scores_mask
    is read only when MASKED (blocks every query sees whole skip the select)."""
    if UPCAST_DOT:
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], base-2 units
    if MASKED:
        scores = tl.where(scores_mask, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    scores = scores - m_new[:, None]
    p = tl.exp2(scores)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    # P is rounded to the value dtype (bf16 on GPU) for the tensor-core dot, as flash attention does; the
    # dot accumulates straight into the rescaled acc (no second [BLOCK_M, D] tile for its result).
    if UPCAST_DOT:
        p, v = round_to(p, v.dtype), v.to(tl.float32)
    else:
        p = p.to(v.dtype)
    acc = tl.dot(p, v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["layer"])
def prefill_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ids_ptr,
    start_pos_ptr,
    out_ptr,
    layer,
    qk_scale,  # scale * log2(e): scores in base-2 units so the softmax can use exp2
    seq_capacity,  # S, cache positions per slot
    slots,
    q_heads,
    T,
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
    stride_cl,
    stride_ckind,
    stride_cslot,
    stride_ch,
    stride_cs,
    stride_cd,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    # Heaviest query blocks first (block m attends to about m + 1 key blocks), over the whole launch: the
    # GPU starts programs in grid order, axis 0 fastest, so the (row, head) axis is 0 and the query block
    # axis 1 counts down; the last wave is then made of every head's short blocks, not of the last
    # heads' long ones.
    row_head = tl.program_id(0)  # b * Hq + q head
    m_block = tl.num_programs(1) - 1 - tl.program_id(1)
    b = row_head // q_heads
    head = row_head % q_heads
    kv_head = head // GROUP
    slot = tl.load(slot_ids_ptr + b).to(tl.int64)
    start = tl.load(start_pos_ptr + b).to(tl.int32)
    dtype = cache_ptr.dtype.element_ty
    dims = tl.arange(0, HEAD_DIM)

    # This program's queries: chunk tokens [m_block * BLOCK_M, +BLOCK_M), those past T are padding.
    tokens = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    token_ok = tokens < T
    q_rows = b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + tokens.to(tl.int64) * stride_qt
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :] * stride_qd, mask=token_ok[:, None], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Slot base in int64 (an H200-sized cache exceeds 2**31 elements); offsets inside one (layer, kind,
    # slot, head) plane stay int32 (the launcher checks S * stride_s < 2**31).
    key_base = cache_ptr + layer.to(tl.int64) * stride_cl + slot * stride_cslot + kv_head.to(tl.int64) * stride_ch
    value_base = key_base + stride_ckind
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh

    # The first q head of each kv head stores this block's keys and values into the cache, at the
    # token's position; positions past the cache and slots outside it get no write, as kv_write drops them.
    if head % GROUP == 0:
        chunk_offsets = tokens.to(tl.int64)[:, None] * stride_kt + dims[None, :] * stride_kd
        k_new = tl.load(k_base + chunk_offsets, mask=token_ok[:, None], other=0.0)
        v_offsets = tokens.to(tl.int64)[:, None] * stride_vt + dims[None, :] * stride_vd
        v_new = tl.load(v_base + v_offsets, mask=token_ok[:, None], other=0.0)
        positions = start + tokens
        # HACK(triton<=3.9 interpreter): `block & scalar` of bools comes out as an int32 mask that
        # tl.store refuses; tl.where keeps it bool (as in kernels/rotary_kv_write.py).
        write = tl.where((slot >= 0) & (slot < slots), token_ok & (positions < seq_capacity), False)
        cache_offsets = positions[:, None] * stride_cs + dims[None, :] * stride_cd
        tl.store(key_base + cache_offsets, k_new.to(dtype), mask=write[:, None])
        tl.store(value_base + cache_offsets, v_new.to(dtype), mask=write[:, None])

    # Online softmax state. m_i starts finite so a fully masked block gives exp2(-inf - m_i) = 0 and
    # alpha = 1, never NaN from (-inf) - (-inf).
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)

    # Key blocks that every query of the block sees whole load and attend without masks; only the
    # cached prefix's last partial block and the chunk's blocks on the diagonal are masked.

    # 1. The cached prefix, positions [0, start): every query of the chunk sees all of it.
    full_prefix = start - start % BLOCK_N
    for block_start in range(0, full_prefix, BLOCK_N):
        kv_offsets = (block_start + offs_n)[:, None] * stride_cs + dims[None, :] * stride_cd
        k = tl.load(key_base + kv_offsets)
        v = tl.load(value_base + kv_offsets)
        m_i, l_i, acc = _attend(q, k, v, None, m_i, l_i, acc, qk_scale, False, PRECISION, UPCAST_DOT)
    for block_start in range(full_prefix, start, BLOCK_N):  # at most one block, past its end masked as 0
        pos = block_start + offs_n
        in_range = pos < start
        kv_offsets = pos[:, None] * stride_cs + dims[None, :] * stride_cd
        k = tl.load(key_base + kv_offsets, mask=in_range[:, None], other=0.0)
        v = tl.load(value_base + kv_offsets, mask=in_range[:, None], other=0.0)
        m_i, l_i, acc = _attend(q, k, v, in_range[None, :], m_i, l_i, acc, qk_scale, True, PRECISION, UPCAST_DOT)

    # 2. The chunk's own keys 0 .. (last query of this block), from k and v: causal within the chunk.
    # Keys before the block's first query (BLOCK_M is a multiple of BLOCK_N) are all visible and real.
    block_first = m_block * BLOCK_M
    for block_start in range(0, block_first, BLOCK_N):
        key_tokens = (block_start + offs_n).to(tl.int64)
        k = tl.load(k_base + key_tokens[:, None] * stride_kt + dims[None, :] * stride_kd)
        v = tl.load(v_base + key_tokens[:, None] * stride_vt + dims[None, :] * stride_vd)
        m_i, l_i, acc = _attend(
            q, k.to(dtype), v.to(dtype), None, m_i, l_i, acc, qk_scale, False, PRECISION, UPCAST_DOT
        )
    chunk_end = tl.minimum(block_first + BLOCK_M, T)
    for block_start in range(block_first, chunk_end, BLOCK_N):
        key_tokens = block_start + offs_n
        in_range = key_tokens < T
        k = tl.load(
            k_base + key_tokens.to(tl.int64)[:, None] * stride_kt + dims[None, :] * stride_kd,
            mask=in_range[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + key_tokens.to(tl.int64)[:, None] * stride_vt + dims[None, :] * stride_vd,
            mask=in_range[:, None],
            other=0.0,
        )
        visible = (key_tokens[None, :] <= tokens[:, None]) & in_range[None, :]
        m_i, l_i, acc = _attend(
            q, k.to(dtype), v.to(dtype), visible, m_i, l_i, acc, qk_scale, True, PRECISION, UPCAST_DOT
        )

    # Every query sees at least its own key, so l_i > 0 on real rows; padding rows divide by 1.
    norm = tl.where(l_i > 0, l_i, 1.0)
    out = round_to(acc / norm[:, None], out_ptr.dtype.element_ty)
    out_rows = (b.to(tl.int64) * T + tokens) * q_heads + head  # row of contiguous [B, T, Hq]
    tl.store(
        out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=token_ok[:, None],
    )


def prefill_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    block_m: int = CONFIGS["default"]["block_m"],
    block_n: int = CONFIGS["default"]["block_n"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
) -> Tensor:
    """Launch prefill_attention_kernel. Same result as graphspec.ops.prefill_attention_reference; writes
    k/v into the cache and returns a new contiguous [B, T, Hq, D] tensor of q's dtype."""
    check_device(q, k, v, cache)
    batch, q_heads, t, head_dim = q.shape
    kv_heads, seq_capacity = cache.shape[3], cache.shape[4]
    kv_shape = (batch, kv_heads, t, head_dim)
    if q.dtype != cache.dtype or q_heads % kv_heads or head_dim != cache.shape[5]:
        raise ValueError(
            f"prefill_attention kernel: q {tuple(q.shape)} {q.dtype} does not match cache "
            f"{tuple(cache.shape)} {cache.dtype}"
        )
    if tuple(k.shape) != kv_shape or tuple(v.shape) != kv_shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"prefill_attention kernel: k/v must be {kv_shape} {q.dtype}, got {tuple(k.shape)} {k.dtype}, "
            f"{tuple(v.shape)} {v.dtype}"
        )
    if block_m % block_n:
        raise ValueError(f"prefill_attention kernel: block_m ({block_m}) must be a multiple of block_n ({block_n})")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"prefill_attention kernel: head dim must be a power of 2 >= 16, got {head_dim}")
    if (seq_capacity - 1) * cache.stride(4) + (head_dim - 1) * cache.stride(5) >= 2**31:
        raise ValueError("prefill_attention kernel: one cache plane (S * D) must stay below 2**31 elements")
    out = torch.empty((batch, t, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0 or t == 0:
        return out
    block_n, num_stages = fit_shared_memory(q, block_m, block_n, num_stages)  # heads of 256: smaller tiles
    # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under
    # TRITON_INTERPRET=1; there the kernel upcasts the (exactly representable) operands to fp32.
    # Remove when the interpreter's dot handles 16-bit floats.
    upcast = q.device.type != "cuda" and q.dtype != torch.float32
    prefill_attention_kernel[(batch * q_heads, cdiv(t, block_m))](
        q, k, v, cache, slot_ids, start_pos, out,
        layer, scale * LOG2E, seq_capacity, cache.shape[2], q_heads, t,
        *q.stride(), *k.stride(), *v.stride(), *cache.stride(),
        GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        UPCAST_DOT=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return out


@library.op("graphspec::prefill_attention_triton", mutates_args=("cache",))
def prefill_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
) -> Tensor:
    """graphspec::prefill_attention lowered to prefill_attention_kernel; the trailing ints are CONFIG_FIELDS."""
    return prefill_attention(q, k, v, cache, layer, slot_ids, start_pos, scale, block_m, block_n, num_warps, num_stages)


@torch.library.register_fake("graphspec::prefill_attention_triton")
def _(q, k, v, cache, layer, slot_ids, start_pos, scale, block_m, block_n, num_warps, num_stages):
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))
