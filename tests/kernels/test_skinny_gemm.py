"""The benchmark's candidate linear kernel (benchmarks/skinny_gemm.py) vs the fp64 product: it is not
lowered, but bench_linear's comparison with cuBLAS only means something if it computes the same thing."""

from __future__ import annotations

import pytest
import torch

from benchmarks import skinny_gemm as kernel
from tests.kernels.helpers import DEVICE, TOLERANCE, generator, rel_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "n", "k", "bias"),
    [(1, 40, 64, False), (5, 96, 300, True), (16, 33, 17, True), (3, 128, 256, False)],
)
def test_skinny_gemm_matches_fp64_product(dtype: torch.dtype, rows: int, n: int, k: int, bias: bool) -> None:
    """Row counts 1..16, N not a multiple of BLOCK_N, K not a multiple of BLOCK_K (masked tail), bias."""
    g = generator(rows * n + k)
    x = torch.randn(rows, k, generator=g).to(DEVICE, dtype)
    weight = torch.randn(n, k, generator=g).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    out = kernel.linear(x, weight, b, max_block_n=64, block_k=64)
    exact = x.double() @ weight.double().T + (b.double() if bias else 0)
    assert out.shape == (rows, n) and out.dtype == dtype
    assert rel_error(out, exact) < TOLERANCE[dtype]


def test_skinny_gemm_refuses_more_rows_than_max_rows() -> None:
    rows = kernel.MAX_ROWS + 1
    x, weight = torch.randn(rows, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match=f"{rows} rows"):
        kernel.linear(x, weight)
