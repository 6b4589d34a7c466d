"""scaled_silu_mul kernel (silu_mul's kernel with HAS_SCALE) vs graphspec.ops.scaled_silu_mul_reference: the
RMSNorm row scale of the un-normalized rows, applied to gate and up in fp32, one rounding at the end. The row
scale's sum runs in the kernel's order (chunks of SCALE_BLOCK) and torch's mean in its own, so results agree to
rounding, not bit for bit; what the rows feed must not change (the scale comes from x, not gate_up)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import scaled_silu_mul as kernel
from graphspec.kernels import silu_mul as silu_mul_kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_inputs(rows: tuple[int, ...], inter: int, hidden: int, dtype: torch.dtype, seed: int):
    g = generator(seed)
    gate_up = torch.randn((*rows, 2 * inter), generator=g) * 2
    x = torch.randn((*rows, hidden), generator=g) * 3 + 0.5  # rows with a mean square far from 1
    return gate_up.to(DEVICE, dtype), x.to(DEVICE, dtype)


def assert_close_to_reference(out: torch.Tensor, gate_up: torch.Tensor, x: torch.Tensor, eps: float) -> None:
    reference = kernel.scaled_silu_mul_reference(gate_up, x, eps)
    assert out.shape == reference.shape and out.dtype == reference.dtype and out.is_contiguous()
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    else:  # one rounding each; the fp32 scales may differ in their last bit: a 16-bit ulp at most
        ulp = torch.finfo(out.dtype).eps * reference.float().abs().clamp_min(torch.finfo(out.dtype).tiny)
        assert ((out.float() - reference.float()).abs() <= 1.01 * ulp).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "inter", "hidden"),
    [((2, 3), 128, 96), ((5,), 48, 200), ((1, 1), 256, 2 * silu_mul_kernel.SCALE_BLOCK + 40), ((7,), 2, 8)],
)  # several column blocks; several rows per program; a scale row over three SCALE_BLOCK chunks; tiny rows
def test_scaled_silu_mul_matches_reference(dtype: torch.dtype, rows: tuple[int, ...], inter: int, hidden: int) -> None:
    gate_up, x = make_inputs(rows, inter, hidden, dtype, seed=inter + hidden)
    out = kernel.scaled_silu_mul(gate_up, x, 1e-5, tile_elems=64)
    assert_close_to_reference(out, gate_up, x, 1e-5)


def test_the_scale_is_the_rows_own() -> None:
    """Row r's output depends on x's row r alone: scaling one x row by 8 divides its scale by 8 (up to eps),
    as dividing that row of gate_up by 8 would, and leaves every other row's bits."""
    gate_up, x = make_inputs((4,), 64, 128, torch.float32, seed=3)
    out = kernel.scaled_silu_mul(gate_up, x, 1e-12)
    scaled = x.clone()
    scaled[2] *= 8
    again = kernel.scaled_silu_mul(gate_up, scaled, 1e-12)
    assert torch.equal(again[[0, 1, 3]], out[[0, 1, 3]]) and not torch.equal(again[2], out[2])
    expected = kernel.scaled_silu_mul_reference(gate_up[2:3] / 8, x[2:3], 1e-12)[0]
    torch.testing.assert_close(again[2], expected, rtol=1e-5, atol=1e-6)


def test_strided_gate_up_and_its_unscaled_form() -> None:
    """gate_up a column slice of a wider projection; without scale_of the kernel is silu_mul's."""
    wide, x = make_inputs((3,), 80, 64, torch.bfloat16, seed=5)
    gate_up = wide[:, :128]
    assert_close_to_reference(kernel.scaled_silu_mul(gate_up, x, 1e-6, tile_elems=32), gate_up, x, 1e-6)
    assert torch.equal(silu_mul_kernel.silu_mul(gate_up, 32), silu_mul_kernel.silu_mul_reference(gate_up))


def test_op_takes_config_and_refuses_rows_that_do_not_match() -> None:
    gate_up, x = make_inputs((3,), 64, 32, torch.float32, seed=7)
    out = torch.ops.graphspec.scaled_silu_mul_triton(gate_up, x, 1e-5, *kernel.CONFIGS[90].values())
    assert_close_to_reference(out, gate_up, x, 1e-5)
    opcheck(torch.ops.graphspec.scaled_silu_mul_triton, (gate_up, x, 1e-5, 64, 4))
    with pytest.raises(ValueError, match="unit-stride rows"):
        kernel.scaled_silu_mul(gate_up, x[:2], 1e-5)
    assert kernel.scaled_silu_mul(gate_up[:0], x[:0], 1e-5).shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5, 80, 576])
def test_scaled_silu_mul_real_shapes_gpu(rows: int) -> None:
    """8B (H 4096, I 14336) and 1B (H 2048, I 8192) MLPs at decode, verify and prefill rows, bf16."""
    for hidden, inter in ((4096, 14336), (2048, 8192)):
        gate_up, x = make_inputs((rows,), inter, hidden, torch.bfloat16, seed=rows)
        config = (
            kernel.CONFIGS[(90, kernel.shape_class(gate_up))] if kernel.shape_class(gate_up) else kernel.CONFIGS[90]
        )
        assert_close_to_reference(kernel.scaled_silu_mul(gate_up, x, 1e-5, **config), gate_up, x, 1e-5)
