"""ops.sampling_weights on the CPU without sorting the vocabulary, when each row's top candidates settle
its cuts (no op lives here: kernels/sample_cpu.py and kernels/verify_rejection_cpu.py use it).

The reference sorts every row's order keys to find the top-k threshold and each token's W_> for top-p.
Here the weights and order keys come from the reference's own functions on the same tensors
(so the same bits), and only the thresholds come from the CAP largest order keys (torch.topk on int64
keys: exact, ties included, since keys order every float, -0.0 below +0.0):
  top-k: the top_k-th largest key is top key number top_k - 1, when top_k <= CAP;
  top-p: W_> of a candidate whose key is above the smallest candidate key (c_last) counts only
    candidates (every other token's key is <= c_last): a prefix sum over the sorted candidates. The cut
    is settled when the candidates above c_last already weigh float64(top_p) * float64(Z) (Z: the exact
    full-vocab sum of the top-k kept weights), since every token at or below c_last then has at least
    that W_> and is dropped.
The kept set is then every token with key >= the smallest kept candidate key, the reference's set.
A batch with any row these checks do not settle (or with NaN or +inf logits) takes the reference: on
the CPU there is no graph capture, so that host-side branch costs nothing but the check.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphspec import ops

CANDIDATES = 128  # top keys per row: top_k up to 128, and top-p cuts within a row's 128 largest logits


def decided_weights(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, candidates: int = CANDIDATES
) -> tuple[Tensor, Tensor] | None:
    """(ops.sampling_weights(...) [..., V], decided [...] bool) when every sampled row's cuts are settled
    by its top `candidates` keys, else None. Shapes as ops.sampling_weights."""
    vocab = logits.shape[-1]
    if vocab >= ops.MAX_SAMPLING_VOCAB or vocab == 0:
        return None  # the reference raises (or has nothing to do) for these
    # The reference's own functions, on the same shapes: the same weights and keys, bit for bit.
    scaled, row_max = ops.scaled_logits(logits, temperature)
    if not bool(torch.isfinite(row_max).all()):
        return None  # NaN weights (a NaN, +inf or all -inf row): leave them to the reference's arithmetic
    weight, key = ops.fixed_point_weights(scaled, row_max), ops.order_key(scaled)
    cap = min(candidates, vocab)
    top_keys, top_index = key.topk(cap, dim=-1)  # [..., cap], descending
    # Top-k: the top_k-th largest key (rows with top-k off keep everything).
    top_k = ops.per_row(top_k.to(torch.int64), logits)
    active_k = (top_k > 0) & (top_k < vocab)
    kth = top_keys.gather(-1, (top_k.clamp(1, cap) - 1).expand((*key.shape[:-1], 1)))
    threshold = torch.where(active_k, kth, torch.iinfo(torch.int64).min)
    weight = torch.where(key >= threshold, weight, 0)
    total = weight.sum(-1, keepdim=True).to(torch.float64)  # Z_k, exact before the conversion
    # Top-p: W_> of each candidate from the candidates, valid above the smallest candidate key.
    top_weight = weight.gather(-1, top_index)  # [..., cap], 0 outside the top-k set
    above = weight_above(top_weight, top_keys)
    top_p = ops.per_row(top_p.to(torch.float32), logits).to(torch.float64)
    bound = top_p * total
    keep = (top_p >= 1.0) | (above.to(torch.float64) < bound)
    threshold_p = torch.where(keep, top_keys, torch.iinfo(torch.int64).max).amin(-1, keepdim=True)
    threshold = torch.where(top_p >= 1.0, threshold, threshold_p)
    last = top_keys[..., -1:]
    covered = (top_weight * (top_keys > last)).sum(-1, keepdim=True).to(torch.float64) >= bound
    settled = ((~active_k) | (top_k <= cap)) & ((top_p >= 1.0) | covered | (cap == vocab))
    decided = (ops.per_row(temperature <= 0, logits) | settled).reshape(key.shape[:-1])
    if not bool(decided.all()):
        return None
    weight = torch.where(key >= threshold, weight, 0)
    return ops.greedy_rows_one_hot(weight, logits, temperature), decided


def weight_above(top_weight: Tensor, top_keys: Tensor) -> Tensor:
    """W_> of each candidate: the summed weight of the candidates whose key is strictly larger. top_keys
    is sorted descending (topk's order; equal keys adjacent), so that is the weight of the candidates
    before the first one of its group of equal keys: an exclusive prefix sum read at the group's first
    index, O(cap) per row instead of comparing every pair (int64 sums: the same value either way)."""
    exclusive = top_weight.cumsum(-1) - top_weight  # [..., cap]: the weight of the candidates before each
    index = torch.arange(top_keys.shape[-1], device=top_keys.device)
    starts = torch.ones_like(top_keys, dtype=torch.bool)  # where a group of equal keys begins
    starts[..., 1:] = top_keys[..., 1:] != top_keys[..., :-1]
    first = torch.where(starts, index, 0).cummax(-1).values  # each candidate's group's first index
    return exclusive.gather(-1, first)


def sampling_weights(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, candidates: int = CANDIDATES
) -> Tensor:
    """ops.sampling_weights, equal to it element for element; without its sort when the candidates
    settle every row."""
    decided = decided_weights(logits, temperature, top_k, top_p, candidates)
    return ops.sampling_weights(logits, temperature, top_k, top_p) if decided is None else decided[0]


def process_logits(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, candidates: int = CANDIDATES
) -> Tensor:
    """ops.process_logits (float64 [..., V]) through sampling_weights above."""
    weight = sampling_weights(logits, temperature, top_k, top_p, candidates)
    return weight.to(torch.float64) / weight.sum(-1, keepdim=True).to(torch.float64)
