"""block_attention kernel (the attention kernel with CAUSAL=False) vs graphspec.ops.block_attention's
reference (CPU: interpreter, small shapes; GPU: DFlash's block sizes at 8B head shapes)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import block_attention as kernel

from graphspec import ops
from tests.kernels.helpers import TOLERANCE, rel_error
from tests.kernels.test_attention import make_case


def check(q, cache, layer, slot_ids, start_pos, scale, out) -> None:
    exact = ops.attention_reference(q.float(), cache.float(), layer, slot_ids, start_pos, scale, causal=False)
    batch, heads, t, head_dim = q.shape
    assert out.shape == (batch, t, heads, head_dim) and out.dtype == q.dtype and out.is_contiguous()
    assert torch.isfinite(out).all(), "an output element is NaN/inf (unwritten or bad masking)"
    assert rel_error(out, exact) < TOLERANCE[q.dtype], rel_error(out, exact)


@pytest.mark.parametrize(("dtype", "group", "head_dim"), [(torch.float32, 2, 64), (torch.bfloat16, 4, 128)])
def test_block_attention_matches_reference_and_dead_keys_stay_unseen(dtype, group, head_dim) -> None:
    """GQA, a block of 4 queries, NaN in every position past each row's block: equal to the reference,
    which lets every query see the whole block (and differs from the causal result)."""
    q, cache, slot_ids, start_pos = make_case(3, 2 * group, 2, 4, 40, head_dim, dtype, seed=group)
    start_pos[1] = 9
    dirty = cache.clone()
    for slot, start in zip(slot_ids.tolist(), start_pos.tolist(), strict=True):
        dirty[:, :, slot, :, start + 4 :] = float("nan")
    out = kernel.block_attention(q, dirty, 1, slot_ids, start_pos, head_dim**-0.5)
    check(q, cache, 1, slot_ids, start_pos, head_dim**-0.5, out)
    causal = ops.attention_reference(q.float(), cache.float(), 1, slot_ids, start_pos, head_dim**-0.5)
    assert rel_error(out, causal) > 1e-2  # the mask is really gone: earlier queries see later keys


@pytest.mark.parametrize("programs_per_sm", [0, 64])
def test_block_attention_split_counts_agree(programs_per_sm: int) -> None:
    """One split (direct write) and one per key block (split-K with the reduce) agree."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 70, 64, torch.float32, seed=7)
    out = kernel.block_attention(q, cache, 0, slot_ids, start_pos, 0.125, block_n=16, programs_per_sm=programs_per_sm)
    check(q, cache, 0, slot_ids, start_pos, 0.125, out)


def test_block_attention_op_matches_launcher_and_empty_batch() -> None:
    """graphspec::block_attention_triton passes its config through; a batch of 0 rows returns [0, T, Hq, D]."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 2, 32, 64, torch.float32, seed=11)
    config = kernel.CONFIGS["default"]
    out = torch.ops.graphspec.block_attention_triton(q, cache, 1, slot_ids, start_pos, 0.125, *config.values())
    torch.testing.assert_close(out, kernel.block_attention(q, cache, 1, slot_ids, start_pos, 0.125, **config))
    empty = kernel.block_attention(q[:0], cache, 1, slot_ids[:0], start_pos[:0], 0.125)
    assert empty.shape == (0, 2, 4, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("batch", [1, 16])
def test_block_attention_real_shapes_on_gpu(block: int, batch: int) -> None:
    """32 q heads, 8 kv heads, D 128, bf16, a 4k cache: DFlash drafter shapes with every SM config."""
    q, cache, slot_ids, start_pos = make_case(batch, 32, 8, block, 4096, 128, torch.bfloat16, seed=block, layers=1)
    for config in kernel.CONFIGS.values():
        out = kernel.block_attention(q, cache, 0, slot_ids, start_pos, 128**-0.5, **config)
        check(q, cache, 0, slot_ids, start_pos, 128**-0.5, out)
