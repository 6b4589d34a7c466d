"""offset_rms_norm kernel vs graphspec.ops.offset_rms_norm_reference (the hybrid families' (1 + w) norm)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import offset_rms_norm as kernel

from tests.kernels.helpers import DEVICE, TOLERANCE, assert_rounding_equal, generator, poison_allocator, rel_error


def make_inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(seed)
    x = (torch.randn(shape, generator=g) * 3).to(DEVICE, dtype)
    weight = (0.1 * torch.randn(shape[-1], generator=g)).to(DEVICE, dtype)  # stored as offsets from one
    return x, weight


def check(out: torch.Tensor, reference: torch.Tensor) -> None:
    assert out.shape == reference.shape and out.dtype == reference.dtype and out.is_contiguous()
    if out.dtype == torch.float32:
        assert rel_error(out, reference) < TOLERANCE[torch.float32]
    else:  # fp32 statistics and scale, one rounding: the reference's steps
        assert_rounding_equal(out, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 64), (5, 96), (3, 4, 2, 128), (64,)])
def test_offset_rms_norm_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, weight = make_inputs(shape, dtype, seed=len(shape))
    poison_allocator()
    check(kernel.offset_rms_norm(x, weight, 1e-6), kernel.offset_rms_norm_reference(x, weight, 1e-6))


def test_offset_rms_norm_reads_a_strided_head_slice() -> None:
    """The gated attention's q norm: per-head [query | gate] rows of one projection, the query halves
    taken as a [B, T, H, D] view whose heads are 2D apart; tiles of 2 rows end mid-head-group."""
    g = generator(7)
    batch, t, heads, dim = 2, 3, 4, 64
    projection = torch.randn(batch, t, heads * 2 * dim + 32, generator=g).to(DEVICE, torch.bfloat16)
    q, _ = projection[..., : heads * 2 * dim].view(batch, t, heads, 2 * dim).chunk(2, dim=-1)
    assert not q.is_contiguous()
    weight = (0.1 * torch.randn(dim, generator=g)).to(DEVICE, torch.bfloat16)
    out = torch.ops.graphspec.offset_rms_norm_triton(q, weight, 1e-6, 128, 4)
    check(out, kernel.offset_rms_norm_reference(q, weight, 1e-6))


def test_offset_rms_norm_row_view_keeps_slices_in_place() -> None:
    projection = torch.zeros(2, 3, 10)
    view = kernel.row_view(projection[..., 2:6].view(2, 3, 2, 2))
    assert view.shape == (6, 2, 2) and view.data_ptr() == projection[..., 2:].data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 32])
def test_offset_rms_norm_real_shapes_gpu(rows: int) -> None:
    """Qwen3.5-small hidden 1024 rows and 256-wide gated-attention heads (8 q, 2 kv)."""
    for shape in ((rows, 1024), (rows, 8, 256)):
        x, weight = make_inputs(shape, torch.bfloat16, seed=rows)
        out = kernel.offset_rms_norm(x, weight, 1e-6, **kernel.CONFIGS[90])
        check(out, kernel.offset_rms_norm_reference(x, weight, 1e-6))
