"""kernels/mm.py and kernels/addmm.py against the fp64 product and aten's ops; their row-invariance is
tested with the other invariant kernels in test_invariance.py."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import addmm  # noqa: F401  (registers graphspec::addmm_triton)
from graphspec.kernels import mm as kernel

from tests.kernels.helpers import DEVICE, TOLERANCE, generator, rel_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "n", "k", "bias"),
    [(1, 40, 64, False), (5, 96, 300, True), (7, 33, 517, True), (70, 20, 1024, False)],
)
@pytest.mark.parametrize("config", [90, "default"])
def test_mm_matches_fp64_product(dtype: torch.dtype, rows: int, n: int, k: int, bias: bool, config) -> None:
    """Rows below and above one row tile, N not a multiple of BLOCK_N, K with a masked tail block and
    several K splits, a transposed weight view as aten.mm gets it from nn.Linear, and a bias."""
    g = generator(rows * n + k)
    a = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    weight = torch.randn(n, k, generator=g).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    out = kernel.mm(a, weight.t(), b, **{**kernel.CONFIGS[config], "block_k": 32})
    exact = a.double() @ weight.double().T + (b.double() if bias else 0)
    assert out.shape == (rows, n) and out.dtype == dtype and out.is_contiguous()
    assert rel_error(out, exact) < TOLERANCE[dtype]


def test_splits_depend_on_n_and_k_only() -> None:
    assert kernel.splits_for(4096, 4096, 64, 128, 256) == 4  # 64 column tiles x 4 splits
    assert kernel.splits_for(28672, 4096, 64, 128, 256) == 1  # 448 tiles fill the grid alone
    assert kernel.splits_for(4096, 256, 64, 128, 256) == 1  # 2 K blocks: too short to split
    assert kernel.splits_for(4096, 4096, 64, 128, 0) == 1


def test_kernel_ops_take_aten_arguments() -> None:
    """The lowered nodes keep aten.mm's / aten.addmm's arguments and append the config."""
    g = generator(3)
    a, w, b = (torch.randn(*shape, generator=g).to(DEVICE) for shape in ((3, 40), (24, 40), (24,)))
    config = tuple(kernel.CONFIGS["default"].values())
    out = torch.ops.graphspec.mm_triton(a, w.t(), *config)
    torch.testing.assert_close(out, torch.ops.aten.mm(a, w.t()), rtol=1e-5, atol=1e-5)
    out = torch.ops.graphspec.addmm_triton(b, a, w.t(), 1, 1, *config)
    torch.testing.assert_close(out, torch.ops.aten.addmm(b, a, w.t()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="beta and alpha must be 1"):
        torch.ops.graphspec.addmm_triton(b, a, w.t(), 0.5, 1, *config)


def test_empty_rows_launch_nothing() -> None:
    a, w = torch.zeros(0, 16, device=DEVICE), torch.zeros(8, 16, device=DEVICE)
    assert kernel.mm(a, w.t()).shape == (0, 8)
