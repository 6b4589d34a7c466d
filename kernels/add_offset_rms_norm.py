"""graphspec::add_offset_rms_norm as a Triton kernel: the residual add and the zero-centred RMSNorm in one
pass over the row (offset_rms_norm_kernel with HAS_RESIDUAL). Returns (offset_rms_norm(residual + x),
residual + x) exactly as graphspec.ops.add_offset_rms_norm_reference rounds them.
"""

from __future__ import annotations

import torch
from graphspec.kernels.common import check_config_table
from graphspec.kernels.offset_rms_norm import launch
from torch import Tensor

from graphspec import library
from graphspec.ops import add_offset_rms_norm_reference

__all__ = ["CONFIGS", "add_offset_rms_norm", "add_offset_rms_norm_reference", "add_offset_rms_norm_triton"]

# add_rms_norm's rows (one row per program at hidden 2048-4096 on sm_90), not tuned for these shapes.
CONFIGS: dict[int | str, dict[str, int]] = {
    80: {"tile_elems": 4096, "num_warps": 8},
    90: {"tile_elems": 2048, "num_warps": 4},
    "default": {"tile_elems": 4096, "num_warps": 4},
}
CONFIG_FIELDS = check_config_table(CONFIGS)


def add_offset_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    tile_elems: int = CONFIGS["default"]["tile_elems"],
    num_warps: int = CONFIGS["default"]["num_warps"],
) -> tuple[Tensor, Tensor]:
    """(offset_rms_norm(residual + x), residual + x) for x, residual [..., D] and weight [D]."""
    return launch(x, residual, weight, eps, tile_elems, num_warps)


@library.op("graphspec::add_offset_rms_norm_triton", mutates_args=())
def add_offset_rms_norm_triton(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, tile_elems: int, num_warps: int
) -> tuple[Tensor, Tensor]:
    """graphspec::add_offset_rms_norm lowered to offset_rms_norm_kernel; the trailing ints are CONFIG_FIELDS."""
    return add_offset_rms_norm(x, residual, weight, eps, tile_elems, num_warps)


@torch.library.register_fake("graphspec::add_offset_rms_norm_triton")
def _(x, residual, weight, eps, tile_elems, num_warps):
    return x.new_empty(x.shape), x.new_empty(x.shape)
