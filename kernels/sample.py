"""graphspec::sample as Triton kernels: one token per row (temperature, top-k, top-p) without a sort.

Semantics are graphspec.ops.sample: the distribution is ops.sampling_weights (fixed-point int64 weights,
ties with a top-k or top-p threshold all kept), the draw is ops.sample_from over those weights with
u = ops.uniform(seed, counter, lane): the first index whose exact int64 running sum, converted to
float64, exceeds u * float64(Z), clamped to V - 1; rows with temperature <= 0 take the first argmax.

The distribution comes from verify_rejection's stats passes (kernels/verify_rejection.py) run with
K = 0, one stat row per batch row: MAX, the top-k and top-p threshold searches over the order key of
the scaled logits, and MASS, whose per-split partials are the exact sums of the kept weights. Because
those sums are integers, the thresholds and Z are the ones verify_rejection's kernel computes for the
same draft logits, bit for bit, whatever the batch or vocab split: the draft samples from exactly the
q that verify uses. sample_kernel then draws: a prefix over the split sums finds the split that
crosses u * Z, and one scan of that split (a running int64 sum per block) finds the token; a row the
candidates decided (kernels/candidates.py: all its kept tokens are among its top logits) draws among
those candidates in vocab index order instead, which is the same inverse CDF (every other weight is 0).
Launches: topk, 2 decide launches, the 19 stats passes (at nprobe 16) and sample_kernel; passes of a
search that is off for a row, or of a row already decided, do no work for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.candidates import CAND_WIDTH, DONE, candidate_draw
from graphspec.kernels.common import check_config_table, check_device, next_power_of_2
from graphspec.kernels.verify_rejection import WEIGHT_SCALE, distribution_stats, uniform
from torch import Tensor

from graphspec import library
from graphspec.ops import MAX_SAMPLING_VOCAB
from graphspec.ops import sample as sample_reference

__all__ = ["CONFIGS", "sample", "sample_reference", "sample_triton"]

# The stats passes' fields (see kernels/verify_rejection.py): block_v vocab entries per loop step (also
# the draw's scan block), nprobe thresholds per search pass, num_warps, chunk_v most vocab entries per
# program and pass, candidates top logits per row that decide it when they can (0: off). The same
# values as verify_rejection's rows: its tuning measured these passes.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_v": 1024, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
    90: {"block_v": 1024, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
    "default": {"block_v": 512, "nprobe": 16, "num_warps": 4, "chunk_v": 8192, "candidates": 128},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def sample_kernel(
    logits_ptr,
    temperature_ptr,
    seed_ptr,
    counter_ptr,
    part_ptr,  # int64 [B, splits, NPROBE]: the MASS pass's per-split sums of kept weights at probe 0
    state_ptr,  # int64 [B, 4]: search lo, hi, threshold key, argmax
    fstate_ptr,  # float64 [B, 4]: max scaled logit, Z_k, bound, unused
    values_ptr,  # [B, cap]: each row's candidate logits (kernels/candidates.py)
    index_ptr,  # int64 [B, cap]: their vocab indices
    cand_ptr,  # int64 [B, CAND_WIDTH]: the candidates' decision
    out_ptr,  # int64 [B]
    lane,
    vocab,
    num_splits,
    cap,
    stride_b,
    stride_v,
    NPROBE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0)
    b64 = b.to(tl.int64)
    temperature = tl.load(temperature_ptr + b).to(tl.float32)
    greedy = temperature <= 0
    temperature = tl.where(greedy, 1.0, temperature)  # as the stats passes scaled greedy rows
    threshold = tl.load(state_ptr + b * 4 + 2)
    argmax = tl.load(state_ptr + b * 4 + 3)
    row_max = tl.load(fstate_ptr + b * 4).to(tl.float32)  # stored exactly as float64
    seed = tl.load(seed_ptr + b).to(tl.int64)
    counter = tl.load(counter_ptr + b).to(tl.int64)
    u = uniform(seed, counter, tl.full([], 0, tl.int32) + lane)  # float64 in [0, 1)

    # Split sums (exact int64) -> Z and the goal u * Z; the first split whose inclusive prefix exceeds
    # the goal holds the token (the prefix is exact, so the scan below ends inside that split).
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits  # splits past num_splits are padding, masked
    sums = tl.load(part_ptr + (b * num_splits + splits).to(tl.int64) * NPROBE, mask=split_ok, other=0)
    goal = u * tl.sum(sums, 0).to(tl.float64)
    first_split = tl.min(tl.where(split_ok & (tl.cumsum(sums, 0).to(tl.float64) > goal), splits, BLOCK_S), 0)
    running = tl.sum(tl.where(splits < first_split, sums, 0), 0)  # kept mass before that split, int64
    chunk = tl.cdiv(tl.cdiv(vocab, num_splits), BLOCK_V) * BLOCK_V  # the stats passes' chunks
    start = tl.where(first_split < num_splits, first_split * chunk, vocab)  # goal >= Z: no crossing
    # A decided row keeps only candidates: draw among them, in vocab index order, and scan nothing.
    decided = (tl.load(cand_ptr + b * CAND_WIDTH) & DONE) != 0
    from_candidates = tl.full([], 2147483647, tl.int32)
    if BLOCK_C > 0:
        from_candidates = candidate_draw(values_ptr, index_ptr, b, cap, temperature, row_max, threshold, goal, BLOCK_C)
    start = tl.where(decided, vocab, start)

    row_ptr = logits_ptr + b64 * stride_b
    found = tl.full([], 2147483647, tl.int32)
    while (start < vocab) & (found == 2147483647):
        index = start + tl.arange(0, BLOCK_V)
        ok = index < vocab  # the last block's tail is padding
        x = tl.load(row_ptr + index.to(tl.int64) * stride_v, mask=ok, other=float("-inf"))
        s = tl.math.div_rn(x.to(tl.float32), temperature)  # IEEE divide, as the reference's logits / t
        bits = s.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # order key (ops.order_key)
        weight = (tl.exp(s - row_max) * WEIGHT_SCALE).to(tl.int64)  # ops.sampling_weights' fixed point
        weight = tl.where(ok & (key >= threshold), weight, 0)
        cdf = running + tl.cumsum(weight, 0)  # exact inclusive running sum
        found = tl.min(tl.where(ok & (cdf.to(tl.float64) > goal), index, 2147483647), 0)
        running += tl.sum(weight, 0)
        start += BLOCK_V
    found = tl.where(decided, from_candidates, found)
    token = tl.minimum(found, vocab - 1).to(tl.int64)  # u * Z can round up to Z: clamp like the reference
    tl.store(out_ptr + b, tl.where(greedy, argmax, token))


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
    lane: int,
    block_v: int = CONFIGS["default"]["block_v"],
    nprobe: int = CONFIGS["default"]["nprobe"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    chunk_v: int = CONFIGS["default"]["chunk_v"],
    candidates: int = CONFIGS["default"]["candidates"],
) -> Tensor:
    """One token per row of logits [B, V] (any strides); per-row parameters [B] as graphspec.ops.sample.
    Returns a new int64 [B]."""
    check_device(logits, temperature, top_k, top_p, seed, counter)
    if logits.dim() != 2:
        raise ValueError(f"sample kernel: logits must be [B, V], got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    if not 0 < vocab < MAX_SAMPLING_VOCAB:
        raise ValueError(f"sample kernel: vocab must be in [1, {MAX_SAMPLING_VOCAB}) (exact int64 sums), got {vocab}")
    out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    rows = logits.unsqueeze(1)  # [B, 1, V]: each batch row is one stat row (K = 0)
    stats = distribution_stats(rows, rows, temperature, top_k, top_p, block_v, nprobe, num_warps, chunk_v, candidates)
    cap = min(candidates, vocab)
    block_c = next_power_of_2(cap) if cap > 0 else 0
    sample_kernel[(batch,)](
        logits, temperature, seed, counter, stats.part, stats.state, stats.fstate, stats.values, stats.index,
        stats.cand, out, lane, vocab, stats.splits, max(cap, 1), *logits.stride(),
        NPROBE=nprobe, BLOCK_V=block_v, BLOCK_S=next_power_of_2(stats.splits), BLOCK_C=block_c,
        num_warps=num_warps,
    )  # fmt: skip
    return out


@library.op("graphspec::sample_triton", mutates_args=())
def sample_triton(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    counter: Tensor,
    lane: int,
    block_v: int,
    nprobe: int,
    num_warps: int,
    chunk_v: int,
    candidates: int,
) -> Tensor:
    """graphspec::sample lowered to the stats passes + sample_kernel; the trailing ints are CONFIG_FIELDS."""
    return sample(
        logits, temperature, top_k, top_p, seed, counter, lane, block_v, nprobe, num_warps, chunk_v, candidates
    )


@torch.library.register_fake("graphspec::sample_triton")
def _(logits, temperature, top_k, top_p, seed, counter, lane, *config):
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)
