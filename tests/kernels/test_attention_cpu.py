"""attention_cpu (each row's visible prefix, torch's fused CPU attention) vs graphspec.ops.attention_reference."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import attention_cpu as kernel

from tests.kernels.helpers import TOLERANCE, generator, rel_error


def make_case(batch: int, q_heads: int, kv_heads: int, t: int, seq: int, dtype: torch.dtype, seed: int):
    """q [B, Hq, T, 64] (a transposed view, as the decoder passes it), a random cache, distinct slots,
    start positions from 0 (only key 0 visible to the first query) to the last that fits."""
    g = generator(seed)
    cache = torch.randn(2, 2, batch + 2, kv_heads, seq, 64, generator=g).to(dtype)
    q = torch.randn(batch, t, q_heads, 64, generator=g).to(dtype).transpose(1, 2)
    slot_ids = torch.randperm(batch + 2, generator=g)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g)
    start_pos[0], start_pos[-1] = 0, seq - t
    return q, cache, slot_ids, start_pos


def check(out: torch.Tensor, q, cache, layer, slot_ids, start_pos, scale) -> None:
    exact = kernel.attention_reference(q.float(), cache.float(), layer, slot_ids, start_pos, scale)
    batch, heads, t, head_dim = q.shape
    assert out.shape == (batch, t, heads, head_dim) and out.dtype == q.dtype and out.is_contiguous()
    assert torch.isfinite(out).all()
    assert rel_error(out, exact) < TOLERANCE[q.dtype], rel_error(out, exact)


CASES = [(torch.float32, 1, 1), (torch.float32, 2, 5), (torch.bfloat16, 4, 3)]  # dtype, GQA group, T


@pytest.mark.parametrize(("dtype", "group", "t"), CASES)
def test_attention_cpu_matches_reference(dtype: torch.dtype, group: int, t: int) -> None:
    q, cache, slot_ids, start_pos = make_case(3, 2 * group, 2, t, 40, dtype, seed=group + t)
    out = kernel.attention_cpu(q, cache, 1, slot_ids, start_pos, 0.125)
    check(out, q, cache, 1, slot_ids, start_pos, 0.125)


def test_attention_cpu_never_reads_past_each_row() -> None:
    """Dead positions (past start_pos + T of each row, NaN in the poisoning tests) reach no output."""
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 48, torch.float32, seed=3)
    start_pos.copy_(torch.tensor([5, 20]))
    dirty = cache.clone()
    for slot, start in zip(slot_ids.tolist(), start_pos.tolist(), strict=True):
        dirty[:, :, slot, :, start + 3 :] = float("nan")
    out = kernel.attention_cpu(q, dirty, 1, slot_ids, start_pos, 0.125)
    check(out, q, cache, 1, slot_ids, start_pos, 0.125)


def test_attention_cpu_fake_gives_the_output_shape() -> None:
    q, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 16, torch.float32, seed=4)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        q, cache, slot_ids, start_pos = (mode.from_tensor(x) for x in (q, cache, slot_ids, start_pos))
        fake = kernel.attention_cpu(q, cache, 0, slot_ids, start_pos, 0.1)
    assert fake.shape == (2, 3, 4, 64)
