"""gated_rms_norm kernel vs graphspec.ops.gated_rms_norm_reference (the Gated DeltaNet output norm)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import gated_rms_norm as kernel

from tests.kernels.helpers import DEVICE, TOLERANCE, generator, poison_allocator, rel_error


def make_inputs(batch: int, t: int, heads: int, dim: int, dtype: torch.dtype, seed: int):
    """x [B, T, Hv, Dv] contiguous (the recurrence's output), the gate z a strided [B, T, Hv, Dv] slice
    of a wider projection (as the fused in_proj gives it), weight [Dv] near one."""
    g = generator(seed)
    x = torch.randn(batch, t, heads, dim, generator=g).to(DEVICE, dtype)
    projection = (torch.randn(batch, t, heads * dim + 48, generator=g) * 3).to(DEVICE, dtype)
    gate = projection[..., 16 : 16 + heads * dim].view(batch, t, heads, dim)
    weight = (1 + 0.1 * torch.randn(dim, generator=g)).to(DEVICE, dtype)
    return x, gate, weight


def check(out: torch.Tensor, x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> None:
    reference = kernel.gated_rms_norm_reference(x, gate, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    if x.dtype == torch.float32:
        assert rel_error(out, reference) < TOLERANCE[torch.float32]
        return
    # The reference's roundings in order; exp is numpy's under the interpreter and libdevice's on the
    # GPU (torch's CPU exp is neither), so a silu may land an fp32 ulp away: at most one ulp of the
    # output's dtype, in few elements.
    ulp = torch.finfo(x.dtype).eps * reference.float().abs().clamp_min(torch.finfo(x.dtype).tiny)
    diff = (out.float() - reference.float()).abs()
    assert (diff <= 2.01 * ulp).all(), (diff / ulp).max()
    assert (diff > 0).float().mean().item() < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2, 2, 64), (2, 3, 4, 32), (1, 4, 3, 96)])
def test_gated_rms_norm_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, gate, weight = make_inputs(*shape, dtype, seed=sum(shape))
    assert not gate.is_contiguous()
    poison_allocator()
    check(kernel.gated_rms_norm(x, gate, weight, 1e-6, tile_elems=128), x, gate, weight)


def test_gated_rms_norm_refuses_a_gate_of_another_shape() -> None:
    x, gate, weight = make_inputs(1, 2, 2, 32, torch.float32, seed=0)
    with pytest.raises(ValueError, match="gate"):
        kernel.gated_rms_norm(x, gate[:, :1], weight, 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 32])
def test_gated_rms_norm_real_shapes_gpu(rows: int) -> None:
    """Qwen3.5-small: 16 value heads of 128."""
    x, gate, weight = make_inputs(rows, 1, 16, 128, torch.bfloat16, seed=rows)
    check(kernel.gated_rms_norm(x, gate, weight, 1e-6, **kernel.CONFIGS[90]), x, gate, weight)
