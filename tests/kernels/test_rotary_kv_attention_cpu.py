"""rotary_kv_attention_cpu vs graphspec.ops.rotary_kv_attention_reference: the cache bit for bit, the
output to fp32 rounding; dead cache positions never reach an output."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import rotary_kv_attention_cpu as kernel

from tests.kernels.helpers import TOLERANCE, assert_unread_past_the_window, bits, generator, rel_error


def make_case(batch: int, q_heads: int, kv_heads: int, t: int, seq: int, dtype: torch.dtype, seed: int):
    """q, k, v as transposed [B, T, H, D] slices of one qkv projection, cos/sin [B, T, D], a random
    cache (stale values at this step's positions), distinct slots, start positions up to the last fit."""
    g = generator(seed)
    widths = [q_heads * 64, kv_heads * 64, kv_heads * 64]
    qkv = torch.randn(batch, t, sum(widths), generator=g).to(dtype)
    q, k, v = (
        part.view(batch, t, heads, 64).transpose(1, 2)
        for part, heads in zip(qkv.split(widths, dim=-1), (q_heads, kv_heads, kv_heads), strict=True)
    )
    angles = torch.rand(batch, t, 32, generator=g) * 100
    angles = torch.cat((angles, angles), dim=-1)
    cache = torch.randn(2, 2, batch + 2, kv_heads, seq, 64, generator=g).to(dtype)
    slot_ids = torch.randperm(batch + 2, generator=g)[:batch]
    start_pos = torch.randint(0, seq - t + 1, (batch,), generator=g)
    start_pos[0], start_pos[-1] = 0, seq - t
    return (q, k, v, angles.cos(), angles.sin()), cache, slot_ids, start_pos


def norm_weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(11)
    return (1 + 0.1 * torch.randn(64, generator=g)).to(dtype), (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)


CASES = [  # dtype, GQA group, T, Qwen3's per-head norms, a folded input norm's source rows
    (torch.float32, 2, 5, False, False),
    (torch.float32, 1, 1, False, False),
    (torch.bfloat16, 4, 3, False, False),
    (torch.float32, 2, 3, True, False),
    (torch.float32, 2, 1, False, True),
    (torch.bfloat16, 2, 4, True, True),
]


@pytest.mark.parametrize(("dtype", "group", "t", "qk_norm", "row_scale"), CASES)
def test_rotary_kv_attention_cpu_matches_reference(
    dtype: torch.dtype, group: int, t: int, qk_norm: bool, row_scale: bool
) -> None:
    inputs, cache, slot_ids, start_pos = make_case(3, 2 * group, 2, t, 40, dtype, seed=group + t)
    norms = norm_weights(dtype) if qk_norm else (None, None)
    src = (torch.randn(3, t, 48, generator=generator(t)) * 2).to(dtype) if row_scale else None
    rows = (1e-6, True, src, 1e-5)  # norm_eps, causal, row_src, row_eps
    expected_cache = cache.clone()
    expected = kernel.rotary_kv_attention_reference(
        *inputs, expected_cache, 1, slot_ids, start_pos, 0.125, *norms, *rows
    )
    exact = kernel.rotary_kv_attention_reference(
        *(x.float() for x in inputs), cache.float(), 1, slot_ids, start_pos, 0.125,
        *(None if w is None else w.float() for w in norms), 1e-6, True, None if src is None else src.float(), 1e-5,
    )  # fmt: skip
    out = kernel.rotary_kv_attention_cpu(*inputs, cache, 1, slot_ids, start_pos, 0.125, *norms, *rows)
    assert torch.equal(bits(cache), bits(expected_cache))  # the same values written, nothing else
    assert out.shape == expected.shape and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype], rel_error(out, exact)


def test_rotary_kv_attention_cpu_ignores_dead_positions() -> None:
    """NaN past each row's window (as the poisoning tests leave it) reaches no output and stays put."""
    inputs, cache, slot_ids, start_pos = make_case(2, 4, 2, 5, 48, torch.float32, seed=5)
    start_pos.copy_(torch.tensor([7, 30]))
    reference, kernel_op = kernel.rotary_kv_attention_reference, kernel.rotary_kv_attention_cpu
    assert_unread_past_the_window(kernel_op, reference, inputs, cache, slot_ids, start_pos, 5)


def test_rotary_kv_attention_cpu_decomposes_for_tracing() -> None:
    """A composite: traced, the rotary shows as torch ops and only the cache write + attention stays
    one opaque op (what lets a compiled CPU step fuse the rotary)."""
    inputs, cache, slot_ids, start_pos = make_case(1, 4, 2, 2, 16, torch.float32, seed=6)
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, cos, sin, cache, slot_ids, start_pos):
        return kernel.rotary_kv_attention_cpu(q, k, v, cos, sin, cache, 0, slot_ids, start_pos, 0.125)

    gm = make_fx(step, tracing_mode="fake")(*inputs, cache, slot_ids, start_pos)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert kernel.kv_attention_cpu in targets and kernel.rotary_kv_attention_cpu not in targets
    assert torch.ops.aten.cat.default in targets  # rotate_half
