"""kernels/scaled_silu_mul_linear.py (a one-row gate/up GEMV with the folded norm's scaled SwiGLU) against the op's
reference, the two ops it replaces (the GEMV, then scaled_silu_mul's kernel) and its refusals."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import gemv
from graphspec.kernels import scaled_silu_mul as unfused_swiglu
from graphspec.kernels import scaled_silu_mul_linear as kernel
from torch.library import opcheck

from graphspec import ops
from tests.kernels.helpers import DEVICE, TOLERANCE, generator, poison_allocator, rel_error

EPS = 1e-5


def operands(inter: int, hidden: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual row x [1, H] (RMS about 3, as a residual stream's) and a gate/up weight [2I, H] on DEVICE."""
    g = generator(seed)
    x = (torch.randn(1, hidden, generator=g) * 3).to(DEVICE, dtype)
    weight = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("inter", "hidden", "block_k"), [(32, 512, 128), (20, 300, 128), (13, 256, 64)], ids=["even", "k-tail", "n-tail"]
)
def test_matches_the_reference(dtype: torch.dtype, inter: int, hidden: int, block_k: int) -> None:
    poison_allocator()
    x, weight = operands(inter, hidden, dtype, seed=inter * hidden)
    out = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, block_n=8, block_k=block_k)
    exact = ops.scaled_silu_mul_linear_reference(x.double(), weight.double().t(), EPS)
    assert out.shape == (1, inter) and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype]


def test_equals_the_gemv_then_scaled_silu_mul_in_fp32() -> None:
    """Where the products sum exactly (fp32, small integers), the fused kernel gives the two kernels' result to an
    fp32 ulp: gate and up as the GEMV writes them, then scaled_silu_mul's SwiGLU (their row scales sum the squares
    in different orders)."""
    g = generator(9)
    x = torch.randint(-3, 4, (1, 1024), generator=g).to(DEVICE, torch.float32)
    weight = torch.randint(-2, 3, (128, 1024), generator=g).to(DEVICE, torch.float32)
    fused = kernel.scaled_silu_mul_linear(x, weight.t(), EPS)
    gate_up = gemv.gemv(x, weight.t())
    config = unfused_swiglu.CONFIGS["default"]
    two = unfused_swiglu.scaled_silu_mul(gate_up, x, EPS, config["tile_elems"], config["num_warps"])
    torch.testing.assert_close(fused, two, rtol=1e-6, atol=0)


@pytest.mark.parametrize("case", ["two rows", "weight not transposed", "odd width", "dtypes differ"])
def test_refuses_what_it_does_not_take(case: str) -> None:
    x, weight = operands(8, 64, torch.float32, seed=4)
    args = {
        "two rows": (torch.cat([x, x]), weight.t()),
        "weight not transposed": (x, weight.t().contiguous()),
        "odd width": (x, weight[:15].t()),
        "dtypes differ": (x.to(torch.bfloat16), weight.t()),
    }[case]
    assert not kernel.fits(*args)
    with pytest.raises(ValueError, match="scaled_silu_mul_linear kernel"):
        kernel.scaled_silu_mul_linear(*args, EPS)


def test_kernel_op_takes_the_reference_s_arguments_and_opcheck() -> None:
    x, weight = operands(16, 128, torch.bfloat16, seed=6)
    config = tuple(kernel.CONFIGS[90].values())
    out = torch.ops.graphspec.scaled_silu_mul_linear_triton(x, weight.t(), EPS, *config)
    reference = ops.scaled_silu_mul_linear(x, weight.t(), EPS)
    assert rel_error(out, reference.float()) < TOLERANCE[torch.bfloat16]
    opcheck(torch.ops.graphspec.scaled_silu_mul_linear_triton, (x, weight.t(), EPS, *config))


@pytest.mark.gpu
@pytest.mark.parametrize(("inter", "hidden"), [(14336, 4096), (8192, 2048)])
def test_real_shapes_gpu(inter: int, hidden: int) -> None:
    """bf16 at the 8B and 1B MLPs with the sm_90 row: as close to the fp64 reference as the two kernels it replaces."""
    poison_allocator()
    x, weight = operands(inter, hidden, torch.bfloat16, seed=7)
    exact = ops.scaled_silu_mul_linear_reference(x.double(), weight.double().t(), EPS)
    config = kernel.CONFIGS[90]
    fused = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, **config)
    swiglu = unfused_swiglu.CONFIGS[90]
    two = unfused_swiglu.scaled_silu_mul(gemv.gemv(x, weight.t()), x, EPS, swiglu["tile_elems"], swiglu["num_warps"])
    assert rel_error(fused, exact) <= 1.05 * rel_error(two, exact) + 1e-4
