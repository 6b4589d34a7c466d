"""prefill_attention_cpu vs graphspec.ops.prefill_attention_reference: the cache bit for bit, the output to
fp32 rounding, for chunks at mixed start positions (GQA, fp32 and bf16); positions past a row's chunk never
reach an output."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import prefill_attention_cpu as kernel

from tests.kernels.helpers import TOLERANCE, assert_unread_past_the_window, bits, generator, rel_error


def make_case(batch: int, q_heads: int, kv_heads: int, t: int, seq: int, dtype: torch.dtype, seed: int):
    """q, k, v [B, H, T, 64], a random cache (stale values where the chunk lands), distinct slots, start
    positions from 0 up to the last that fits (a later chunk of a long prompt)."""
    g = generator(seed)
    q = torch.randn(batch, q_heads, t, 64, generator=g).to(dtype)
    k = torch.randn(batch, kv_heads, t, 64, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, t, 64, generator=g).to(dtype)
    cache = torch.randn(2, 2, batch + 2, kv_heads, seq, 64, generator=g).to(dtype)
    slot_ids = torch.randperm(batch + 2, generator=g)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g)
    start_pos[0], start_pos[-1] = 0, seq - t
    return (q, k, v), cache, slot_ids, start_pos


@pytest.mark.parametrize(
    ("dtype", "group", "t"), [(torch.float32, 3, 16), (torch.float32, 1, 7), (torch.bfloat16, 2, 8)]
)
def test_prefill_attention_cpu_matches_reference(dtype: torch.dtype, group: int, t: int) -> None:
    inputs, cache, slot_ids, start_pos = make_case(3, 2 * group, 2, t, 48, dtype, seed=group + t)
    expected_cache = cache.clone()
    expected = kernel.prefill_attention_reference(*inputs, expected_cache, 1, slot_ids, start_pos, 0.125)
    exact = kernel.prefill_attention_reference(
        *(x.float() for x in inputs), cache.float(), 1, slot_ids, start_pos, 0.125
    )
    out = kernel.prefill_attention_cpu(*inputs, cache, 1, slot_ids, start_pos, 0.125)
    assert torch.equal(bits(cache), bits(expected_cache))  # the same values written, nothing else
    assert out.shape == expected.shape and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype], rel_error(out, exact)


def test_prefill_attention_cpu_ignores_positions_past_the_chunk() -> None:
    """NaN past each row's chunk (stale or poisoned slots) reaches no output and stays put."""
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 6, 40, torch.float32, seed=5)
    start_pos.copy_(torch.tensor([0, 12]))
    reference, kernel_op = kernel.prefill_attention_reference, kernel.prefill_attention_cpu
    assert_unread_past_the_window(kernel_op, reference, inputs, cache, slot_ids, start_pos, 6)
