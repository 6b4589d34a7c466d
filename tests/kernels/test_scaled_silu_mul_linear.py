"""kernels/scaled_silu_mul_linear.py (a gate/up GEMV, one row, or tensor-core GEMM, 2 to 16 rows, with the folded
norm's scaled SwiGLU) against the op's reference, the two ops it replaces (the GEMV or matmul, then scaled_silu_mul's
kernel) and its refusals."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import gemv
from graphspec.kernels import scaled_silu_mul as unfused_swiglu
from graphspec.kernels import scaled_silu_mul_linear as kernel
from torch.library import opcheck

from graphspec import ops
from graphspec.models.decoder import SWIGLU_LINEAR_MAX_ROWS
from tests.kernels.helpers import DEVICE, TOLERANCE, generator, poison_allocator, rel_error

EPS = 1e-5


def operands(
    inter: int, hidden: int, dtype: torch.dtype, seed: int, rows: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual rows x [rows, H] (RMS about 3, as a residual stream's) and a gate/up weight [2I, H] on DEVICE."""
    g = generator(seed)
    x = (torch.randn(rows, hidden, generator=g) * 3).to(DEVICE, dtype)
    weight = (torch.randn(2 * inter, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("inter", "hidden", "block_k"), [(32, 512, 128), (20, 300, 128), (13, 256, 64)], ids=["even", "k-tail", "n-tail"]
)
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_matches_the_reference(dtype: torch.dtype, inter: int, hidden: int, block_k: int, rows: int) -> None:
    poison_allocator()
    x, weight = operands(inter, hidden, dtype, seed=inter * hidden + rows, rows=rows)
    block_n = 8 if rows == 1 else 16  # two rows and more: a dot operand's side
    out = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, block_n=block_n, block_k=block_k)
    exact = ops.scaled_silu_mul_linear_reference(x.double(), weight.double().t(), EPS)
    assert out.shape == (rows, inter) and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype]


def test_each_row_is_the_row_alone() -> None:
    """Rows of a few-row launch do not mix: each equals the reference of that row alone (its own row scale), and a
    row scaled up a thousandfold changes only its own output."""
    x, weight = operands(24, 256, torch.float32, seed=5, rows=5)
    x[3] *= 1000
    out = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, block_n=16, block_k=128)
    for row in range(5):
        alone = ops.scaled_silu_mul_linear_reference(x[row : row + 1].double(), weight.double().t(), EPS)
        assert rel_error(out[row : row + 1], alone) < TOLERANCE[torch.float32], row


def test_takes_the_rows_the_decoder_fuses() -> None:
    """models/decoder.py emits the op for MLPs of up to SWIGLU_LINEAR_MAX_ROWS rows: the kernel takes them all, and
    the few-row config rows are the ones shape_class names for two rows and more."""
    assert kernel.MAX_ROWS == SWIGLU_LINEAR_MAX_ROWS
    x, weight = operands(8, 64, torch.float32, seed=4, rows=SWIGLU_LINEAR_MAX_ROWS)
    assert kernel.fits(x, weight.t()) and kernel.shape_class(x, weight.t()) == "few_rows"
    assert kernel.shape_class(x[:1], weight.t()) is None and kernel.shape_class(x[:2], weight.t()) == "few_rows"
    assert all(kernel.CONFIGS[(key, "few_rows")]["block_n"] >= kernel.DOT_ROWS for key in (80, 90, "default"))


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


def test_equals_the_matmul_then_scaled_silu_mul_in_fp32_at_five_rows() -> None:
    """The few-row kernel's dots sum small integers exactly (IEEE fp32 dots): gate and up as the matmul writes them,
    then scaled_silu_mul's SwiGLU, to an fp32 ulp (the row scales sum the squares in different orders)."""
    g = generator(10)
    x = torch.randint(-3, 4, (5, 1024), generator=g).to(DEVICE, torch.float32)
    weight = torch.randint(-2, 3, (128, 1024), generator=g).to(DEVICE, torch.float32)
    fused = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, **kernel.CONFIGS[(90, "few_rows")])
    config = unfused_swiglu.CONFIGS["default"]
    two = unfused_swiglu.scaled_silu_mul(x @ weight.t(), x, EPS, config["tile_elems"], config["num_warps"])
    torch.testing.assert_close(fused, two, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "case", ["seventeen rows", "few rows with a one-row tile", "weight not transposed", "odd width", "dtypes differ"]
)
def test_refuses_what_it_does_not_take(case: str) -> None:
    x, weight = operands(8, 64, torch.float32, seed=4)
    args = {
        "seventeen rows": (x.expand(kernel.MAX_ROWS + 1, -1), weight.t()),
        "few rows with a one-row tile": (torch.cat([x, x]), weight.t()),
        "weight not transposed": (x, weight.t().contiguous()),
        "odd width": (x, weight[:15].t()),
        "dtypes differ": (x.to(torch.bfloat16), weight.t()),
    }[case]
    assert kernel.fits(*args) == (case == "few rows with a one-row tile")  # it fits; its config does not
    with pytest.raises(ValueError, match="scaled_silu_mul_linear kernel"):
        kernel.scaled_silu_mul_linear(*args, EPS, **kernel.CONFIGS[90])


def test_kernel_op_takes_the_reference_s_arguments_and_opcheck() -> None:
    x, weight = operands(16, 128, torch.bfloat16, seed=6)
    config = tuple(kernel.CONFIGS[90].values())
    out = torch.ops.graphspec.scaled_silu_mul_linear_triton(x, weight.t(), EPS, *config)
    reference = ops.scaled_silu_mul_linear(x, weight.t(), EPS)
    assert rel_error(out, reference.float()) < TOLERANCE[torch.bfloat16]
    opcheck(torch.ops.graphspec.scaled_silu_mul_linear_triton, (x, weight.t(), EPS, *config))


@pytest.mark.gpu
@pytest.mark.parametrize(("inter", "hidden"), [(14336, 4096), (8192, 2048)])
@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_real_shapes_gpu(inter: int, hidden: int, rows: int) -> None:
    """bf16 at the 8B and 1B MLPs with the sm_90 rows: as close to the fp64 reference as the two kernels it replaces
    (the GEMV at one row, cuBLAS's matmul at more)."""
    poison_allocator()
    x, weight = operands(inter, hidden, torch.bfloat16, seed=7, rows=rows)
    exact = ops.scaled_silu_mul_linear_reference(x.double(), weight.double().t(), EPS)
    config = kernel.CONFIGS[90 if rows == 1 else (90, "few_rows")]
    fused = kernel.scaled_silu_mul_linear(x, weight.t(), EPS, **config)
    gate_up = gemv.gemv(x, weight.t()) if rows == 1 else x @ weight.t()
    swiglu = unfused_swiglu.CONFIGS[90]
    two = unfused_swiglu.scaled_silu_mul(gate_up, x, EPS, swiglu["tile_elems"], swiglu["num_warps"])
    assert rel_error(fused, exact) <= 1.05 * rel_error(two, exact) + 1e-4
