"""gdn_gates kernel vs graphspec.ops.gdn_gates_reference: the Gated DeltaNet's log decay g (fp32) and beta."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import gdn_gates as kernel

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def make_inputs(batch: int, t: int, heads: int, dtype: torch.dtype, seed: int):
    """a and b as the fused in_proj gives them: [B, T, Hv] slices of one wider projection; a spans
    softplus's threshold (a + dt_bias above 20 on some heads) and large negative values."""
    g = generator(seed)
    projection = torch.randn(batch, t, 2 * heads + 24, generator=g) * 4
    projection[..., 24 + heads :: 3] += 22.0  # some a past the threshold
    projection = projection.to(DEVICE, dtype)
    b, a = projection[..., 24 : 24 + heads], projection[..., 24 + heads :]
    a_log = (torch.rand(heads, generator=g) * 3 - 1).to(DEVICE, torch.float32)
    dt_bias = (torch.randn(heads, generator=g)).to(DEVICE, dtype)
    return a, b, a_log, dt_bias


def check(a, b, a_log, dt_bias, g, beta) -> None:
    ref_g, ref_beta = kernel.gdn_gates_reference(a, b, a_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == b.dtype and g.is_contiguous() and beta.is_contiguous()
    # exp and log1p are libdevice's on the GPU, numpy's exp and log1p through log under the interpreter: a few
    # fp32 ulps from torch's; beta within an ulp of its dtype.
    torch.testing.assert_close(g, ref_g, rtol=2e-6, atol=1e-7)
    ulp = torch.finfo(b.dtype).eps * ref_beta.float().abs().clamp_min(torch.finfo(b.dtype).tiny)
    assert ((beta.float() - ref_beta.float()).abs() <= 2.01 * ulp).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 2, 4), (2, 5, 16), (3, 2, 48)])
def test_gdn_gates_match_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    a, b, a_log, dt_bias = make_inputs(*shape, dtype, seed=sum(shape))
    assert not a.is_contiguous()
    poison_allocator()
    check(a, b, a_log, dt_bias, *kernel.gdn_gates(a, b, a_log, dt_bias, tile_elems=32))


def test_gdn_gates_refuse_parameters_of_another_width() -> None:
    a, b, a_log, dt_bias = make_inputs(1, 2, 4, torch.float32, seed=0)
    with pytest.raises(ValueError, match="do not agree"):
        kernel.gdn_gates(a, b, a_log[:3], dt_bias[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 32])
def test_gdn_gates_real_shapes_gpu(rows: int) -> None:
    a, b, a_log, dt_bias = make_inputs(rows, 4, 16, torch.bfloat16, seed=rows)
    check(a, b, a_log, dt_bias, *kernel.gdn_gates(a, b, a_log, dt_bias, **kernel.CONFIGS[90]))
