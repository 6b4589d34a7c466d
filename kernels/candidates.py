"""Deciding a sampling distribution from its row's top candidates (no op lives here: the stats passes of
kernels/verify_rejection.py and the draw of kernels/sample.py use it).

A stat row's distribution (ops.sampling_weights: temperature, top-k with ties kept, top-p with ties kept)
is usually concentrated on a few tokens, and each search pass of the stats kernel scans the whole vocab.
So first take the CAP largest logits of every stat row (torch.topk on the raw logits; dividing by a
temperature T > 0 is monotone, so they are also CAP largest s = fp32(logits) / T), and let
decide_kernel (one program per stat row) settle from them alone whatever provably equals the
full-vocab rule. Every token outside the candidates has s <= s_low, the smallest candidate s, which is
what each exactness check below rests on (strict float compares: NaN fails them, so NaN rows fall back;
-0.0 == +0.0 as floats, so a cut between them falls back too):
  greedy rows (T <= 0): the argmax is the smallest candidate index at the max, exact iff s_low < max;
  top-k (0 < top_k < V): the threshold is the top_k-th largest candidate order key, exact iff
    top_k <= CAP and s_low < s(threshold); top-p (if on) then runs over candidates: the top-k set is
    inside them, so its mass Z_k and every W_> are exact candidate sums;
  top-p alone (STAGE 1, after the MASS_K pass summed the full-vocab Z): kept iff float64(W_>) <
    float64(top_p) * float64(Z) over candidate keys, exact iff the candidates strictly above s_low
    alone already weigh float64(top_p) * float64(Z) (every other token has at least that W_>, so
    ops.sampling_weights drops it);
  with CAP >= V every token is a candidate and every check holds.
A decided row ("DONE") keeps exactly the tokens with order key >= its threshold key, all of them
candidates, with normalizer Z = their exact int64 weight sum; the stats passes skip it (no vocab scan)
and sample's draw picks among its candidates. Rows with T > 0 and a finite candidate max, and greedy
rows whose argmax is exact, get their max (and argmax) from the candidates ("MAX_KNOWN"), so the MAX
pass does not scan them.
Weights are trunc(exp(s - max) * 2**WEIGHT_BITS) computed as in the stats kernel (tl.exp), so a
decided row's q is bit for bit the one the full-vocab passes would compute on the same device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import next_power_of_2
from torch import Tensor

from graphspec.ops import WEIGHT_BITS

__all__ = ["CAND_WIDTH", "DONE", "MAX_KNOWN", "candidates", "decide"]

WEIGHT_SCALE = tl.constexpr(float(2**WEIGHT_BITS))
# cand [R, CAND_WIDTH] int64 per stat row: flags, argmax, threshold key, Z, fp32 bits of the max s.
CAND_WIDTH = tl.constexpr(5)
MAX_KNOWN = tl.constexpr(1)  # flag bit: the max (and for greedy rows the argmax) is known
DONE = tl.constexpr(2)  # flag bit: the final threshold and Z are known
NO_KEY = tl.constexpr(2**31)  # above every order key: a threshold that keeps nothing
NO_CANDIDATE = tl.constexpr(-(2**40))  # below every order key: padding lanes' key in the sorted candidates
NO_DRAW = tl.constexpr(2**63 - 1)  # above every packed (index, key) of candidate_draw: padding lanes sort last


@triton.jit
def _candidates(values_ptr, index_ptr, row, cap, temperature, lanes):
    """s, order key and index of candidates `lanes` of stat row `row` (lanes >= cap masked: s -inf)."""
    ok = lanes < cap
    offsets = row.to(tl.int64) * cap + lanes
    x = tl.load(values_ptr + offsets, mask=ok, other=float("-inf")).to(tl.float32)
    s = tl.math.div_rn(x, temperature)  # IEEE divide, as the reference's logits / t
    bits = s.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)  # ops.order_key
    index = tl.load(index_ptr + offsets, mask=ok, other=0)
    return ok, s, key, index


@triton.jit
def decide_kernel(
    values_ptr,  # [R, cap] the stat rows' candidate logits (any order)
    index_ptr,  # int64 [R, cap] their vocab indices
    cand_ptr,  # int64 [R, CAND_WIDTH] the decision (STAGE 0 writes every row, STAGE 1 the rows it decides)
    part_ptr,  # STAGE 1: int64 [R, splits, NPROBE], the MASS_K pass's per-split sums at probe 0
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    vocab,
    cap,
    num_splits,
    K: tl.constexpr,
    STAGE: tl.constexpr,
    NPROBE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)  # stat row b * (2K+1) + i, as in verify_rejection_stats_kernel
    b = row // (2 * K + 1)
    temperature_in = tl.load(temperature_ptr + b).to(tl.float32)
    sampled = temperature_in > 0
    temperature = tl.where(sampled, temperature_in, 1.0)  # greedy rows: the plain logits
    top_k = tl.load(top_k_ptr + b).to(tl.int64)
    top_p = tl.load(top_p_ptr + b).to(tl.float32)
    active_k = sampled & (top_k > 0) & (top_k < vocab)
    active_p = sampled & (top_p < 1.0)
    bound_p = top_p.to(tl.float64)  # times Z below, in float64 as ops.sampling_weights

    lanes = tl.arange(0, BLOCK_C)
    ok, s, key, index = _candidates(values_ptr, index_ptr, row, cap, temperature, lanes)
    nan_free = tl.sum((ok & (s != s)).to(tl.int32), 0) == 0
    s_top = tl.max(tl.where(ok, s, float("-inf")), 0)  # the row's max s (every larger token is a candidate)
    s_low = tl.min(tl.where(ok, s, float("inf")), 0)  # every non-candidate has s <= s_low
    all_in = cap >= vocab  # no token outside the candidates
    finite = (s_top > float("-inf")) & (s_top < float("inf"))
    weight = tl.where(ok, (tl.exp(s - s_top) * WEIGHT_SCALE).to(tl.int64), 0)  # the stats kernel's weights
    # The candidate keys in descending order (padding lanes last) and their s (the order key is a bijection on
    # fp32 bit patterns), for the top-k and top-p thresholds below: one sort instead of [cap, cap] comparisons.
    sorted_keys = tl.sort(tl.where(ok, key, NO_CANDIDATE), 0, descending=True)
    sorted_bits = sorted_keys.to(tl.int32)
    sorted_s = (sorted_bits ^ ((sorted_bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    if STAGE == 0:
        # Greedy: the first index at the max, exact when no token outside ties with it.
        argmax = tl.min(tl.where(ok & (s == s_top), index, 9223372036854775807), 0)
        greedy_done = (temperature_in <= 0) & nan_free & (all_in | (s_low < s_top))
        max_known = nan_free & tl.where(sampled, finite, greedy_done)
        # Top-k: the threshold is the top_k-th largest candidate key (the smallest key with fewer than top_k
        # keys above it; every candidate when top_k >= cap), exact when every other token is below it.
        rank = tl.arange(0, BLOCK_C)
        kth = tl.max(tl.where(rank == tl.minimum(top_k, cap) - 1, sorted_keys, NO_CANDIDATE), 0)
        threshold_k = tl.where(top_k > 0, kth, NO_KEY)
        in_k = ok & (key >= threshold_k)
        s_threshold = tl.min(tl.where(in_k, s, float("inf")), 0)
        candidate_rows = (
            sampled & nan_free & finite & active_k & (top_k <= cap) & (all_in | (s_low < s_threshold))
        )  # fmt: skip
        normalizer_rows = ok & (key >= threshold_k)
        normalizer = tl.sum(tl.where(normalizer_rows, weight, 0), 0)  # Z_k, exact
    else:
        flags = tl.load(cand_ptr + row * CAND_WIDTH)
        argmax = tl.load(cand_ptr + row * CAND_WIDTH + 1)
        threshold_k = tl.full([], -2147483648, tl.int64)  # top-k is off for the rows this stage decides
        greedy_done = tl.full([], False, tl.int1)
        max_known = (flags & MAX_KNOWN) != 0
        # Top-p alone: Z is the full-vocab mass, the MASS_K pass's exact per-split sums.
        splits = tl.arange(0, BLOCK_S)
        parts = (row * num_splits + splits).to(tl.int64) * NPROBE
        normalizer = tl.sum(tl.load(part_ptr + parts, mask=splits < num_splits, other=0), 0)
        above_low = tl.sum(tl.where(ok & (s > s_low), weight, 0), 0)  # what every non-candidate has above it
        covered = all_in | (above_low.to(tl.float64) >= bound_p * normalizer.to(tl.float64))
        candidate_rows = ((flags & DONE) == 0) & sampled & nan_free & finite & (active_k == 0) & active_p & covered

    # Top-p over the candidates of the top-k set: a key is kept iff W_> (the kept weight at keys strictly above
    # it) < top_p * Z. Both sets are upper sets in key order, so the final threshold is the smallest key kept.
    # In descending key order the exclusive prefix sum E of the top-k set's weights is non-decreasing, and the
    # positions with E < top_p * Z are a prefix ending at the smallest kept key: a tie group's W_> is E at its
    # first position, which is below E at its last, and every later group starts at or past the first failing
    # position. (Weights are >= 0 in the rows this can decide: NaN rows are never decided.)
    kept_k_sorted = (sorted_keys > NO_CANDIDATE) & (sorted_keys >= threshold_k)
    sorted_weights = tl.where(kept_k_sorted, (tl.exp(sorted_s - s_top) * WEIGHT_SCALE).to(tl.int64), 0)
    above = tl.cumsum(sorted_weights, 0) - sorted_weights
    keep_p = (above.to(tl.float64) < bound_p * normalizer.to(tl.float64)) | (active_p == 0)
    threshold = tl.min(tl.where(kept_k_sorted & keep_p, sorted_keys, NO_KEY), 0)
    mass = tl.sum(tl.where(ok & (key >= threshold), weight, 0), 0)
    done = greedy_done | (candidate_rows & (mass > 0))
    threshold = tl.where(sampled, threshold, -2147483648)  # greedy rows keep the "keep all" threshold

    store = (STAGE == 0) | done  # STAGE 1 leaves undecided rows as STAGE 0 wrote them
    out = cand_ptr + row * CAND_WIDTH
    tl.store(out, max_known.to(tl.int64) * MAX_KNOWN | done.to(tl.int64) * DONE, mask=store)
    tl.store(out + 1, argmax, mask=store)
    tl.store(out + 2, threshold, mask=store)
    tl.store(out + 3, mass, mask=store)
    tl.store(out + 4, s_top.to(tl.int32, bitcast=True).to(tl.int64), mask=store)


@triton.jit
def candidate_draw(values_ptr, index_ptr, row, cap, temperature, row_max, threshold, goal, BLOCK_C: tl.constexpr):
    """Inverse CDF over a decided row's candidates in vocab index order: the smallest kept index whose
    inclusive running sum (exact int64, then float64) exceeds goal; INT32_MAX if none. Every token
    outside the candidates has weight 0, so this is ops.sample_from over the full vocab. The candidates are
    sorted by index once (index and order key packed in one int64), so the running sum is one prefix sum."""
    lanes = tl.arange(0, BLOCK_C)
    ok, _, key, index = _candidates(values_ptr, index_ptr, row, cap, temperature, lanes)
    packed = tl.where(ok, (index << 32) | (key & 0xFFFFFFFF), NO_DRAW)  # indices < 2**31: no sign bit
    packed = tl.sort(packed, 0)
    listed = packed != NO_DRAW
    sorted_index = packed >> 32
    sorted_key = packed.to(tl.int32)  # the low 32 bits: the order key
    sorted_s = (sorted_key ^ ((sorted_key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    kept = listed & (sorted_key.to(tl.int64) >= threshold)
    weight = tl.where(kept, (tl.exp(sorted_s - row_max) * WEIGHT_SCALE).to(tl.int64), 0)
    cdf = tl.cumsum(weight, 0)
    crossing = kept & (cdf.to(tl.float64) > goal)
    return tl.min(tl.where(crossing, sorted_index, 2147483647), 0).to(tl.int32)


def candidates(target_logits: Tensor, draft_logits: Tensor, cap: int) -> tuple[Tensor, Tensor]:
    """The cap largest logits of every stat row of target [B, K+1, V] and draft [B, K, V] (K = 0: target
    only), in stat-row order b * (2K+1) + i: (values [R, cap] in the logits' dtype, indices [R, cap]
    int64), each row in no particular order."""
    batch, positions, _ = target_logits.shape
    logits = target_logits
    if positions > 1:  # one top-k call over all the stat rows: each call is ~40 launches on a GPU, the copy one
        logits = torch.cat((target_logits, draft_logits), dim=1)  # [B, 2K+1, V]
    values, index = torch.topk(logits, cap, dim=-1, sorted=False)
    rows = batch * (2 * positions - 1)
    return values.reshape(rows, cap), index.reshape(rows, cap)


def decide(
    stage: int,
    values: Tensor,
    index: Tensor,
    cand: Tensor,
    part: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    vocab: int,
    k: int,
    num_warps: int,
) -> None:
    """Launch decide_kernel over every stat row; stage 0 fills cand [R, CAND_WIDTH], stage 1 (part: the
    MASS_K pass's partials [R, splits, NPROBE]) decides the top-p-alone rows."""
    rows, cap = values.shape
    splits, nprobe = part.shape[1], part.shape[2]
    block_c = next_power_of_2(cap)
    decide_kernel[(rows,)](
        values, index, cand, part, temperature, top_k, top_p, vocab, cap, splits,
        K=k, STAGE=stage, NPROBE=nprobe, BLOCK_C=block_c,
        BLOCK_S=next_power_of_2(splits), num_warps=num_warps,
    )  # fmt: skip
