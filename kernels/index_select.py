"""aten.index_select along dim 0 (slot gathers of drafter states: x[slot_ids]) as kernels/embedding.py's row
gather, for the reason that file gives: torch's small-index path took 9-11 us per gather of 16 rows on an
H200. The input is viewed as [N, everything else]; a copy, bit-identical to torch's."""

from __future__ import annotations

import torch
from graphspec.kernels.embedding import CONFIG_FIELDS, CONFIGS, gather_rows
from torch import Tensor

from graphspec import library

__all__ = ["CONFIGS", "CONFIG_FIELDS", "index_select_triton"]  # the gather's configs: the same kernel


@library.op("graphspec::index_select_triton", mutates_args=())
def index_select_triton(self: Tensor, dim: int, index: Tensor, block: int, num_warps: int) -> Tensor:
    """aten.index_select(self, 0, index) lowered to gather_rows_kernel; the trailing ints are CONFIG_FIELDS."""
    if dim not in (0, -self.dim()):
        raise ValueError(f"index_select kernel: gathers along dim 0 only, got dim={dim}")
    rows = self.contiguous()
    return gather_rows(rows.view(rows.shape[0], -1), index, block, num_warps).view(index.shape[0], *self.shape[1:])


@torch.library.register_fake("graphspec::index_select_triton")
def _(self, dim, index, block, num_warps):
    return self.new_empty((index.shape[0], *self.shape[1:]))
