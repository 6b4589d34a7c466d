"""The C++ row loop of the CPU attention (kernels/attention_cpu_native.py) against attention_reference and
against the torch path it replaces: outputs, cache writes, dead positions left unread, and when it
declines (returns None) so the torch path runs."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import attention_cpu, attention_cpu_native, rotary_kv_attention_cpu

from tests.kernels.helpers import generator, rel_error


def make_case(batch: int, q_heads: int, kv_heads: int, t: int, seq: int, seed: int):
    """q [B, Hq, T, 64] (a transposed view, as the decoder passes it), k/v [B, Hkv, T, 64], a random cache,
    distinct slots, start positions from 0 to the last that fits."""
    g = generator(seed)
    cache = torch.randn(2, 2, batch + 2, kv_heads, seq, 64, generator=g)
    q = torch.randn(batch, t, q_heads, 64, generator=g).transpose(1, 2)
    k = torch.randn(batch, t, kv_heads, 64, generator=g).transpose(1, 2)
    v = torch.randn(batch, t, kv_heads, 64, generator=g).transpose(1, 2)
    slot_ids = torch.randperm(batch + 2, generator=g)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g)
    start_pos[0], start_pos[-1] = 0, seq - t
    return q, k, v, cache, slot_ids, start_pos


def native(q, cache, slot_ids, start_pos, k=None, v=None):
    return attention_cpu_native.attend(
        q, cache, 1, slot_ids.tolist(), start_pos.tolist(), slot_ids, start_pos, 0.125, k, v
    )


@pytest.fixture(autouse=True)
def built() -> None:
    """Every test here runs the C++ loop, built as a compile_cpu Runtime builds it."""
    assert attention_cpu_native.build()  # where Inductor's C++ compiler works (compile_cpu needs it too)


@pytest.mark.parametrize(("group", "t"), [(1, 1), (3, 5), (2, 16), (4, 2)])
def test_matches_the_reference(group: int, t: int) -> None:
    q, _, _, cache, slot_ids, start_pos = make_case(4, 2 * group, 2, t, 70, seed=group * 10 + t)
    out = native(q, cache, slot_ids, start_pos)
    exact = attention_cpu.attention_reference(q, cache, 1, slot_ids, start_pos, 0.125)
    assert out.shape == (4, t, 2 * group, 64) and out.is_contiguous()
    assert rel_error(out, exact) < 1e-5


@pytest.mark.parametrize("t", [1, 5])
def test_writes_and_attends_as_the_torch_path(t: int, monkeypatch) -> None:
    """With k/v: the same cache bits as the torch path's slice writes, the same output to fp32 rounding."""
    q, k, v, cache, slot_ids, start_pos = make_case(3, 4, 2, t, 50, seed=t)
    ours = cache.clone()
    out = rotary_kv_attention_cpu.kv_attention(q, k, v, ours, 1, slot_ids, start_pos, 0.125)
    monkeypatch.setattr(attention_cpu_native, "_compiled", [None])  # as where it did not build
    theirs = cache.clone()
    expected = rotary_kv_attention_cpu.kv_attention(q, k, v, theirs, 1, slot_ids, start_pos, 0.125)
    assert torch.equal(ours, theirs)
    assert rel_error(out, expected) < 1e-6


def test_never_reads_past_each_row() -> None:
    """Dead positions (past start_pos + T of each row, NaN in the poisoning tests) reach no output."""
    q, _, _, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 48, seed=3)
    start_pos.copy_(torch.tensor([5, 20]))
    dirty = cache.clone()
    for slot, start in zip(slot_ids.tolist(), start_pos.tolist(), strict=True):
        dirty[:, :, slot, :, start + 3 :] = float("nan")
    out = native(q, dirty, slot_ids, start_pos)
    assert torch.isfinite(out).all()
    assert rel_error(out, attention_cpu.attention_reference(q, cache, 1, slot_ids, start_pos, 0.125)) < 1e-5


def test_declines_what_it_does_not_do() -> None:
    """None (the torch path runs): 16-bit tensors, blocks longer than MAX_QUERIES (prefill chunks), and
    a position or slot outside the cache, which the C++ would otherwise write out of bounds."""
    q, k, v, cache, slot_ids, start_pos = make_case(2, 4, 2, 3, 40, seed=5)
    assert native(q.bfloat16(), cache.bfloat16(), slot_ids, start_pos) is None
    long_q = torch.randn(2, 4, attention_cpu_native.MAX_QUERIES + 1, 64)
    assert native(long_q, cache, slot_ids, torch.zeros(2, dtype=torch.int64)) is None
    assert native(q, cache, slot_ids, torch.tensor([0, 38]), k, v) is None  # 38 + 3 > 40
    assert native(q, cache, torch.tensor([0, 4]), start_pos, k, v) is None  # 4 slots
    assert native(q, cache, slot_ids, start_pos, k, v) is not None
