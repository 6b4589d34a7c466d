"""graphspec::verify_rejection as Triton kernels: lossless rejection sampling without sorting the vocab.

Semantics are graphspec.ops.verify_rejection_reference. Per row b, with p = process_logits(target)
[B, K+1, V] and q = process_logits(draft) [B, K, V] (temperature, then top-k, then top-p):
accept draft d_j while u_j * q_j(d_j) < p_j(d_j), u_j = ops.uniform(seed, counter, ACCEPT_LANE + j);
at the first rejection n (or n = K) draw from max(0, p_n - q_n) (q_K = 0; p_n itself if that is all
zero) by inverse CDF with ops.uniform(seed, counter, RESAMPLE_LANE). The uniforms are the same
counter-based hash, bit for bit, so a row's result does not depend on the kernel or the batch.

Where the reference sorts, the kernels search: a filtered distribution keeps exactly the tokens whose
scaled logit s = logits / temperature is >= a threshold, so each processed distribution ("stat row":
the K+1 target and K draft positions of every batch row, R = B * (2K+1) in all) is described by
(max m, argmax, threshold, normalizer Z) and p(i) = w_i / Z for s_i >= threshold, w_i the fixed-point
weight trunc(exp(s_i - m) * 2**WEIGHT_BITS) of ops.sampling_weights and Z the exact int64 sum of the
kept weights (a one-hot at the argmax for greedy rows, temperature <= 0). Thresholds are found by a
multi-probe search over the order key of the fp32 s (ops.order_key: key = bits ^ ((bits >> 31) &
0x7FFFFFFF) on its int32 bit pattern, written out inline, since under TRITON_INTERPRET=1 every nested
jit call costs milliseconds). Each search pass counts, for NPROBE candidate keys at once, the weight
above each candidate, so 32 key bits take 8 passes at 16:
  top-k threshold: the smallest key x with  #{key > x} < top_k                  (= the top_k-th largest key)
  top-p threshold: the smallest key x with  float64(W{key > x}) < top_p * float64(Z_k)   (W within the top-k set)
which is ops.sampling_weights' rule (ties with the threshold all kept). Every count and mass is an
exact integer sum, so thresholds and Z do not depend on how the vocab is split: graphspec::sample's
kernel (kernels/sample.py, the same stats passes) and this one compute the same q bit for bit.

Work is split so that batch 1 still fills the GPU: every pass is one launch of
verify_rejection_stats_kernel over (stat row, vocab split) programs, each scanning one chunk of the
vocab and writing a partial (max/argmax, mass, or per-probe weights). A pass's programs first combine
the previous pass's partials into the row's search state (every program of a row computes the same
state; split 0 stores it), so no launch waits on the host and the launch sequence is static:
    MAX, SEARCH_K x NPASS, MASS_K, SEARCH_P x NPASS, MASS
(passes of a search that is off for a row, or already converged, do nothing for it). Before them,
kernels/candidates.py decides from each row's top `candidates` logits (torch.topk) every row whose
result they provably settle (most top-k and top-p rows of a trained model), and once more after MASS_K
(top-p alone needs the full-vocab Z); the passes give decided rows empty chunks, so their launches
scan nothing for them, and the final state and MASS partials describe a decided row exactly as the
searches would have (its Z in split 0). State and partials are double-buffered by launch parity.
verify_rejection_residual_kernel then decides the accept count and writes per-split sums of the
residual, and verify_rejection_kernel draws the token (finds the split whose prefix crosses u * total,
then scans inside it) and writes the outputs.

Differences from the reference: tl.exp and torch.exp may differ in the last fp32 bit, which moves a
weight by a few fp32 ulps of itself (a decision exactly at a bound can then go the other way); the
residual draw sums float64 (p - q) per split where the reference's cumulative sum is sequential.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from graphspec.kernels import candidates
from graphspec.kernels.candidates import CAND_WIDTH, DONE, MAX_KNOWN
from graphspec.kernels.common import (
    PROGRAMS_PER_SM,
    cdiv,
    check_config_table,
    check_device,
    next_power_of_2,
    sm_count,
)
from torch import Tensor

from graphspec import library
from graphspec.ops import ACCEPT_LANE, RESAMPLE_LANE, WEIGHT_BITS, verify_rejection_reference

__all__ = ["CONFIGS", "verify_rejection", "verify_rejection_reference", "verify_rejection_triton"]

# block_v: vocab entries per loop step; nprobe: thresholds tested per search pass (a power of 2);
# num_warps: per program; chunk_v: most vocab entries one program scans per pass (more splits below it);
# candidates: top logits per stat row that decide it without the passes when they can (0: off).
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_v": 1024, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
    90: {"block_v": 1024, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
    "default": {"block_v": 512, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
}
CONFIG_FIELDS = check_config_table(CONFIGS)

MAX_SPLITS = 64  # vocab splits per stat row (the combine step holds one partial per split)
# Pass kinds (constexpr PHASE / PREVIOUS of verify_rejection_stats_kernel); NONE: no previous pass.
NONE, MAX, SEARCH_K, MASS_K, SEARCH_P, MASS = -1, 0, 1, 2, 3, 4
# ops.sampling_weights' fixed-point scale: a weight is trunc(exp(s - max) * WEIGHT_SCALE) as int64 (the
# fp32 product is exact), so every mass below is an exact integer sum, the same in any split or order.
WEIGHT_SCALE = tl.constexpr(float(2**WEIGHT_BITS))
NEG_INF_BITS = tl.constexpr(-8388608)  # int32 bit pattern of fp32 -inf (0xFF800000)


@triton.jit
def _fmix32(x):
    # murmur3 finalizer on uint32 (products wrap mod 2**32, as the reference's `& 0xFFFFFFFF` does).
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def uniform(seed, counter, lane):
    """graphspec.ops.uniform for int64 seed/counter scalars and an int32 lane tensor: float64 in [0, 1)."""
    seed_lo = seed.to(tl.uint32)  # int64 -> uint32 truncates: the low 32 bits, as `seed & MASK32`
    seed_hi = (seed >> 32).to(tl.uint32)  # (seed >> 32) & MASK32
    key = _fmix32(seed_lo ^ _fmix32(counter.to(tl.uint32) * 0x9E3779B1))
    key = _fmix32(key ^ _fmix32(seed_hi + lane.to(tl.uint32) * 0x632BE5AB))
    high = _fmix32(key ^ 0x5BD1E995) >> 6  # 26 bits
    low = _fmix32(key ^ 0x27D4EB2F) >> 5  # 27 bits
    return (high.to(tl.float64) * 134217728.0 + low.to(tl.float64)) * (1.0 / 9007199254740992.0)


@triton.jit
def verify_rejection_stats_kernel(
    target_ptr,
    draft_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    part_in_ptr,  # int64 [R, splits, NPROBE]: the previous pass's partials (MAX: fp32 bits of the max)
    part_out_ptr,
    index_in_ptr,  # int32 [R, splits]: partial argmax of the MAX pass
    index_out_ptr,
    state_in_ptr,  # int64 [R, 4]: search lo, search hi, threshold key, argmax
    state_out_ptr,
    fstate_in_ptr,  # float64 [R, 4]: max scaled logit, Z_k, search bound, unused
    fstate_out_ptr,
    cand_ptr,  # int64 [R, CAND_WIDTH]: what kernels/candidates.py decided from the row's top candidates
    vocab,
    num_splits,
    stride_tb,
    stride_tj,
    stride_tv,
    stride_db,
    stride_dj,
    stride_dv,
    K: tl.constexpr,
    PHASE: tl.constexpr,
    PREVIOUS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NPROBE: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)  # stat row: b * (2K+1) + i, i <= K target position i, else draft position i-K-1
    split = tl.program_id(1)
    b = row // (2 * K + 1)
    i = row % (2 * K + 1)
    is_target = i <= K
    b64 = b.to(tl.int64)
    row_ptr = tl.where(
        is_target,
        target_ptr + b64 * stride_tb + i.to(tl.int64) * stride_tj,
        draft_ptr + b64 * stride_db + (i - K - 1).to(tl.int64) * stride_dj,
    )
    stride_v = tl.where(is_target, stride_tv, stride_dv)
    temperature = tl.load(temperature_ptr + b).to(tl.float32)
    sampled = temperature > 0
    temperature = tl.where(sampled, temperature, 1.0)  # greedy rows: plain logits, only the argmax is used
    top_k = tl.load(top_k_ptr + b).to(tl.int64)
    top_p = tl.load(top_p_ptr + b).to(tl.float32)
    active_k = sampled & (top_k > 0) & (top_k < vocab)  # top-k is on for this row
    active_p = sampled & (top_p < 1.0)  # top-p is on for this row
    # Rows the candidates decided (DONE: final threshold and Z known) skip every vocab scan; rows whose
    # max they know (MAX_KNOWN) skip the MAX scan. Flags only ever get set between passes, never cleared.
    flags = tl.load(cand_ptr + row * CAND_WIDTH)
    done = (flags & DONE) != 0
    undecided = (flags & DONE) == 0  # (`~` on a scalar int1 trips the interpreter)
    max_known = (flags & MAX_KNOWN) != 0
    search_k = active_k & undecided  # the top-k search runs for this row
    search_p = active_p & undecided  # the top-p search runs for this row

    # ---- Combine: the row's state after the previous pass (identical in every program of the row).
    lo = tl.full([], 0, tl.int64)  # the searched threshold key lies in (lo, hi]
    hi = tl.full([], 0, tl.int64)
    threshold = tl.full([], -2147483648, tl.int64)  # keep every token until a search sets it
    argmax = tl.full([], 0, tl.int64)
    row_max = tl.full([], float("-inf"), tl.float32)
    mass_k = tl.full([], 0.0, tl.float64)
    bound = tl.full([], 0.0, tl.float64)
    if PREVIOUS != -1:
        lo = tl.load(state_in_ptr + row * 4)
        hi = tl.load(state_in_ptr + row * 4 + 1)
        threshold = tl.load(state_in_ptr + row * 4 + 2)
        argmax = tl.load(state_in_ptr + row * 4 + 3)
        row_max = tl.load(fstate_in_ptr + row * 4).to(tl.float32)  # stored exactly as float64
        mass_k = tl.load(fstate_in_ptr + row * 4 + 1)
        bound = tl.load(fstate_in_ptr + row * 4 + 2)
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits
    parts = (row * num_splits + splits).to(tl.int64) * NPROBE  # first partial of each split
    if PREVIOUS == 0:  # MAX: the overall max, then the smallest index holding it (torch.argmax's first)
        maxima = tl.load(part_in_ptr + parts, mask=split_ok, other=NEG_INF_BITS).to(tl.int32)
        maxima = maxima.to(tl.float32, bitcast=True)
        indices = tl.load(index_in_ptr + row * num_splits + splits, mask=split_ok, other=2147483647)
        row_max = tl.max(maxima, 0)
        argmax = tl.min(tl.where(maxima == row_max, indices, 2147483647), 0).to(tl.int64)
        # Top-k search range: #{key > INT32_MIN - 1} = V >= top_k fails at lo; #{key > INT32_MAX} = 0
        # holds at hi (not key(max): tl.max may return -0.0 where +0.0, a larger key, is also present).
        lo = tl.full([], -2147483649, tl.int64)
        hi = tl.full([], 2147483647, tl.int64)
        bound = top_k.to(tl.float64)
    if (PREVIOUS == 1) | (PREVIOUS == 3):  # a search pass: move (lo, hi] onto the probes that bracket it
        active = search_k if PREVIOUS == 1 else search_p
        if active & (hi - lo > 1):
            probe = tl.arange(0, NPROBE)
            weights = tl.load(part_in_ptr + parts[:, None] + probe[None, :], mask=split_ok[:, None], other=0)
            weight_above = tl.sum(weights, 0)  # [NPROBE] int64 W(key > probe) over the whole vocab, exact
            # The predicate fails on a prefix of the probes (the sums are non-increasing in the probe and
            # the int64 -> float64 conversion is monotone); the answer lies in (probe f-1, probe f].
            failing = tl.sum((weight_above.to(tl.float64) >= bound).to(tl.int64), 0)
            width = hi - lo
            hi = lo + (width * (failing + 1) + (NPROBE - 1)) // NPROBE
            lo = lo + (width * failing + (NPROBE - 1)) // NPROBE
    if PREVIOUS == 2:  # MASS_K: Z_k, the normalizer of the top-k set
        mass_k = tl.sum(tl.load(part_in_ptr + parts, mask=split_ok, other=0), 0).to(tl.float64)
    if PHASE == 2:  # after the last top-k pass: (lo, hi] has narrowed to the threshold key hi
        threshold = tl.where(active_k, hi, -2147483648)
    if (PHASE == 3) & (PREVIOUS == 2):
        # Top-p search range: mass{key > threshold - 1} = Z_k fails at lo (top_p < 1); 0 holds at INT32_MAX.
        lo = threshold - 1
        hi = tl.full([], 2147483647, tl.int64)
        bound = top_p.to(tl.float64) * mass_k  # float64, as ops.sampling_weights
    if PHASE == 4:  # after the last top-p pass
        threshold = tl.where(active_p, hi, threshold)
    # A decided row's threshold is the candidates' (once set, the same in every later pass).
    threshold = tl.where(done, tl.load(cand_ptr + row * CAND_WIDTH + 2), threshold)

    # ---- Work: this program's vocab chunk [start_v, end_v), equal chunks of whole blocks.
    chunk = tl.cdiv(tl.cdiv(vocab, num_splits), BLOCK_V) * BLOCK_V
    start_v = split * chunk
    end_v = tl.minimum(start_v + chunk, vocab)
    # Rows that need no scan in this pass get an empty chunk (their loops below run zero times):
    # MAX: the max is known; MASS_K: its Z_k only feeds top-p's bound (greedy rows never use a mass);
    # MASS: a decided row's Z is the candidates' (greedy rows need none).
    if PHASE == 0:
        end_v = tl.where(max_known, start_v, end_v)
    if PHASE == 2:
        end_v = tl.where(search_p, end_v, start_v)
    if PHASE == 4:
        end_v = tl.where(undecided & sampled, end_v, start_v)
    first = split == 0
    out = (row * num_splits + split).to(tl.int64) * NPROBE
    if PHASE == 0:  # MAX: partial max of s and its first index (a later block wins only if larger)
        best = tl.full([], float("-inf"), tl.float32)
        best_index = start_v
        for start in range(start_v, end_v, BLOCK_V):
            index = start + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptr + index.to(tl.int64) * stride_v, mask=index < end_v, other=float("-inf"))
            s = tl.math.div_rn(x.to(tl.float32), temperature)  # IEEE divide, as the reference's logits / t
            block_max, block_arg = tl.max(s, 0, return_indices=True, return_indices_tie_break_left=True)
            better = block_max > best
            best_index = tl.where(better, start + block_arg, best_index)
            best = tl.where(better, block_max, best)
        best_bits = best.to(tl.int32, bitcast=True).to(tl.int64)  # the fp32 bits
        # A known max and argmax go to split 0; the other splits report -inf, which never ties with a
        # known greedy max (it is above the smallest candidate) and leaves a sampled row's max alone.
        best_bits = tl.where(max_known & first, tl.load(cand_ptr + row * CAND_WIDTH + 4), best_bits)
        known_index = tl.load(cand_ptr + row * CAND_WIDTH + 1).to(tl.int32)
        best_index = tl.where(max_known & first, known_index, best_index)
        tl.store(part_out_ptr + out, best_bits)
        tl.store(index_out_ptr + row * num_splits + split, best_index)
    if (PHASE == 1) | (PHASE == 3):  # a search pass: W(key > probe) over the chunk for NPROBE probes
        active = search_k if PHASE == 1 else search_p
        if active & (hi - lo > 1):
            width = hi - lo
            step = (tl.arange(0, NPROBE) + 1).to(tl.int64)
            # probe j = lo + ceil(width * (j+1) / NPROBE), in (lo, hi]: int32, since lo >= INT32_MIN - 1
            probes = (lo + (width * step + (NPROBE - 1)) // NPROBE).to(tl.int32)
            weight_above = tl.full([NPROBE], 0, tl.int64)
            for start in range(start_v, end_v, BLOCK_V):
                index = start + tl.arange(0, BLOCK_V)
                ok = index < end_v
                x = tl.load(row_ptr + index.to(tl.int64) * stride_v, mask=ok, other=float("-inf"))
                s = tl.math.div_rn(x.to(tl.float32), temperature)
                bits = s.to(tl.int32, bitcast=True)
                key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # order key
                key = tl.where(ok, key, -2147483648)  # padding lanes: INT32_MIN, never above a probe (> lo)
                above = key[:, None] > probes[None, :]  # [BLOCK_V, NPROBE]
                if PHASE == 1:  # top-k counts tokens
                    weight_above += tl.sum(above.to(tl.int32), 0).to(tl.int64)
                else:  # top-p sums fixed-point weights; keys above a probe (>= lo + 1 = threshold_k) are top-k
                    weight = tl.where(ok, (tl.exp(s - row_max) * WEIGHT_SCALE).to(tl.int64), 0)
                    weight_above += tl.sum(tl.where(above, weight[:, None], 0), 0)
            tl.store(part_out_ptr + out + tl.arange(0, NPROBE), weight_above)
    if (PHASE == 2) | (PHASE == 4):  # MASS_K / MASS: partial sum of the kept tokens' fixed-point weights
        total = tl.full([], 0, tl.int64)
        for start in range(start_v, end_v, BLOCK_V):
            index = start + tl.arange(0, BLOCK_V)
            ok = index < end_v
            x = tl.load(row_ptr + index.to(tl.int64) * stride_v, mask=ok, other=float("-inf"))
            s = tl.math.div_rn(x.to(tl.float32), temperature)
            bits = s.to(tl.int32, bitcast=True)
            key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # order key
            weight = (tl.exp(s - row_max) * WEIGHT_SCALE).to(tl.int64)
            total += tl.sum(tl.where(ok & (key >= threshold), weight, 0), 0)
        if PHASE == 4:  # a decided row's Z, all in split 0 (the splits' sum is what consumers read)
            total = tl.where(done & sampled & first, tl.load(cand_ptr + row * CAND_WIDTH + 3), total)
        tl.store(part_out_ptr + out, total)

    # Split 0 carries the row's state to the next pass.
    tl.store(state_out_ptr + row * 4, lo, mask=first)
    tl.store(state_out_ptr + row * 4 + 1, hi, mask=first)
    tl.store(state_out_ptr + row * 4 + 2, threshold, mask=first)
    tl.store(state_out_ptr + row * 4 + 3, argmax, mask=first)
    tl.store(fstate_out_ptr + row * 4, row_max.to(tl.float64), mask=first)
    tl.store(fstate_out_ptr + row * 4 + 1, mass_k, mask=first)
    tl.store(fstate_out_ptr + row * 4 + 2, bound, mask=first)


@triton.jit
def _probability(logit_ptrs, index, ok, temperature, greedy, row_max, threshold, argmax, normalizer):
    """p(index) in float64, like process_logits, from a stat row's (max, threshold key, argmax, Z): a
    one-hot at the argmax for greedy rows, else w / Z where the key is >= the threshold, with w the
    fixed-point weight trunc(exp(s - max) * WEIGHT_SCALE) and Z the exact int64 sum of the kept w.
    Scalars or one value per lane; logit_ptrs point at the logits of (row, index)."""
    x = tl.load(logit_ptrs, mask=ok, other=float("-inf")).to(tl.float32)
    s = tl.math.div_rn(x, temperature)
    bits = s.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # order key
    weight = (tl.exp(s - row_max) * WEIGHT_SCALE).to(tl.int64)
    normalizer = tl.where(greedy, 1, normalizer)  # greedy rows have no mass (the passes skip it)
    sampled = tl.where(key >= threshold, weight.to(tl.float64) / normalizer.to(tl.float64), 0.0)
    return tl.where(ok, tl.where(greedy, (index == argmax).to(tl.float64), sampled), 0.0)


@triton.jit
def _row_stats(part_ptr, state_ptr, fstate_ptr, rows, num_splits, NPROBE: tl.constexpr, BLOCK_S: tl.constexpr):
    """(max, threshold key, argmax, Z) of stat rows `rows` (a 1-D tensor) after the last pass; Z sums
    the MASS pass's per-split partials [rows, BLOCK_S]."""
    splits = tl.arange(0, BLOCK_S)
    parts = (rows[:, None] * num_splits + splits[None, :]).to(tl.int64) * NPROBE
    normalizer = tl.sum(tl.load(part_ptr + parts, mask=(splits < num_splits)[None, :], other=0), 1)  # int64
    row_max = tl.load(fstate_ptr + rows * 4).to(tl.float32)
    threshold = tl.load(state_ptr + rows * 4 + 2)
    argmax = tl.load(state_ptr + rows * 4 + 3)
    return row_max, threshold, argmax, normalizer


