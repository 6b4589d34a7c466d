"""gated_delta_rule_snapshots kernel vs graphspec.ops.gated_delta_rule_snapshots_reference (the verify
forward's Gated DeltaNet recurrence with a state snapshot per position): outputs and every snapshot,
grouped value heads, q/k/v as strided views of one projection, rows in scattered slots, the slot's state
untouched, an empty batch."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import gated_delta_rule_snapshots as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator, poison_allocator

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


def make_inputs(batch, t, key_heads, value_heads, key_dim, value_dim, dtype, seed, slots=6, layers=2):
    """q, k, v as [B, T, H, D] slices of one fused projection (non-contiguous), g (fp32 log decay) and
    beta in the layout the model passes, a random fp32 state [L, SLOTS, Hv, Dk, Dv], scattered slots."""
    g = generator(seed)
    widths = [key_heads * key_dim, key_heads * key_dim, value_heads * value_dim]
    mixed = torch.randn(batch, t, sum(widths), generator=g).to(DEVICE, dtype)
    q, k, v = mixed.split(widths, dim=-1)
    q = q.reshape(batch, t, key_heads, key_dim)
    k = k.reshape(batch, t, key_heads, key_dim)
    v = v.reshape(batch, t, value_heads, value_dim)
    log_decay = (-torch.rand(batch, t, value_heads, generator=g) * 2).to(DEVICE)
    beta = torch.rand(batch, t, value_heads, generator=g).to(DEVICE, dtype)
    state = torch.randn(layers, slots, value_heads, key_dim, value_dim, generator=g).to(DEVICE)
    slot_ids = torch.randperm(slots, generator=g)[:batch].to(DEVICE)
    return q, k, v, log_decay, beta, state, slot_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("batch", "t", "key_heads", "value_heads", "key_dim", "value_dim", "block_v"),
    [(3, 4, 2, 4, 16, 16, 8), (2, 1, 1, 1, 8, 24, 16), (1, 5, 2, 2, 32, 8, 32)],
)
def test_matches_reference(batch, t, key_heads, value_heads, key_dim, value_dim, block_v, dtype):
    q, k, v, log_decay, beta, state, slot_ids = make_inputs(
        batch, t, key_heads, value_heads, key_dim, value_dim, dtype, seed=t
    )
    before = state.clone()
    poison_allocator()
    out, snapshots = kernel.gated_delta_rule_snapshots(q, k, v, log_decay, beta, state, 1, slot_ids, block_v=block_v)
    ref_out, ref_snapshots = kernel.gated_delta_rule_snapshots_reference(q, k, v, log_decay, beta, state, 1, slot_ids)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    torch.testing.assert_close(snapshots, ref_snapshots, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 2e-2)
    assert torch.equal(state, before)  # the accept region writes the state, never the verify forward


def test_empty_batch_launches_nothing():
    q, k, v, log_decay, beta, state, slot_ids = make_inputs(1, 4, 1, 2, 8, 8, torch.float32, seed=0)
    out, snapshots = kernel.gated_delta_rule_snapshots(
        q[:0], k[:0], v[:0], log_decay[:0], beta[:0], state, 0, slot_ids[:0]
    )
    assert out.shape == (0, 4, 2, 8) and snapshots.shape == (0, 4, 2, 8, 8)


def test_op_takes_config():
    inputs = make_inputs(2, 3, 1, 2, 16, 16, torch.float32, seed=1)
    out, _ = torch.ops.graphspec.gated_delta_rule_snapshots_triton(
        *inputs[:6], 0, inputs[6], *kernel.CONFIGS[90].values()
    )
    ref_out, _ = kernel.gated_delta_rule_snapshots_reference(*inputs[:6], 0, inputs[6])
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    opcheck(torch.ops.graphspec.gated_delta_rule_snapshots_triton, (*inputs[:6], 0, inputs[6], 16, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_qwen3_5_shapes_gpu(batch):
    """Qwen3.5-0.8B-shaped GDN layer (Hk 16, Hv 16, Dk = Dv = 128) at K+1 = 4 verify positions, bf16."""
    q, k, v, log_decay, beta, state, slot_ids = make_inputs(
        batch, 4, 16, 16, 128, 128, torch.bfloat16, seed=batch, slots=9
    )
    out, snapshots = kernel.gated_delta_rule_snapshots(
        q, k, v, log_decay, beta, state, 1, slot_ids, **kernel.CONFIGS[90]
    )
    ref_out, ref_snapshots = kernel.gated_delta_rule_snapshots_reference(q, k, v, log_decay, beta, state, 1, slot_ids)
    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(snapshots, ref_snapshots, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_form_matches_reference(dtype):
    """kernels/gated_delta_rule.py (the same kernel without snapshots): the final state after each row's
    length (right padding never advances it), zeros for rows at position 0 even over a NaN slot."""
    from graphspec.kernels import gated_delta_rule as prefill

    q, k, v, log_decay, beta, state, slot_ids = make_inputs(3, 6, 2, 4, 16, 16, dtype, seed=7)
    state[1, slot_ids[0]] = float("nan")  # row 0 starts a sequence: its slot's content must not leak
    start_pos, lengths = torch.tensor([0, 5, 9], device=DEVICE), torch.tensor([6, 2, 0], device=DEVICE)
    out, final = prefill.gated_delta_rule(q, k, v, log_decay, beta, state, 1, slot_ids, start_pos, lengths, block_v=8)
    ref_out, ref_final = prefill.gated_delta_rule_reference(
        q, k, v, log_decay, beta, state, 1, slot_ids, start_pos, lengths
    )
    rtol, atol = TOLERANCE[dtype]
    assert torch.isfinite(final).all()
    torch.testing.assert_close(final, ref_final, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 2e-2)
    live = torch.arange(6, device=DEVICE)[None, :] < lengths[:, None]  # outputs past a row's length are dead
    torch.testing.assert_close(out[live], ref_out[live], rtol=rtol, atol=atol)
    if dtype == torch.bfloat16:
        # opcheck runs the interpreted kernel several times; its only dtype-dependent check is that the
        # fake outputs' dtypes are the real ones, which bf16 inputs test and fp32 ones cannot tell apart.
        opcheck(
            torch.ops.graphspec.gated_delta_rule_triton,
            (q, k, v, log_decay, beta, state, 1, slot_ids, start_pos, lengths, 8, 4),
        )
