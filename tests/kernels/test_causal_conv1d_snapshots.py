"""causal_conv1d_snapshots kernel vs graphspec.ops.causal_conv1d_snapshots_reference (the verify
forward's depthwise causal conv1d + SiLU with a conv-state snapshot per position): outputs and every
snapshot, windows reaching back into the conv state, x as a strided view, scattered slots, the slot's
state untouched, an empty batch."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import causal_conv1d_snapshots as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def make_inputs(batch, t, channels, width, dtype, seed, slots=5, layers=3):
    """x [B, T, C] as a column slice of a wider projection, conv state [L, SLOTS, C, W-1], weight [C, W]
    as the model's conv1d.weight.squeeze(1) view, scattered slots."""
    g = generator(seed)
    x = torch.randn(batch, t, channels + 7, generator=g).to(DEVICE, dtype)[..., 3 : 3 + channels]
    state = torch.randn(layers, slots, channels, width - 1, generator=g).to(DEVICE, dtype)
    weight = torch.randn(channels, 1, width, generator=g).to(DEVICE, dtype).squeeze(1)
    slot_ids = torch.randperm(slots, generator=g)[:batch].to(DEVICE)
    return x, state, slot_ids, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("batch", "t", "channels", "width", "block_c"), [(3, 4, 40, 4, 16), (2, 1, 8, 4, 8), (1, 6, 24, 2, 32)]
)
def test_matches_reference(batch, t, channels, width, block_c, dtype):
    x, state, slot_ids, weight = make_inputs(batch, t, channels, width, dtype, seed=t)
    before = state.clone()
    poison_allocator()
    out, snapshots = kernel.causal_conv1d_snapshots(x, state, 2, slot_ids, weight, block_c=block_c)
    ref_out, ref_snapshots = kernel.causal_conv1d_snapshots_reference(x, state, 2, slot_ids, weight)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out, ref_out, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(snapshots, ref_snapshots, rtol=0, atol=0)  # copies of inputs: exact
    assert torch.equal(state, before)


def test_empty_batch_launches_nothing():
    x, state, slot_ids, weight = make_inputs(1, 4, 8, 4, torch.float32, seed=0)
    out, snapshots = kernel.causal_conv1d_snapshots(x[:0], state, 0, slot_ids[:0], weight)
    assert out.shape == (0, 4, 8) and snapshots.shape == (0, 4, 8, 3)


def test_op_takes_config():
    x, state, slot_ids, weight = make_inputs(2, 3, 16, 4, torch.float32, seed=1)
    out, _ = torch.ops.graphspec.causal_conv1d_snapshots_triton(
        x, state, 1, slot_ids, weight, *kernel.CONFIGS[90].values()
    )
    torch.testing.assert_close(
        out, kernel.causal_conv1d_snapshots_reference(x, state, 1, slot_ids, weight)[0], rtol=1e-5, atol=1e-5
    )
    opcheck(torch.ops.graphspec.causal_conv1d_snapshots_triton, (x, state, 1, slot_ids, weight, 16, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_qwen3_5_shapes_gpu(batch):
    """Qwen3.5-0.8B-shaped conv (C = 2*16*128 + 16*128 = 6144, W = 4) at K+1 = 4 positions, bf16."""
    x, state, slot_ids, weight = make_inputs(batch, 4, 6144, 4, torch.bfloat16, seed=batch, slots=9)
    out, snapshots = kernel.causal_conv1d_snapshots(x, state, 1, slot_ids, weight, **kernel.CONFIGS[90])
    ref_out, ref_snapshots = kernel.causal_conv1d_snapshots_reference(x, state, 1, slot_ids, weight)
    torch.testing.assert_close(out, ref_out, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(snapshots, ref_snapshots, rtol=0, atol=0)
