"""add_rms_norm kernel vs graphspec.ops.add_rms_norm_reference (normed output and the residual sum)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import add_rms_norm as kernel

from tests.kernels.helpers import DEVICE, TOLERANCE, assert_rounding_equal, generator, poison_allocator, rel_error


def make_inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int):
    g = generator(seed)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype)
    residual = (torch.randn(shape, generator=g) * 4).to(DEVICE, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE, dtype)
    return x, residual, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 64), (7, 160)])
def test_add_rms_norm_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, residual, weight = make_inputs(shape, dtype, seed=shape[-1])
    poison_allocator()
    out, total = kernel.add_rms_norm(x, residual, weight, 1e-6)
    ref_out, ref_total = kernel.add_rms_norm_reference(x, residual, weight, 1e-6)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)  # one rounded add either way
    assert out.is_contiguous() and total.is_contiguous() and out.dtype == dtype
    if dtype == torch.float32:
        assert rel_error(out, ref_out) < TOLERANCE[dtype]
    else:
        assert_rounding_equal(out, ref_out)


def test_add_rms_norm_non_contiguous_inputs() -> None:
    x, residual, weight = make_inputs((3, 2, 64), torch.bfloat16, seed=3)
    x, residual = x.transpose(0, 1), residual.transpose(0, 1)
    out, total = torch.ops.graphspec.add_rms_norm_triton(x, residual, weight, 1e-5, 128, 4)
    ref_out, ref_total = kernel.add_rms_norm_reference(x, residual, weight, 1e-5)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    assert_rounding_equal(out, ref_out)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 9, 576])
def test_add_rms_norm_real_shapes_gpu(rows: int) -> None:
    x, residual, weight = make_inputs((rows, 4096), torch.bfloat16, seed=rows)
    out, total = kernel.add_rms_norm(x, residual, weight, 1e-5, **kernel.CONFIGS[90])
    ref_out, ref_total = kernel.add_rms_norm_reference(x, residual, weight, 1e-5)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    assert_rounding_equal(out, ref_out)
