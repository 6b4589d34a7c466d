"""graphspec::rotary_kv_attention as one launch of kernels/attention.py's attention_kernel (ROTARY on).

The fused op replaces rotary_kv_write + attention: each attention program rotates its q tile in
registers, and the programs whose key chunk holds this step's positions rotate those keys and write
them and their values into the cache themselves, then run the plain key loop. At decode sizes
rotary_kv_write was a launch of its own per layer and forward (about 2 us plus the gap on an H200) for
a few kilobytes of work; this removes it. The key loop and every rounding are those of rotary_kv_write
then attention, so the result is the same bits (tests/kernels/test_rotary_kv_attention.py). With
q_norm/k_norm (fuse_qk_norm) each head of q and of the step's k is rms_norm'ed in registers first,
which removes two more launches per layer and forward for models with per-head norms (Qwen3). With row_src
(fuse_row_scale: a folded input norm, models/fold_norms.py) q, k and v are scaled by the norm's row scale of the
un-normalized rows they were projected from, right after their loads: the norm's launch is gone too.
causal=False is block_attention's window (DFlash's block): the kernel's CAUSAL constexpr off.
"""

from __future__ import annotations

import torch
from graphspec.kernels import attention as attention_kernel
from graphspec.kernels.common import check_config_table
from torch import Tensor

from graphspec import library
from graphspec.ops import rotary_kv_attention_reference

__all__ = ["CONFIGS", "rotary_kv_attention", "rotary_kv_attention_reference", "rotary_kv_attention_triton"]

# The attention kernel's configs: the key loop is the same loop.
CONFIGS: dict[int | str, dict[str, int]] = {sm: dict(config) for sm, config in attention_kernel.CONFIGS.items()}
CONFIG_FIELDS = check_config_table(CONFIGS)


def rotary_kv_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    norm_eps: float = 1e-6,
    causal: bool = True,
    row_src: Tensor | None = None,
    row_eps: float = 0.0,
    **config: int,
) -> Tensor:
    """Same result as graphspec.ops.rotary_kv_attention_reference (cache written in place; with q_norm
    and k_norm, to rms_norm's fp32 rounding; with row_src, to the row scale's); config fields as in CONFIGS
    (default: the "default" row)."""
    if (q_norm is None) != (k_norm is None):
        raise ValueError("rotary_kv_attention kernel: q_norm and k_norm come together (or neither)")
    config = {**CONFIGS["default"], **config}
    qk_norm = None if q_norm is None else (q_norm, k_norm, norm_eps)
    row_scale = None if row_src is None else (row_src, row_eps)
    return attention_kernel.attention(
        q, cache, layer, slot_ids, start_pos, scale, **config, rotary=(k, v, cos, sin), qk_norm=qk_norm,
        row_scale=row_scale, causal=causal,
    )  # fmt: skip


@library.op("graphspec::rotary_kv_attention_triton", mutates_args=("cache",))
def rotary_kv_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: Tensor,
    layer: int,
    slot_ids: Tensor,
    start_pos: Tensor,
    scale: float,
    q_norm: Tensor | None,
    k_norm: Tensor | None,
    norm_eps: float,
    causal: bool,
    row_src: Tensor | None,
    row_eps: float,
    block_n: int,
    num_warps: int,
    num_stages: int,
    programs_per_sm: int,
    block_m: int,
    split_keys: int,
    wave_block_n: int,
) -> Tensor:
    """graphspec::rotary_kv_attention lowered to attention_kernel; the trailing ints are CONFIG_FIELDS."""
    return rotary_kv_attention(
        q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale, q_norm, k_norm, norm_eps, causal, row_src, row_eps,
        block_n=block_n, num_warps=num_warps, num_stages=num_stages, programs_per_sm=programs_per_sm,
        block_m=block_m, split_keys=split_keys, wave_block_n=wave_block_n,
    )  # fmt: skip


@torch.library.register_fake("graphspec::rotary_kv_attention_triton")
def _(q, k, v, cos, sin, cache, layer, slot_ids, start_pos, scale, q_norm, k_norm, norm_eps, causal, row_src, row_eps,
      *config):  # fmt: skip
    batch, heads, t, head_dim = q.shape
    return q.new_empty((batch, t, heads, head_dim))
