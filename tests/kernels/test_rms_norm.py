"""rms_norm kernel vs graphspec.ops.rms_norm_reference: same rounding, so 16-bit outputs match exactly."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import rms_norm as kernel

from tests.kernels.helpers import DEVICE, TOLERANCE, assert_rounding_equal, generator, poison_allocator, rel_error


def make_inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 64), (5, 96), (3, 4, 2, 128)])
def test_rms_norm_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, weight = make_inputs(shape, dtype, seed=len(shape))
    poison_allocator()
    out = kernel.rms_norm(x, weight, 1e-6)
    reference = kernel.rms_norm_reference(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    if dtype == torch.float32:
        assert rel_error(out, reference) < TOLERANCE[dtype]
    else:  # fp32 statistics, one rounding to bf16, one rounded product: the reference's exact steps
        assert_rounding_equal(out, reference)


def test_rms_norm_non_contiguous_rows() -> None:
    """Qwen3's q/k norm sees per-head rows of a [B, T, H, D] view; a transposed input works too."""
    x, weight = make_inputs((2, 4, 3, 64), torch.bfloat16, seed=1)
    x = x.transpose(1, 2)  # [2, 3, 4, 64], rows no longer evenly strided
    out = kernel.rms_norm(x, weight, 1e-5, tile_elems=128)  # 2 rows per tile, a partial last tile
    assert_rounding_equal(out, kernel.rms_norm_reference(x, weight, 1e-5))


def test_rms_norm_dim_not_a_power_of_two() -> None:
    x, weight = make_inputs((3, 100), torch.float32, seed=2)
    out = torch.ops.graphspec.rms_norm_triton(x, weight, 1e-5, *kernel.CONFIGS["default"].values())
    assert rel_error(out, kernel.rms_norm_reference(x, weight, 1e-5)) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 9, 576])
def test_rms_norm_real_shapes_gpu(rows: int) -> None:
    """8B-class hidden size 4096 (rows = B * (K+1)) and per-head D 128 rows."""
    for shape in ((rows, 4096), (rows, 32, 128)):
        x, weight = make_inputs(shape, torch.bfloat16, seed=rows)
        out = kernel.rms_norm(x, weight, 1e-5, **kernel.CONFIGS[90])
        assert_rounding_equal(out, kernel.rms_norm_reference(x, weight, 1e-5))
