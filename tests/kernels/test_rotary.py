"""rotary kernel vs graphspec.ops.rotary_reference: the reference's per-op rounding, so exact in bf16."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import rotary as kernel

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def make_inputs(batch: int, q_heads: int, kv_heads: int, t: int, head_dim: int, dtype: torch.dtype, seed: int):
    """q and k as the decoder passes them: [B, T, H, D] projections transposed to [B, H, T, D] views."""
    g = generator(seed)
    q = torch.randn(batch, t, q_heads, head_dim, generator=g).to(DEVICE, dtype).transpose(1, 2)
    k = torch.randn(batch, t, kv_heads, head_dim, generator=g).to(DEVICE, dtype).transpose(1, 2)
    angles = torch.rand(batch, t, head_dim // 2, generator=g) * 100
    angles = torch.cat((angles, angles), dim=-1)
    return q, k, angles.cos().to(DEVICE), angles.sin().to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(4, 4, 64), (8, 2, 128), (6, 3, 96)])
def test_rotary_matches_reference(dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int) -> None:
    q, k, cos, sin = make_inputs(2, q_heads, kv_heads, 3, head_dim, dtype, seed=q_heads)
    poison_allocator()
    q_out, k_out = kernel.rotary(q, k, cos, sin, block_h=4)  # head blocks straddle the q/k boundary
    q_ref, k_ref = kernel.rotary_reference(q, k, cos, sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    # fp32 on the GPU may fuse a product into an FMA: allow an ulp there; 16-bit dtypes are bit-exact.
    tolerance = 2e-6 if dtype == torch.float32 else 0.0
    torch.testing.assert_close(q_out, q_ref, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(k_out, k_ref, rtol=tolerance, atol=tolerance)


def test_rotary_op_takes_config() -> None:
    q, k, cos, sin = make_inputs(1, 2, 1, 2, 64, torch.bfloat16, seed=0)
    q_out, k_out = torch.ops.graphspec.rotary_triton(q, k, cos, sin, 2, 1)
    q_ref, k_ref = kernel.rotary_reference(q, k, cos, sin)
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=0)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "t"), [(1, 2), (64, 9)])
def test_rotary_real_shapes_gpu(batch: int, t: int) -> None:
    q, k, cos, sin = make_inputs(batch, 32, 8, t, 128, torch.bfloat16, seed=batch)
    q_out, k_out = kernel.rotary(q, k, cos, sin, **kernel.CONFIGS[90])
    q_ref, k_ref = kernel.rotary_reference(q, k, cos, sin)
    torch.testing.assert_close(q_out, q_ref, rtol=0, atol=0)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0)
