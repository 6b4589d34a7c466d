"""graphspec::addmm_in_place_triton: aten.addmm_(x, a, b) of one to gemv.DOT_MAX_ROWS rows, kernels/gemv.py writing x.

The folded norms' residual adds (models/decoder.add_linear, made in place by passes/addmm_in_place.py) are
addmm_(residual, a, W.t()): at batch 1 the o and down projections of every decode layer and of a K = 4 verify.
The kernel adds the product to x's fp32 value before the one rounding, as cuBLAS does with beta = 1, and writes
x; like aten.addmm_ it returns x. Lowered by default where gemv.shape_class names the product (one row; two
rows; the tensor-core kernel's 2 to gemv.DOT_MAX_ROWS: the registry's fits); every config row is one of gemv.py's
(block_m <= gemv.MAX_ROWS). Not row-invariant: under numerics="invariant" (which refuses folded norms) it keeps
the reference.
"""

from __future__ import annotations

from graphspec.kernels import gemv as gemv_kernel
from graphspec.kernels.common import check_config_table
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "addmm_in_place_triton", "shape_class"]

# The one-row GEMV's rows as the SM's rows, and the (sm, class) rows of its other shape classes.
CONFIGS: dict[int | str | tuple[int | str, str], dict[str, int]] = {
    **{key: dict(config) for key, config in gemv_kernel.CONFIGS.items()},
    **gemv_kernel.class_rows(name for name in gemv_kernel.CLASS_CONFIGS if name != "one_row"),
}
CONFIG_FIELDS = check_config_table(CONFIGS)


def shape_class(self: Tensor, mat1: Tensor, mat2: Tensor, *_: object) -> str | None:
    """kernels/gemv.py's class where it has its own config rows ("one_row_long_k", "two_rows", "few_rows*"), else
    None (one row: the SM's row)."""
    name = gemv_kernel.shape_class(mat1, mat2, self)
    return None if name == "one_row" else name


def _addmm_in_place(
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
    if beta != 1 or alpha != 1:
        raise ValueError(f"addmm_in_place kernel: beta and alpha must be 1, got {beta} and {alpha}")
    if block_m > gemv_kernel.MAX_ROWS:
        raise ValueError(f"addmm_in_place kernel: only the GEMVs (block_m <= {gemv_kernel.MAX_ROWS}) write in place")
    return gemv_kernel.gemv(mat1, mat2, self, self, block_m, block_n, block_k, num_warps, num_stages)


# aten.addmm_'s own arguments (beta and alpha positional, as addmm_triton takes them), then the config; like
# aten.addmm_ it writes self and returns it (an alias, which the library's inferred schemas cannot express).
addmm_in_place_triton = library.define_schema(
    "addmm_in_place_triton(Tensor(a!) self, Tensor mat1, Tensor mat2, float beta, float alpha, "
    + ", ".join(f"int {name}" for name in CONFIG_FIELDS)
    + ") -> Tensor(a!)",
    _addmm_in_place,
    fake=lambda self, *args: self,
)
