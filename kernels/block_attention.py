"""graphspec::block_attention as Triton: kernels/attention.py's split-K kernel with CAUSAL=False.

Semantics are graphspec.ops.block_attention: q [B, Hq, T, D] is a block of T queries at positions
start_pos[b] .. start_pos[b] + T - 1 whose keys are already in the cache [L, 2, SLOTS, Hkv, S, D]; every
query sees every key of its row's slot at positions <= start_pos[b] + T - 1 (the context before the
block and the whole block: DFlash's drafter, no causal mask inside the block); GQA maps q head h to kv
head h // (Hq // Hkv); the output is token-major [B, T, Hq, D]. The causal kernel already reads exactly
these keys for its last query, so the non-causal variant is one constexpr of the same kernel (the same
tiling, split-K and reduce), not a copy.
"""

from __future__ import annotations

import torch
from graphspec.kernels import attention as causal_kernel
from graphspec.kernels.common import check_config_table
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "block_attention", "block_attention_triton"]

# The attention kernel's table (same knobs, same tiles): the block is at most a few dozen queries, like
# a verify, so the causal kernel's sweep applies (benchmarks/bench_kernels.py). Own entries go here
# when a sweep of the non-causal variant says otherwise.
CONFIGS: dict[int | str, dict[str, int]] = {key: dict(config) for key, config in causal_kernel.CONFIGS.items()}
CONFIG_FIELDS = check_config_table(CONFIGS)


def block_attention(
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
) -> Tensor:
    """Launch the attention kernel without the causal mask; same result as graphspec.ops.block_attention."""
    return causal_kernel.attention(
        q, cache, layer, slot_ids, start_pos, scale, block_n, num_warps, num_stages, programs_per_sm, block_m,
        split_keys, wave_block_n, causal=False,
    )  # fmt: skip


@library.op("graphspec::block_attention_triton", mutates_args=())
def block_attention_triton(
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
    """graphspec::block_attention lowered to the attention kernel with CAUSAL=False; the trailing ints
    are CONFIG_FIELDS."""
    config = (block_n, num_warps, num_stages, programs_per_sm, block_m, split_keys, wave_block_n)
    return block_attention(q, cache, layer, slot_ids, start_pos, scale, *config)


@torch.library.register_fake("graphspec::block_attention_triton")
def _(q, cache, layer, slot_ids, start_pos, scale, *config):
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))
