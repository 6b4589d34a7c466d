"""graphspec::verify_greedy as Triton kernels: argmax over the vocab, compare with the drafts, count accepts.

Semantics are graphspec.ops.verify_greedy: tokens[b, j] = argmax_v target_logits[b, j, v] (the first
index among equal maxima, like torch.argmax) and num_accepted[b] = length of the prefix where
draft_tokens[b, j] == tokens[b, j]. NaN logits are not special-cased (torch treats NaN as the max).

Two launches, no torch ops in between: verify_greedy_kernel splits every (b, j) row's vocab into
`splits` chunks and writes one partial (max, first argmax) per chunk, so batch 1 still spreads the
logits read over the GPU; verify_greedy_accept_kernel (one program per batch row) merges the partials,
writes the K+1 tokens and the accepted count. Logits may have any strides (a slice of a wider tensor).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from graphspec.kernels.common import PROGRAMS_PER_SM, cdiv, check_config_table, check_device, next_power_of_2, sm_count
from torch import Tensor

from graphspec import library
from graphspec.ops import verify_greedy as verify_greedy_reference

__all__ = [
    "CONFIGS",
    "merge_partials",
    "verify_greedy",
    "verify_greedy_reference",
    "verify_greedy_triton",
    "vocab_partials",
]

# block_v: vocab entries per loop step; max_splits: cap on vocab chunks per (b, j) row.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"block_v": 2048, "num_warps": 8, "max_splits": 32},
    90: {"block_v": 4096, "num_warps": 8, "max_splits": 32},
    "default": {"block_v": 1024, "num_warps": 4, "max_splits": 16},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


@triton.jit
def verify_greedy_kernel(
    logits_ptr,
    part_max_ptr,
    part_index_ptr,
    positions,  # K + 1
    vocab,
    num_splits,
    stride_b,
    stride_j,
    stride_v,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)  # b * (K + 1) + j
    split = tl.program_id(1)
    b = row // positions
    j = row % positions
    row_ptr = logits_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_j
    # This split scans vocab [lo, hi): equal chunks of whole blocks.
    chunk = tl.cdiv(tl.cdiv(vocab, num_splits), BLOCK_V) * BLOCK_V
    lo = split * chunk
    hi = tl.minimum(lo + chunk, vocab)
    offs = tl.arange(0, BLOCK_V)
    # Running (max, index): a later block replaces it only if strictly larger, so among equal maxima
    # the first index wins; starting at (-inf, lo) also gives lo for an all -inf chunk, like torch.
    best = tl.full([], float("-inf"), tl.float32)
    best_index = lo
    for block_start in range(lo, hi, BLOCK_V):
        index = block_start + offs
        values = tl.load(row_ptr + index.to(tl.int64) * stride_v, mask=index < hi, other=float("-inf"))
        block_max, block_arg = tl.max(values.to(tl.float32), 0, return_indices=True, return_indices_tie_break_left=True)
        better = block_max > best
        best_index = tl.where(better, block_start + block_arg, best_index)
        best = tl.where(better, block_max, best)
    tl.store(part_max_ptr + row * num_splits + split, best)
    tl.store(part_index_ptr + row * num_splits + split, best_index)


@triton.jit
def merge_partials(part_max_ptr, part_index_ptr, part, mask):
    """Token per row of a [rows, splits] tile of partials (masked entries ignored): the overall max,
    then the smallest index holding it. Splits are in vocab order, and an all -inf row keeps its
    first index because every split then holds -inf."""
    maxima = tl.load(part_max_ptr + part, mask=mask, other=float("-inf"))
    indices = tl.load(part_index_ptr + part, mask=mask, other=2147483647)
    row_max = tl.max(maxima, 1)
    return tl.min(tl.where(maxima == row_max[:, None], indices, 2147483647), 1)


@triton.jit
def verify_greedy_accept_kernel(
    part_max_ptr,
    part_index_ptr,
    draft_ptr,
    tokens_ptr,
    accepted_ptr,
    positions,  # K + 1
    num_splits,
    stride_db,
    stride_dj,
    BLOCK_P: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_P)  # position in 0..K (padded to a power of 2)
    s = tl.arange(0, BLOCK_S)  # vocab split (padded)
    j_ok = j < positions
    mask = j_ok[:, None] & (s < num_splits)[None, :]
    part = (b * positions + j)[:, None] * num_splits + s[None, :]  # [BLOCK_P, BLOCK_S] partial index
    token = merge_partials(part_max_ptr, part_index_ptr, part, mask)  # [BLOCK_P]
    tl.store(tokens_ptr + b * positions + j, token.to(tl.int64), mask=j_ok)
    # Accepted = index of the first draft that differs from the target's token, K if none does.
    k = positions - 1
    draft = tl.load(draft_ptr + b * stride_db + j * stride_dj, mask=j < k, other=-1)
    mismatch = (j < k) & (draft != token.to(tl.int64))
    accepted = tl.min(tl.where(mismatch, j, k), 0)
    tl.store(accepted_ptr + b, accepted.to(tl.int64))


def vocab_partials(logits: Tensor, block_v: int, num_warps: int, max_splits: int) -> tuple[Tensor, Tensor, int]:
    """Launch verify_greedy_kernel over logits [B, P, V] (any strides): per (b, p) row, `splits` partial
    (max, first argmax) pairs [B * P, splits], splits chosen so even one row spreads over the GPU."""
    batch, positions, vocab = logits.shape
    rows = batch * positions
    splits = max(1, min(max_splits, cdiv(vocab, block_v), cdiv(PROGRAMS_PER_SM * sm_count(logits.device), rows)))
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=logits.device)
    part_index = torch.empty((rows, splits), dtype=torch.int32, device=logits.device)
    verify_greedy_kernel[(rows, splits)](
        logits, part_max, part_index, positions, vocab, splits, *logits.stride(), BLOCK_V=block_v, num_warps=num_warps
    )
    return part_max, part_index, splits


def verify_greedy(
    target_logits: Tensor,
    draft_tokens: Tensor,
    block_v: int = CONFIGS["default"]["block_v"],
    num_warps: int = CONFIGS["default"]["num_warps"],
    max_splits: int = CONFIGS["default"]["max_splits"],
) -> tuple[Tensor, Tensor]:
    """Greedy verify of target_logits [B, K+1, V] (any strides) against draft_tokens [B, K].
    Returns (tokens [B, K+1], num_accepted [B]), both int64."""
    check_device(target_logits, draft_tokens)
    batch, positions, _ = target_logits.shape
    device = target_logits.device
    tokens = torch.empty((batch, positions), dtype=torch.int64, device=device)
    accepted = torch.empty((batch,), dtype=torch.int64, device=device)
    if batch == 0:
        return tokens, accepted
    part_max, part_index, splits = vocab_partials(target_logits, block_v, num_warps, max_splits)
    verify_greedy_accept_kernel[(batch,)](
        part_max, part_index, draft_tokens, tokens, accepted, positions, splits, *draft_tokens.stride(),
        BLOCK_P=next_power_of_2(positions), BLOCK_S=next_power_of_2(splits), num_warps=1,
    )  # fmt: skip
    return tokens, accepted


@library.op("graphspec::verify_greedy_triton", mutates_args=())
def verify_greedy_triton(
    target_logits: Tensor, draft_tokens: Tensor, block_v: int, num_warps: int, max_splits: int
) -> tuple[Tensor, Tensor]:
    """graphspec::verify_greedy lowered to verify_greedy_kernel; the trailing ints are CONFIG_FIELDS."""
    return verify_greedy(target_logits, draft_tokens, block_v, num_warps, max_splits)


@torch.library.register_fake("graphspec::verify_greedy_triton")
def _(target_logits, draft_tokens, block_v, num_warps, max_splits):
    batch, positions, _ = target_logits.shape
    return (
        target_logits.new_empty((batch, positions), dtype=torch.int64),
        target_logits.new_empty((batch,), dtype=torch.int64),
    )
