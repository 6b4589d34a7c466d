"""graphspec::addmm_triton: kernels/mm.py's row-invariant matmul with a bias, for aten.addmm(bias, a, b).

out = a @ b + bias, the bias added to the fp32 sum before the one rounding to a's dtype (as cuBLAS does
for beta = 1). Same tiles, split and summation order as mm (the same kernel with HAS_BIAS), so the same
row-invariance; lowered under numerics="invariant", for alpha = beta = 1 and a [N] bias. By default only
its rows of kernels/gemv.py's shape classes are (products of one to gemv.DOT_MAX_ROWS rows, where gemv.py's kernels
beat cuBLAS; the bias may also be an [M, N] residual).
"""

from __future__ import annotations

import torch
from graphspec.kernels import gemv as gemv_kernel
from graphspec.kernels import mm as mm_kernel
from graphspec.kernels.common import check_config_table
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "addmm_triton", "shape_class"]

CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    key: dict(config) for key, config in mm_kernel.CONFIGS.items()
}
CONFIG_FIELDS = check_config_table(CONFIGS)


def shape_class(bias: Tensor, mat1: Tensor, mat2: Tensor, *_: object) -> str | None:
    """kernels/gemv.py's class of the product with this bias ("one_row*", "two_rows", "few_rows*"), else None."""
    return gemv_kernel.shape_class(mat1, mat2, bias)


# aten.addmm's own arguments (self + mat1 @ mat2, scaled by beta and alpha), then the config.
@library.op("graphspec::addmm_triton", mutates_args=())
def addmm_triton(
    self: Tensor,
    mat1: Tensor,
    mat2: Tensor,
    beta: float,
    alpha: float,
    block_m: int,
    block_n: int,
    block_k: int,
    split_programs: int,
    num_warps: int,
    num_stages: int,
) -> Tensor:
    """aten.addmm(bias, mat1, mat2) lowered to mm_kernel with the bias (beta = alpha = 1 only: the
    registry lowers no other); the trailing ints are CONFIG_FIELDS."""
    if beta != 1 or alpha != 1:
        raise ValueError(f"addmm kernel: beta and alpha must be 1, got {beta} and {alpha}")
    return mm_kernel.mm(mat1, mat2, self, block_m, block_n, block_k, split_programs, num_warps, num_stages)


@torch.library.register_fake("graphspec::addmm_triton")
def _(self, mat1, mat2, beta, alpha, *config):
    return mat1.new_empty((mat1.shape[0], mat2.shape[1]))
