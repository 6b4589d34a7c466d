"""graphspec::attention as a split-K (flash-decoding) Triton kernel: K+1 queries per row against the KV cache.

Semantics are graphspec.ops.attention_reference: q [B, Hq, T, D]; query t of row b sits at position
start_pos[b] + t and attends causally to cache[layer, 0/1, slot_ids[b], kv_head, :, :] (keys/values,
cache [L, 2, SLOTS, Hkv, S, D]); GQA maps q head h to kv head h // (Hq // Hkv). The output is
token-major [B, T, Hq, D].

One program handles one (row b, kv head, split, query block): the GROUP = Hq/Hkv q heads that share
the kv head times the T query tokens are packed as the M dimension of one tile, so every key/value
block is read from HBM once per kv head, whatever the group size. The visible keys of row b
(0 .. start_pos[b] + T - 1) are cut into `splits` equal chunks computed on the device from start_pos,
so the work is balanced for any actual length with a static grid (CUDA-graph safe). With splits > 1
each program writes a normalized partial output and its log-sum-exp and attention_reduce_kernel
combines them; with one split the main kernel writes the output directly.

ROTARY (graphspec::rotary_kv_attention, kernels/rotary_kv_attention.py): q and the step's k arrive
unrotated; every program rotates its q tile in registers, and the programs whose chunk holds the step's
positions rotate those keys and store them and their values into the cache before the key loop, which
is unchanged. QK_NORM adds Qwen3's per-head rms_norm of q and k before the rotation. ROW_SCALE (a folded input
norm, models/fold_norms.py) first scales q, k and v by the norm's row scale of the un-normalized rows they were
projected from: every program that rotates reads its row's T source rows (from L2) for it.

CAUSAL=False (graphspec::block_attention, kernels/block_attention.py, DFlash's drafter): every query of
the row's block sees every key up to the block's last position, start_pos[b] + T - 1, the window the
causal kernel gives its last query; nothing else changes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import (
    cdiv,
    check_config_table,
    check_device,
    fit_shared_memory,
    let_later_kernels_launch,
    next_power_of_2,
    pdl_launch,
    round_to,
    sm_count,
    wait_for_earlier_kernels,
)
from graphspec.kernels.rms_norm import inverse_rms, scale_rows
from torch import Tensor

from graphspec import library
from graphspec.ops import attention_reference

__all__ = ["CONFIGS", "attention", "attention_reference", "attention_triton"]

# block_n: keys per loop step; num_warps/num_stages: Triton launch knobs (stages = software-pipelined
# K/V loads in flight); programs_per_sm: split-K target, at most this many programs per SM when the
# batch alone does not fill the GPU (0 = never split). CONFIGS[90] is the fastest of a 72-config sweep on
# an H200 (benchmarks/bench_kernels.py --sweep, bf16, D 128, GQA 4): 43 us = 73% of copy bandwidth at
# B 1 / 32k tokens / K 4, and read bandwidth above the copy rate at B 64 / 4k. 80 and default are
# untuned guesses (smaller smem footprint). fp32 caches (CPU tests) use IEEE dots and spill on a GPU.
# block_m: query rows per tile, 0 = the query tile rounded up to a power of 2; split_keys: keys per split,
# 0 = as many splits as programs_per_sm asks (their size follows the cache length). wave_block_n: where the
# batch's (row, KV head, query block) tiles alone make one wave of more than WAVE_FILL of the SMs, no split and
# this many keys per loop step (0 = split as programs_per_sm says): a 128-key block in flight per program hides
# the HBM latency that a second split per SM hid, without the reduce (sm 90: 128; at B = 16, 8B heads, 15-20%
# faster per launch at 512 keys and 4-6% at 4000; docs/BENCHMARKS.md 2026-11-29, the attention probe).
# "invariant" (numerics="invariant", any SM): a fixed tile and fixed 512-key splits, so a query's keys
# are visited in the same blocks, splits and order whatever the batch, the query block or the cache
# length; the splits it cannot see weigh exactly 0 in the reduce.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_n": 64, "num_warps": 4, "num_stages": 2, "programs_per_sm": 4, "block_m": 0, "split_keys": 0,
         "wave_block_n": 0},
    90: {"block_n": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 2, "block_m": 0, "split_keys": 0,
         "wave_block_n": 128},
    "default": {"block_n": 32, "num_warps": 4, "num_stages": 2, "programs_per_sm": 2, "block_m": 0, "split_keys": 0,
                "wave_block_n": 0},
    "invariant": {"block_n": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": 0, "block_m": 16,
                  "split_keys": 512, "wave_block_n": 0},
}  # fmt: skip
CONFIG_FIELDS = check_config_table(CONFIGS)

HEAD_DIMS = (64, 128, 256)  # head dims the kernel is tested for (256: Qwen3.5 and Qwen3-Next full attention)
MAX_BLOCK_M = 128  # query rows per tile; more rows (GROUP * T > 128) take extra programs along grid axis 2
WAVE_FILL = 0.5  # wave_block_n: tile counts in (WAVE_FILL * SMs, SMs] (below, B <= 8 at 8B heads: a tie)
MAX_SPLITS = 128  # split-K cap (the reduce kernel holds one log-sum-exp per split in registers)
ROW_TILE = 8192  # ROW_SCALE: source elements summed per loop step (T positions x ROW_BLOCK columns)
REDUCE_CHUNK = 16  # partial outputs [chunk, D] combined per reduce loop step: at least this many ...
# ... and up to MAX_REDUCE_CHUNK: every split in one chunk, so one L2 round trip, where the splits fit
# (reduce_launch). A batch-1 row at a long cache (8192 positions: 33 splits on an H200) took three dependent
# round trips with 16-split chunks; in one 64-split chunk (two warps) its attention + reduce ran 0.3-1.3 us
# faster at 2000-16000 keys, 8B and 1B heads, T = 1 and 5 (docs/results/2026-11-30-long-context-splits).
MAX_REDUCE_CHUNK = 64
# Warps of each reduce program (one output row of D values), at least. One: benchmarks/bench_launch_configs.py
# --ops attention_reduce on an H200 (2026-11-22, 33 splits, 32 q heads): 2.3-3.0 us per launch at the
# step's shapes, against 2.7-4.4 us with 4 warps (cross-warp reductions of a row this small cost more
# than they share). Larger chunks take a warp per REDUCE_ROWS_PER_WARP partial rows and per
# REDUCE_ELEMENTS_PER_WARP partial values, so no thread holds more than 128 of them (more spilled in sm_90 builds:
# 64 rows x D 128 in one warp, 64 x 256 in two).
REDUCE_WARPS = 1
REDUCE_ROWS_PER_WARP = 32
REDUCE_ELEMENTS_PER_WARP = 4096
LOG2E = 1.4426950408889634


@triton.jit
def rope(x, partner, cos, sin, first_half, DTYPE: tl.constexpr):
    """x rotated by rotate-half rotary with kernels/rotary.py's rounding (each product rounded to DTYPE,
    then the sum), as fp32 holding DTYPE values. partner: x at the other half's column; cos/sin already
    rounded to DTYPE; first_half: whether a column lies in the first half (where rotate_half negates)."""
    rotated = tl.where(first_half, -partner.to(tl.float32), partner.to(tl.float32))
    return round_to(round_to(x.to(tl.float32) * cos, DTYPE) + round_to(rotated * sin, DTYPE), DTYPE)


@triton.jit
def rope_rows(cos_ptr, sin_ptr, b, token, dims, stride_cb, stride_ct, stride_cd, stride_sb, stride_st, stride_sd, mask,
              DTYPE: tl.constexpr):  # fmt: skip
    """cos and sin [rows, HEAD_DIM] at (b, token) of each row, cast to DTYPE like the reference, held in fp32."""
    cos_off = (b * stride_cb + token.to(tl.int64) * stride_ct)[:, None] + dims[None, :] * stride_cd
    sin_off = (b * stride_sb + token.to(tl.int64) * stride_st)[:, None] + dims[None, :] * stride_sd
    cos = round_to(tl.load(cos_ptr + cos_off, mask=mask, other=0.0).to(tl.float32), DTYPE)
    sin = round_to(tl.load(sin_ptr + sin_off, mask=mask, other=0.0).to(tl.float32), DTYPE)
    return cos, sin


@triton.jit
def norm_heads(x, partner, weight_ptr, dims, partner_dims, eps, HEAD_DIM: tl.constexpr, DTYPE: tl.constexpr):
    """rms_norm of each row of x [rows, HEAD_DIM] (one head each) with kernels/rms_norm.py's arithmetic,
    and of the same rows' values at partner_dims (the rotation's other-half columns), scaled by the
    same row factor: (x normed, partner normed), fp32 holding DTYPE values."""
    hidden = x.to(tl.float32)
    inverse = inverse_rms(hidden, HEAD_DIM, eps)
    x = scale_rows(hidden, inverse, tl.load(weight_ptr + dims).to(tl.float32)[None, :], DTYPE)
    weight = tl.load(weight_ptr + partner_dims).to(tl.float32)[None, :]
    return x, scale_rows(partner.to(tl.float32), inverse, weight, DTYPE)


@triton.jit
def row_inverse_rms(row_ptr, b, steps, T: tl.constexpr, stride_rb, stride_rt, eps, WIDTH: tl.constexpr,
                    BLOCK: tl.constexpr):  # fmt: skip
    """1 / sqrt(mean(src^2) + eps) of row b's source rows at `steps` (those < T), in a fixed order: BLOCK columns
    at a time squared into one [len(steps), BLOCK] accumulator, summed across it once; fp32 [len(steps)]."""
    rows = b * stride_rb + steps.to(tl.int64) * stride_rt
    # One cross-warp sum at the end: a sum per loop step would put a shared-memory round trip and barrier
    # between consecutive loads (a 5-token row: 3.6 us a launch more than 1 token, H200 2026-11-30).
    squares = tl.zeros([steps.shape[0], BLOCK], tl.float32)
    for start in tl.static_range(0, WIDTH, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = (steps < T)[:, None] & (cols < WIDTH)[None, :]
        src = tl.load(row_ptr + rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        squares += src * src
    return 1.0 / tl.sqrt_rn(tl.sum(squares, 1) / WIDTH + eps)  # IEEE sqrt and divide, like inverse_rms


@triton.jit
def store_partial(part_out_ptr, part_lse_ptr, out_rows, num_splits, split, out, lse, dims, row_ok):
    """One split's partial for the reduce: partials [B, T, Hq, splits, (D)] hold each row's normalized
    output `out` [rows, D] and base-2 log-sum-exp `lse` (-inf when the split holds none of its keys)."""
    part_rows = out_rows * num_splits + split
    tl.store(part_lse_ptr + part_rows, lse, mask=row_ok)
    tl.store(part_out_ptr + part_rows[:, None] * out.shape[1] + dims[None, :], out, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["layer"])
def attention_kernel(
    q_ptr,
    cache_ptr,
    slot_ids_ptr,
    start_pos_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    k_ptr,  # ROTARY only: this step's k and v [B, Hkv, T, D] (unrotated k) and cos/sin [B, T, D]
    v_ptr,
    cos_ptr,
    sin_ptr,
    q_norm_ptr,  # QK_NORM only: [D] weights of the per-head rms_norm of q and of k, before the rotation
    k_norm_ptr,
    row_ptr,  # ROW_SCALE only: the un-normalized rows [B, T, ROW_WIDTH] q, k and v were projected from
    layer,
    qk_scale,  # scale * log2(e): scores in base-2 units so the softmax can use exp2
    norm_eps,
    row_eps,
    seq_capacity,  # S, cache positions per slot
    slots,
    num_kv_heads,
    num_splits,
    split_keys,  # > 0: every split covers this many keys (fixed); 0: kv_len cut into num_splits chunks
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_cl,
    stride_ckind,
    stride_cslot,
    stride_ch,
    stride_cs,
    stride_cd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_vd,
    stride_cosb,
    stride_cost,
    stride_cosd,
    stride_sinb,
    stride_sint,
    stride_sind,
    stride_rb,
    stride_rt,
    T: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    ROTARY: tl.constexpr,
    QK_NORM: tl.constexpr,
    ROW_SCALE: tl.constexpr,
    ROW_WIDTH: tl.constexpr,  # ROW_SCALE: the source rows' width (hidden size)
    ROW_BLOCK: tl.constexpr,  # ROW_SCALE: source columns summed per loop step
    CAUSAL: tl.constexpr,
    BLOCK_T: tl.constexpr,  # ROTARY: T rounded up to a power of 2
    PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    USE_PDL: tl.constexpr = False,  # launched with programmatic dependent launch (common.pdl_launch)
):
    wait_for_earlier_kernels(USE_PDL)
    split = tl.program_id(0)
    row_head = tl.program_id(1)  # b * Hkv + kv_head
    m_block = tl.program_id(2)
    b = row_head // num_kv_heads
    kv_head = row_head % num_kv_heads
    slot = tl.load(slot_ids_ptr + b).to(tl.int64)
    start = tl.load(start_pos_ptr + b).to(tl.int32)
    dtype = cache_ptr.dtype.element_ty

    # Tile rows: the GROUP q heads of this kv head times T tokens, row = g * T + t; rows past
    # GROUP * T are padding (BLOCK_M is a power of 2 >= 16 for tl.dot) and are never stored.
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * T
    head = kv_head * GROUP + rows // T  # q head of each row, [BLOCK_M]
    token = rows % T
    out_rows = (b.to(tl.int64) * T + token) * (num_kv_heads * GROUP) + head  # row of contiguous [B, T, Hq]

    query_pos = start + token  # cache position of each query; it sees keys at positions <= query_pos
    dims = tl.arange(0, HEAD_DIM)
    q_rows = b.to(tl.int64) * stride_qb + head.to(tl.int64) * stride_qh + token.to(tl.int64) * stride_qt
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)

    # Keys this row can see at all (the last query's window), clamped to the cache capacity, cut into
    # num_splits chunks of whole BLOCK_N blocks (or fixed split_keys chunks): split `split` covers
    # positions [lo, hi).
    kv_len = tl.minimum(start + T, seq_capacity)
    chunk = tl.cdiv(tl.cdiv(kv_len, num_splits), BLOCK_N) * BLOCK_N
    if split_keys > 0:
        chunk = split_keys
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    if SPLIT:
        # The split count follows the cache's capacity (a static grid), so at a short context most
        # splits start past the row's keys: they store an empty partial (log-sum-exp -inf, output 0,
        # what the loop below would leave) and go no further. The step's new keys lie below kv_len, in
        # no such split. q's load comes first all the same: after this test it would wait for start_pos.
        if lo >= kv_len:
            empty_out = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
            empty_lse = tl.full([BLOCK_M], float("-inf"), tl.float32)
            store_partial(part_out_ptr, part_lse_ptr, out_rows, num_splits, split, empty_out, empty_lse, dims, row_ok)
            return

    # ROTARY: q arrives unrotated and is rotated here, in registers (rotate_half pairs column d with
    # d +- D/2). Same rounding as the rotary kernel, so the rotated q is bit for bit what it stores.
    first_half = dims < HEAD_DIM // 2
    partner = tl.where(first_half, dims + HEAD_DIM // 2, dims - HEAD_DIM // 2)
    steps = tl.arange(0, BLOCK_T)  # ROTARY: this step's T positions, padded
    if ROTARY:
        q_partner = tl.load(q_ptr + q_rows[:, None] + partner[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
        if ROW_SCALE:  # row_scale's arithmetic: rsqrt(mean(src^2) + eps) per position, one rounding of the product
            step_scale = row_inverse_rms(row_ptr, b.to(tl.int64), steps, T, stride_rb, stride_rt, row_eps, ROW_WIDTH,
                                         ROW_BLOCK)  # fmt: skip
            q_scale = tl.sum(tl.where(token[:, None] == steps[None, :], step_scale[None, :], 0.0), 1)[:, None]
            q = round_to(q.to(tl.float32) * q_scale, dtype)
            q_partner = round_to(q_partner.to(tl.float32) * q_scale, dtype)
        if QK_NORM:  # each row is one head: normalize it (and its partner columns) first, as rms_norm would
            q, q_partner = norm_heads(q, q_partner, q_norm_ptr, dims, partner, norm_eps, HEAD_DIM, dtype)
        q_cos, q_sin = rope_rows(
            cos_ptr, sin_ptr, b.to(tl.int64), token, dims, stride_cosb, stride_cost, stride_cosd,
            stride_sinb, stride_sint, stride_sind, row_ok[:, None], dtype,
        )  # fmt: skip
        q = rope(q, q_partner, q_cos, q_sin, first_half[None, :], dtype).to(dtype)
    if UPCAST_DOT:
        q = q.to(tl.float32)

    # Slot base in int64: layer/slot/head offsets of an H200-sized cache exceed 2**31 elements. Offsets
    # inside one (layer, kind, slot, head) plane stay int32 (the launcher checks S * stride_s < 2**31).
    key_base = cache_ptr + layer.to(tl.int64) * stride_cl + slot * stride_cslot + kv_head.to(tl.int64) * stride_ch
    value_base = key_base + stride_ckind

    if ROTARY:
        # This step's keys (positions start .. start+T-1) enter the cache here, rotated, written by the
        # programs whose chunk [lo, hi) holds them, before the loop below reads them like any other key.
        # The loop is the plain kernel's, so the result is bit for bit that of rotary_kv_write then
        # attention. Every query tile (m_block) of a chunk stores the same bytes, so each reads back
        # what it stored; the barrier makes the program's global stores visible to all its threads.
        new_pos = start + steps
        own = (steps < T) & (new_pos >= lo) & (new_pos < hi)
        k_rows = b.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh + steps.to(tl.int64) * stride_kt
        k_new = tl.load(k_ptr + k_rows[:, None] + dims[None, :] * stride_kd, mask=own[:, None], other=0.0)
        k_partner = tl.load(k_ptr + k_rows[:, None] + partner[None, :] * stride_kd, mask=own[:, None], other=0.0)
        if ROW_SCALE:
            k_new = round_to(k_new.to(tl.float32) * step_scale[:, None], dtype)
            k_partner = round_to(k_partner.to(tl.float32) * step_scale[:, None], dtype)
        if QK_NORM:
            k_new, k_partner = norm_heads(k_new, k_partner, k_norm_ptr, dims, partner, norm_eps, HEAD_DIM, dtype)
        k_cos, k_sin = rope_rows(
            cos_ptr, sin_ptr, b.to(tl.int64), steps, dims, stride_cosb, stride_cost, stride_cosd,
            stride_sinb, stride_sint, stride_sind, own[:, None], dtype,
        )  # fmt: skip
        k_rot = rope(k_new, k_partner, k_cos, k_sin, first_half[None, :], dtype).to(dtype)
        v_rows = b.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh + steps.to(tl.int64) * stride_vt
        v_new = tl.load(v_ptr + v_rows[:, None] + dims[None, :] * stride_vd, mask=own[:, None], other=0.0)
        if ROW_SCALE:
            v_new = round_to(v_new.to(tl.float32) * step_scale[:, None], dtype)
        # A slot outside the cache gets no write, as kv_write drops out-of-range targets.
        # HACK(triton<=3.9 interpreter): `block & scalar` of bools comes out as an int32 mask that
        # tl.store refuses; tl.where keeps it bool (as in kernels/rotary_kv_write.py).
        write = tl.where((slot >= 0) & (slot < slots), own, False)
        new_offsets = new_pos[:, None] * stride_cs + dims[None, :] * stride_cd
        tl.store(key_base + new_offsets, k_rot, mask=write[:, None])
        tl.store(value_base + new_offsets, v_new.to(dtype), mask=write[:, None])
        tl.debug_barrier()

    # Online softmax state. m_i starts finite so a row with no visible key in a block gets
    # exp2(-inf - m_i) = 0 and alpha = 1, never NaN from (-inf) - (-inf).
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for block_start in range(lo, hi, BLOCK_N):
        pos = block_start + offs_n  # [BLOCK_N] key positions
        in_range = pos < hi  # the last block of a chunk may run past it; masked keys/values load as 0
        kv_offsets = pos[:, None] * stride_cs + dims[None, :] * stride_cd
        k = tl.load(key_base + kv_offsets, mask=in_range[:, None], other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if CAUSAL:  # query at query_pos sees key positions <= query_pos
            visible = (pos[None, :] <= query_pos[:, None]) & in_range[None, :]
        else:  # the whole block: every key of the chunk (hi <= kv_len = start + T), for every query
            visible = in_range[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # Values past `hi` load as 0 (the cache beyond a row's length may hold garbage, even NaN).
        v = tl.load(value_base + kv_offsets, mask=in_range[:, None], other=0.0)
        # P is rounded to the value dtype (bf16 on GPU) for the tensor-core dot, as flash attention does.
        if UPCAST_DOT:
            p, v = round_to(p, v.dtype), v.to(tl.float32)
        else:
            p = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    let_later_kernels_launch(USE_PDL)  # the reduce (or a GEMV) follows: its programs are resident when this ends

    has_keys = l_i > 0  # false for rows whose window misses this split entirely
    norm = tl.where(has_keys, l_i, 1.0)
    if SPLIT:
        lse = tl.where(has_keys, m_i + tl.log2(norm), float("-inf"))
        store_partial(part_out_ptr, part_lse_ptr, out_rows, num_splits, split, acc / norm[:, None], lse, dims, row_ok)
    else:
        out = round_to(acc / norm[:, None], out_ptr.dtype.element_ty)
        tl.store(
            out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )


@triton.jit
def attention_reduce_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    CHUNK: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    wait_for_earlier_kernels(USE_PDL)
    let_later_kernels_launch(USE_PDL)  # a GEMV follows: its programs ask for their first weight tiles meanwhile
    # One program per output row (b, t, h), the row index of contiguous [B, T, Hq]; combines that
    # row's num_splits partials: out = sum_s 2^(lse_s - top) * out_s / sum_s 2^(lse_s - top).
    # Summed CHUNK splits at a time like the outputs (not in one BLOCK_SPLITS-wide sum): splits past the
    # row's window weigh exactly 0, so the result does not depend on how many splits the cache has. The
    # first chunk's partials are asked for with the log-sum-exps, before `top` is waited for: one L2 round
    # trip where the splits fit one chunk (reduce_launch makes it hold up to MAX_REDUCE_CHUNK splits).
    row = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    splits = tl.arange(0, BLOCK_SPLITS)
    lse = tl.load(part_lse_ptr + row * num_splits + splits, mask=splits < num_splits, other=float("-inf"))
    chunk = tl.arange(0, CHUNK)
    ok = chunk < num_splits
    chunk_lse = tl.load(part_lse_ptr + row * num_splits + chunk, mask=ok, other=float("-inf"))
    parts = tl.load(
        part_out_ptr + (row * num_splits + chunk)[:, None] * HEAD_DIM + dims[None, :], mask=ok[:, None], other=0.0
    )
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # guard: a row with no keys at all stays finite
    weight = tl.exp2(chunk_lse - top)
    acc = tl.full([HEAD_DIM], 0.0, tl.float32) + tl.sum(parts * weight[:, None], 0)
    total = 0.0 + tl.sum(weight, 0)
    for first in range(CHUNK, num_splits, CHUNK):  # CHUNK partial rows at a time keep registers bounded
        chunk = first + tl.arange(0, CHUNK)
        ok = chunk < num_splits
        weight = tl.exp2(tl.load(part_lse_ptr + row * num_splits + chunk, mask=ok, other=float("-inf")) - top)
        parts = tl.load(
            part_out_ptr + (row * num_splits + chunk)[:, None] * HEAD_DIM + dims[None, :], mask=ok[:, None], other=0.0
        )
        acc += tl.sum(parts * weight[:, None], 0)
        total += tl.sum(weight, 0)
    out = round_to(acc / total, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


def reduce_launch(splits: int, head_dim: int, fixed_splits: bool) -> tuple[int, int]:
    """(chunk, num_warps) of attention_reduce_kernel for `splits` partials of head_dim values a row. Fixed-size splits
    (the "invariant" row) keep REDUCE_CHUNK: there a row's splits past its keys weigh exactly 0 and are summed in
    chunks of their own, so the result does not depend on the split count (the cache's capacity)."""
    chunk = REDUCE_CHUNK if fixed_splits else min(MAX_REDUCE_CHUNK, max(REDUCE_CHUNK, next_power_of_2(splits)))
    warps = max(REDUCE_WARPS, chunk // REDUCE_ROWS_PER_WARP, chunk * head_dim // REDUCE_ELEMENTS_PER_WARP)
    return chunk, warps


def num_splits(
    batch: int, kv_heads: int, m_blocks: int, seq_capacity: int, block_n: int, programs_per_sm: int, sms: int
) -> int:
    """Split-K factor: as many splits as keep the programs within programs_per_sm per SM (one wave: a
    count rounded up past it leaves a second wave of a few programs, 1.25x slower at B = 16 on an H200),
    at most one split per key block of the cache and MAX_SPLITS. A function of shapes only, so a CUDA
    graph replays the same grid."""
    programs = batch * kv_heads * m_blocks
    return max(1, min(MAX_SPLITS, cdiv(seq_capacity, block_n), programs_per_sm * sms // programs))


def attention(
    q: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    block_n: int = CONFIGS["default"]["block_n"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    num_stages: int = CONFIGS["default"]["num_stages"],
    programs_per_sm: int = CONFIGS["default"]["programs_per_sm"],
    block_m: int = CONFIGS["default"]["block_m"],
    split_keys: int = CONFIGS["default"]["split_keys"],
    wave_block_n: int = CONFIGS["default"]["wave_block_n"],
    rotary: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    qk_norm: tuple[Tensor, Tensor, float] | None = None,
    row_scale: tuple[Tensor, float] | None = None,
    causal: bool = True,
) -> Tensor:
    """Launch attention_kernel (+ attention_reduce_kernel when split). Same result as
    graphspec.ops.attention_reference; returns a new contiguous [B, T, Hq, D] tensor of q's dtype.

    rotary=(k, v, cos, sin) fuses this step's rotary and KV write in (graphspec::rotary_kv_attention):
    q and k [B, Hkv, T, D] arrive unrotated, the rotated k and v are written into the cache at
    positions start_pos[b] + t of slot slot_ids[b] and attended to, as rotary_kv_write then attention
    would (the same bits). k, v and the cache share q's dtype; cos/sin are [B, T, D].
    qk_norm=(q_weight, k_weight, eps) (with rotary only) first rms_norms each head of q and of the
    step's k over D, as graphspec::rms_norm would (to its fp32 rounding).
    row_scale=(src, eps) (with rotary only): q, k and v are first scaled by the RMSNorm row scale of src
    [B, T, hidden] (unit-stride rows) at their (b, t), as graphspec::row_scale would (to its fp32 rounding).
    causal=False: graphspec::block_attention's window (every query sees the whole block).
    block_m/split_keys > 0 fix the query tile and the split size (the "invariant" config row); wave_block_n > 0:
    one unsplit program per tile, that many keys a step, where the tiles make one wave (WAVE_FILL)."""
    check_device(q, cache, *(rotary or ()))
    batch, q_heads, t, head_dim = q.shape
    kv_heads, seq_capacity = cache.shape[3], cache.shape[4]
    if q.dtype != cache.dtype or q_heads % kv_heads or head_dim != cache.shape[5]:
        raise ValueError(
            f"attention kernel: q {tuple(q.shape)} {q.dtype} does not match cache {tuple(cache.shape)} {cache.dtype}"
        )
    if rotary is not None:
        k, v, cos, sin = rotary
        kv_shape, table_shape = (batch, kv_heads, t, head_dim), (batch, t, head_dim)
        if tuple(k.shape) != kv_shape or tuple(v.shape) != kv_shape or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError(
                f"attention kernel: k/v must be {kv_shape} {q.dtype}, got {k.shape} {k.dtype}, {v.shape} {v.dtype}"
            )
        if tuple(cos.shape) != table_shape or tuple(sin.shape) != table_shape:
            raise ValueError(
                f"attention kernel: cos/sin must be {table_shape}, got {tuple(cos.shape)}, {tuple(sin.shape)}"
            )
    else:
        k = v = cos = sin = q  # unused: ROTARY is off; strides below are placeholders
    if qk_norm is not None:
        q_weight, k_weight, norm_eps = qk_norm
        if rotary is None or any(w.shape != (head_dim,) or w.stride(0) != 1 for w in (q_weight, k_weight)):
            raise ValueError(f"attention kernel: qk_norm needs rotary and contiguous [{head_dim}] weights")
    else:
        q_weight = k_weight = q  # unused: QK_NORM is off
        norm_eps = 0.0
    if row_scale is not None:
        row_src, row_eps = row_scale
        if rotary is None or row_src.dim() != 3 or tuple(row_src.shape[:2]) != (batch, t) or row_src.stride(2) != 1:
            raise ValueError(
                f"attention kernel: row_scale needs rotary and unit-stride [{batch}, {t}, hidden] rows, "
                f"got {tuple(row_src.shape)}"
            )
    else:
        row_src, row_eps = q, 0.0  # unused: ROW_SCALE is off
    row_width = row_src.shape[-1] if row_scale is not None else 1
    if (seq_capacity - 1) * cache.stride(4) + (head_dim - 1) * cache.stride(5) >= 2**31:
        raise ValueError("attention kernel: one cache plane (S * D) must stay below 2**31 elements")
    out = torch.empty((batch, t, q_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    group = q_heads // kv_heads
    block_m = block_m or min(MAX_BLOCK_M, max(16, next_power_of_2(group * t)))
    m_blocks = cdiv(group * t, block_m)
    # HACK(triton<=3.9 interpreter): tl.dot on bf16/fp16 operands returns garbage under
    # TRITON_INTERPRET=1; there the kernel upcasts the (exactly representable) operands to fp32.
    # Remove when the interpreter's dot handles 16-bit floats.
    upcast = q.device.type != "cuda" and q.dtype != torch.float32
    sms = sm_count(q.device)
    one_wave = bool(wave_block_n) and not split_keys and WAVE_FILL * sms < batch * kv_heads * m_blocks <= sms
    if one_wave:
        block_n = wave_block_n
    block_n, num_stages = fit_shared_memory(q, block_m, block_n, num_stages)
    if split_keys:
        if split_keys % block_n:
            raise ValueError(f"attention kernel: split_keys ({split_keys}) must be a multiple of block_n ({block_n})")
        splits = cdiv(seq_capacity, split_keys)
    elif one_wave:
        splits = 1
    else:
        splits = num_splits(batch, kv_heads, m_blocks, seq_capacity, block_n, programs_per_sm, sms)
    pdl = pdl_launch(q.device)
    if splits > 1:
        part_out = torch.empty((batch, t, q_heads, splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, t, q_heads, splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused: the single split writes `out` directly
    attention_kernel[(splits, batch * kv_heads, m_blocks)](
        q,
        cache,
        slot_ids,
        start_pos,
        out,
        part_out,
        part_lse,
        k,
        v,
        cos,
        sin,
        q_weight,
        k_weight,
        row_src,
        layer,
        scale * LOG2E,
        norm_eps,
        row_eps,
        seq_capacity,
        cache.shape[2],
        kv_heads,
        splits,
        split_keys,
        *q.stride(),
        *cache.stride(),
        *k.stride()[:4],
        *v.stride()[:4],
        *cos.stride()[:3],
        *sin.stride()[:3],
        *row_src.stride()[:2],
        T=t,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SPLIT=splits > 1,
        ROTARY=rotary is not None,
        QK_NORM=qk_norm is not None,
        ROW_SCALE=row_scale is not None,
        ROW_WIDTH=row_width,
        ROW_BLOCK=min(next_power_of_2(row_width), max(1, ROW_TILE // next_power_of_2(t))),
        CAUSAL=causal,
        BLOCK_T=next_power_of_2(t),
        PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32",
        UPCAST_DOT=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl,
    )
    if splits > 1:
        chunk, reduce_warps = reduce_launch(splits, head_dim, fixed_splits=bool(split_keys))
        attention_reduce_kernel[(batch * q_heads * t,)](
            part_out, part_lse, out, splits,
            HEAD_DIM=head_dim, BLOCK_SPLITS=next_power_of_2(splits), CHUNK=chunk, num_warps=reduce_warps, **pdl,
        )  # fmt: skip
    return out


@library.op("graphspec::attention_triton", mutates_args=())
def attention_triton(
    q: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    block_n: int,
    num_warps: int,
    num_stages: int,
    programs_per_sm: int,
    block_m: int,
    split_keys: int,
    wave_block_n: int,
) -> Tensor:
    """graphspec::attention lowered to attention_kernel; the trailing ints are CONFIG_FIELDS."""
    config = (block_n, num_warps, num_stages, programs_per_sm, block_m, split_keys, wave_block_n)
    return attention(q, cache, layer, slot_ids, start_pos, scale, *config)


@torch.library.register_fake("graphspec::attention_triton")
def _(q, cache, layer, slot_ids, start_pos, scale, *config):
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))