@triton.jit
def _accept(
    target_ptr, draft_ptr, draft_tokens_ptr, seed_ptr, counter_ptr, part_ptr, state_ptr, fstate_ptr,
    b, temperature, greedy, num_splits, stride_tb, stride_tj, stride_tv, stride_db, stride_dj, stride_dv,
    stride_xb, stride_xj, K: tl.constexpr, ACCEPT: tl.constexpr, RESAMPLE: tl.constexpr,
    NPROBE: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """(n, resample uniform, lanes j, drafts) for batch row b: n = the number of leading drafts with
    u_j * q_j(d_j) < p_j(d_j) (float64), K when all pass. Lanes j = 0..K are padded to BLOCK_P: d_j
    for j < K, and lane K carries the resample uniform."""
    b64 = b.to(tl.int64)
    seed = tl.load(seed_ptr + b).to(tl.int64)
    counter = tl.load(counter_ptr + b).to(tl.int64)
    j = tl.arange(0, BLOCK_P)
    is_draft = j < K
    drafts = tl.load(draft_tokens_ptr + b64 * stride_xb + j * stride_xj, mask=is_draft, other=0)
    u = uniform(seed, counter, tl.where(is_draft, ACCEPT + j, RESAMPLE))  # float64 [BLOCK_P]
    # Stat rows of target position j and draft position j (padding lanes clamped onto real rows).
    target_j = tl.minimum(j, K)
    draft_j = tl.minimum(j, K - 1)
    target_rows = b * (2 * K + 1) + target_j
    draft_rows = b * (2 * K + 1) + K + 1 + draft_j
    draft_index = drafts.to(tl.int32)
    draft_offset = draft_index.to(tl.int64)
    t_max, t_threshold, t_argmax, t_z = _row_stats(part_ptr, state_ptr, fstate_ptr, target_rows, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    d_max, d_threshold, d_argmax, d_z = _row_stats(part_ptr, state_ptr, fstate_ptr, draft_rows, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    p_draft = _probability(target_ptr + b64 * stride_tb + target_j * stride_tj + draft_offset * stride_tv,
                           draft_index, is_draft, temperature, greedy, t_max, t_threshold, t_argmax, t_z)  # fmt: skip
    q_draft = _probability(draft_ptr + b64 * stride_db + draft_j * stride_dj + draft_offset * stride_dv,
                           draft_index, is_draft, temperature, greedy, d_max, d_threshold, d_argmax, d_z)  # fmt: skip
    rejected = is_draft & (u * q_draft >= p_draft)  # float64, as the reference
    accepted = tl.min(tl.where(rejected, j, K), 0)  # the first rejection, K when all pass
    u_resample = tl.sum(tl.where(j == K, u, 0.0), 0)
    return accepted, u_resample, j, drafts


@triton.jit
def verify_rejection_residual_kernel(
    target_ptr,
    draft_ptr,
    draft_tokens_ptr,
    temperature_ptr,
    seed_ptr,
    counter_ptr,
    part_ptr,  # the MASS pass's partials and the final state (see verify_rejection_stats_kernel)
    state_ptr,
    fstate_ptr,
    residual_part_ptr,  # float64 [B, splits, 2]: per-split sums of max(0, p_n - q_n) and of p_n
    vocab,
    num_splits,
    stride_tb,
    stride_tj,
    stride_tv,
    stride_db,
    stride_dj,
    stride_dv,
    stride_xb,
    stride_xj,
    K: tl.constexpr,
    ACCEPT: tl.constexpr,
    RESAMPLE: tl.constexpr,
    NPROBE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    temperature = tl.load(temperature_ptr + b).to(tl.float32)
    greedy = temperature <= 0
    temperature = tl.where(greedy, 1.0, temperature)
    accepted, _, _, _ = _accept(
        target_ptr, draft_ptr, draft_tokens_ptr, seed_ptr, counter_ptr, part_ptr, state_ptr, fstate_ptr,
        b, temperature, greedy, num_splits, stride_tb, stride_tj, stride_tv, stride_db, stride_dj, stride_dv,
        stride_xb, stride_xj, K, ACCEPT, RESAMPLE, NPROBE, BLOCK_P, BLOCK_S,
    )  # fmt: skip
    # Position n's distributions: p_n (target) and q_n (draft; q_K = 0, so none of it is read at n == K).
    b64 = b.to(tl.int64)
    draft_n = tl.minimum(accepted, K - 1)
    target_row = tl.full([1], 0, tl.int32) + b * (2 * K + 1) + accepted  # 1-element rows for _row_stats
    draft_row = tl.full([1], 0, tl.int32) + b * (2 * K + 1) + K + 1 + draft_n
    t_max, t_threshold, t_argmax, t_z = _row_stats(part_ptr, state_ptr, fstate_ptr, target_row, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    d_max, d_threshold, d_argmax, d_z = _row_stats(part_ptr, state_ptr, fstate_ptr, draft_row, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    target_logits = target_ptr + b64 * stride_tb + accepted.to(tl.int64) * stride_tj
    draft_logits = draft_ptr + b64 * stride_db + draft_n.to(tl.int64) * stride_dj
    draft_vocab = tl.where(accepted < K, vocab, 0)
    # This split's chunk [start_v, end_v) of the vocab (the same chunks as the stats passes).
    chunk = tl.cdiv(tl.cdiv(vocab, num_splits), BLOCK_V) * BLOCK_V
    start_v = split * chunk
    end_v = tl.minimum(start_v + chunk, vocab)
    residual_sum = tl.full([], 0.0, tl.float64)
    p_sum = tl.full([], 0.0, tl.float64)
    for start in range(start_v, end_v, BLOCK_V):
        index = start + tl.arange(0, BLOCK_V)
        ok = index < end_v
        offsets = index.to(tl.int64)
        p = _probability(target_logits + offsets * stride_tv, index, ok, temperature, greedy,
                         t_max, t_threshold, t_argmax, t_z)  # fmt: skip
        q = _probability(draft_logits + offsets * stride_dv, index, ok & (index < draft_vocab), temperature, greedy,
                         d_max, d_threshold, d_argmax, d_z)  # fmt: skip
        residual_sum += tl.sum(tl.maximum(p - q, 0.0), 0)
        p_sum += tl.sum(p, 0)
    out = (b * num_splits + split).to(tl.int64) * 2
    tl.store(residual_part_ptr + out, residual_sum)
    tl.store(residual_part_ptr + out + 1, p_sum)


@triton.jit
def verify_rejection_kernel(
    target_ptr,
    draft_ptr,
    draft_tokens_ptr,
    temperature_ptr,
    seed_ptr,
    counter_ptr,
    part_ptr,
    state_ptr,
    fstate_ptr,
    residual_part_ptr,
    tokens_ptr,
    accepted_ptr,
    vocab,
    num_splits,
    stride_tb,
    stride_tj,
    stride_tv,
    stride_db,
    stride_dj,
    stride_dv,
    stride_xb,
    stride_xj,
    K: tl.constexpr,
    ACCEPT: tl.constexpr,
    RESAMPLE: tl.constexpr,
    NPROBE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    temperature = tl.load(temperature_ptr + b).to(tl.float32)
    greedy = temperature <= 0
    temperature = tl.where(greedy, 1.0, temperature)
    accepted, u_resample, j, drafts = _accept(
        target_ptr, draft_ptr, draft_tokens_ptr, seed_ptr, counter_ptr, part_ptr, state_ptr, fstate_ptr,
        b, temperature, greedy, num_splits, stride_tb, stride_tj, stride_tv, stride_db, stride_dj, stride_dv,
        stride_xb, stride_xj, K, ACCEPT, RESAMPLE, NPROBE, BLOCK_P, BLOCK_S,
    )  # fmt: skip
    # Totals from the per-split sums; an all-zero residual means p == q where rejection cannot happen:
    # draw from p_n then, like the reference.
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits
    parts = (b * num_splits + splits).to(tl.int64) * 2
    residual_sums = tl.load(residual_part_ptr + parts, mask=split_ok, other=0.0)
    p_sums = tl.load(residual_part_ptr + parts + 1, mask=split_ok, other=0.0)
    use_p = tl.sum(residual_sums, 0) <= 0
    sums = tl.where(use_p, p_sums, residual_sums)  # [BLOCK_S] float64
    goal = u_resample * tl.sum(sums, 0)
    # Inverse CDF (searchsorted right=True): the first split whose inclusive prefix exceeds goal, then
    # the first index inside it (scanning on, should rounding put the crossing past its end).
    first_split = tl.min(tl.where(split_ok & (tl.cumsum(sums, 0) > goal), splits, BLOCK_S), 0)
    running = tl.sum(tl.where(splits < first_split, sums, 0.0), 0)  # mass before that split
    chunk = tl.cdiv(tl.cdiv(vocab, num_splits), BLOCK_V) * BLOCK_V
    start = tl.where(first_split < num_splits, first_split * chunk, vocab)  # goal >= total: no crossing
    draft_n = tl.minimum(accepted, K - 1)
    target_row = tl.full([1], 0, tl.int32) + b * (2 * K + 1) + accepted
    draft_row = tl.full([1], 0, tl.int32) + b * (2 * K + 1) + K + 1 + draft_n
    t_max, t_threshold, t_argmax, t_z = _row_stats(part_ptr, state_ptr, fstate_ptr, target_row, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    d_max, d_threshold, d_argmax, d_z = _row_stats(part_ptr, state_ptr, fstate_ptr, draft_row, num_splits,
                                                   NPROBE, BLOCK_S)  # fmt: skip
    target_logits = target_ptr + b64 * stride_tb + accepted.to(tl.int64) * stride_tj
    draft_logits = draft_ptr + b64 * stride_db + draft_n.to(tl.int64) * stride_dj
    draft_vocab = tl.where(accepted < K, vocab, 0)
    found = tl.full([], 2147483647, tl.int32)
    while (start < vocab) & (found == 2147483647):
        index = start + tl.arange(0, BLOCK_V)
        ok = index < vocab
        offsets = index.to(tl.int64)
        p = _probability(target_logits + offsets * stride_tv, index, ok, temperature, greedy,
                         t_max, t_threshold, t_argmax, t_z)  # fmt: skip
        q = _probability(draft_logits + offsets * stride_dv, index, ok & (index < draft_vocab), temperature, greedy,
                         d_max, d_threshold, d_argmax, d_z)  # fmt: skip
        mass = tl.where(use_p, p, tl.maximum(p - q, 0.0))
        cdf = running + tl.cumsum(mass, 0)
        found = tl.min(tl.where(ok & (cdf > goal), index, 2147483647), 0)
        running += tl.sum(mass, 0)
        start += BLOCK_V
    resampled = tl.minimum(found, vocab - 1)  # u * total can round up to total: clamp like the reference

    # tokens[b] = [d_0 .. d_{K-1}, d_0] with position n replaced by the resampled token.
    first = tl.load(draft_tokens_ptr + b64 * stride_xb)
    tokens = tl.where(j < K, drafts, first).to(tl.int64)
    tokens = tl.where(j == accepted, resampled.to(tl.int64), tokens)
    tl.store(tokens_ptr + b64 * (K + 1) + j, tokens, mask=j <= K)
    tl.store(accepted_ptr + b, accepted.to(tl.int64))


def num_passes(nprobe: int) -> int:
    """Search passes that narrow a key range up to 2**32 wide to one key, NPROBE probes per pass."""
    return math.ceil(32 / math.log2(nprobe))


def pass_sequence(nprobe: int) -> list[int]:
    """The static launch sequence of verify_rejection_stats_kernel."""
    passes = num_passes(nprobe)
    return [MAX, *([SEARCH_K] * passes), MASS_K, *([SEARCH_P] * passes), MASS]


def num_splits(rows: int, vocab: int, block_v: int, chunk_v: int, sms: int) -> int:
    """Vocab splits per stat row: chunks of at most chunk_v entries, and enough programs to fill the GPU
    (PROGRAMS_PER_SM per SM); at most one per block and MAX_SPLITS. Static per shape."""
    wanted = max(cdiv(vocab, chunk_v), cdiv(PROGRAMS_PER_SM * sms, rows))
    return max(1, min(wanted, MAX_SPLITS, cdiv(vocab, block_v)))


class Stats(NamedTuple):
    """The stats passes' result for R stat rows (see distribution_stats)."""

    part: Tensor  # int64 [R, splits, NPROBE]: the MASS pass's per-split sums of kept weights at probe 0
    state: Tensor  # int64 [R, 4]: search lo, hi, threshold key, argmax
    fstate: Tensor  # float64 [R, 4]: max, Z_k, search bound, unused
    splits: int
    values: Tensor  # [R, cap] each row's candidate logits ([R, 1] unread when candidates are off)
    index: Tensor  # int64 [R, cap] their vocab indices
    cand: Tensor  # int64 [R, CAND_WIDTH]: what the candidates decided (flags 0 when they are off)


def distribution_stats(
    target_logits: Tensor,
    draft_logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    block_v: int,
    nprobe: int,
    num_warps: int,
    chunk_v: int,
    candidates_per_row: int,
) -> Stats:
    """Run the stats passes over the B * (2K+1) stat rows of target_logits [B, K+1, V] and draft_logits
    [B, K, V] (K = 0: one stat row per batch row, draft_logits unread). With candidates_per_row > 0 the
    rows' top candidates decide what they can first (kernels/candidates.py; a static sequence still:
    topk, decide, MAX, SEARCH_K..., MASS_K, decide, SEARCH_P..., MASS) and the passes skip those rows."""
    batch, positions, vocab = target_logits.shape
    k = positions - 1
    device = target_logits.device
    rows = batch * (2 * k + 1)
    splits = num_splits(rows, vocab, block_v, chunk_v, sm_count(device))
    # Double-buffered by launch parity: launch l reads buffer (l - 1) % 2 and writes buffer l % 2.
    part = torch.empty((2, rows, splits, nprobe), dtype=torch.int64, device=device)
    index = torch.empty((2, rows, splits), dtype=torch.int32, device=device)
    state = torch.empty((2, rows, 4), dtype=torch.int64, device=device)
    fstate = torch.empty((2, rows, 4), dtype=torch.float64, device=device)
    cap = min(candidates_per_row, vocab)
    if cap > 0:
        values, cand_index = candidates.candidates(target_logits, draft_logits, cap)
        cand = torch.empty((rows, CAND_WIDTH.value), dtype=torch.int64, device=device)
        candidates.decide(0, values, cand_index, cand, part[0], temperature, top_k, top_p, vocab, k, num_warps)
    else:  # no flags: every row takes the full-vocab passes
        values = torch.zeros((rows, 1), dtype=target_logits.dtype, device=device)
        cand_index = torch.zeros((rows, 1), dtype=torch.int64, device=device)
        cand = torch.zeros((rows, CAND_WIDTH.value), dtype=torch.int64, device=device)
    previous = NONE
    for launch, phase in enumerate(pass_sequence(nprobe)):
        src, dst = (launch + 1) % 2, launch % 2
        if previous == MASS_K and cap > 0:  # Z of the whole vocab is known now: decide top-p-alone rows
            candidates.decide(1, values, cand_index, cand, part[src], temperature, top_k, top_p, vocab, k, num_warps)
        verify_rejection_stats_kernel[(rows, splits)](
            target_logits, draft_logits, temperature, top_k, top_p, part[src], part[dst], index[src], index[dst],
            state[src], state[dst], fstate[src], fstate[dst], cand, vocab, splits,
            *target_logits.stride(), *draft_logits.stride(),
            K=k, PHASE=phase, PREVIOUS=previous, BLOCK_V=block_v, NPROBE=nprobe, BLOCK_S=next_power_of_2(splits),
            num_warps=num_warps,
        )  # fmt: skip
        previous = phase
    return Stats(part[dst], state[dst], fstate[dst], splits, values, cand_index, cand)


def verify_rejection(
    target_logits: Tensor,
    draft_logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
    block_v: int = CONFIGS["default"]["block_v"],
    nprobe: int = CONFIGS["default"]["nprobe"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    chunk_v: int = CONFIGS["default"]["chunk_v"],
    candidates: int = CONFIGS["default"]["candidates"],
) -> tuple[Tensor, Tensor]:
    """Rejection-sampling verify; shapes as graphspec.ops.verify_rejection. Returns (tokens [B, K+1],
    num_accepted [B]), both int64. Logits may have any strides; target and draft share a dtype."""
    check_device(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter)
    batch, positions, vocab = target_logits.shape
    k = draft_tokens.shape[1]
    device = target_logits.device
    if draft_logits.dtype != target_logits.dtype:
        raise ValueError(f"verify_rejection kernel: target {target_logits.dtype} and draft {draft_logits.dtype} differ")
    tokens = torch.empty((batch, positions), dtype=torch.int64, device=device)
    accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, accepted
    part, state, fstate, splits, *_ = distribution_stats(
        target_logits, draft_logits, temperature, top_k, top_p, block_v, nprobe, num_warps, chunk_v, candidates
    )
    residual_part = torch.empty((batch, splits, 2), dtype=torch.float64, device=device)
    common = dict(K=k, ACCEPT=ACCEPT_LANE, RESAMPLE=RESAMPLE_LANE, NPROBE=nprobe, BLOCK_V=block_v,
                  BLOCK_P=next_power_of_2(positions), BLOCK_S=next_power_of_2(splits), num_warps=num_warps)  # fmt: skip
    strides = (*target_logits.stride(), *draft_logits.stride(), *draft_tokens.stride())
    verify_rejection_residual_kernel[(batch, splits)](
        target_logits, draft_logits, draft_tokens, temperature, seed, counter, part, state,
        fstate, residual_part, vocab, splits, *strides, **common,
    )  # fmt: skip
    verify_rejection_kernel[(batch,)](
        target_logits, draft_logits, draft_tokens, temperature, seed, counter, part, state,
        fstate, residual_part, tokens, accepted, vocab, splits, *strides, **common,
    )  # fmt: skip
    return tokens, accepted


@library.op("graphspec::verify_rejection_triton", mutates_args=())
def verify_rejection_triton(
    target_logits: Tensor,
    draft_logits: Tensor,
    draft_tokens: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
    block_v: int,
    nprobe: int,
    num_warps: int,
    chunk_v: int,
    candidates: int,
) -> tuple[Tensor, Tensor]:
    """graphspec::verify_rejection lowered to the kernels above; the trailing ints are CONFIG_FIELDS."""
    return verify_rejection(
        target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter,
        block_v, nprobe, num_warps, chunk_v, candidates,
    )  # fmt: skip


@torch.library.register_fake("graphspec::verify_rejection_triton")
def _(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, seed, counter, *config):
    batch, positions, _ = target_logits.shape
    return (
        target_logits.new_empty((batch, positions), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )
