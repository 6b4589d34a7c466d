"""index_select kernel (dim 0, kernels/embedding.py's row gather) vs torch.index_select: equal bit for bit,
for the drafter states it gathers by slot (float features, int64 tokens and positions, a 1-D tensor)."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import index_select as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator

CONFIG = tuple(kernel.CONFIGS["default"].values())


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((17, 5, 96), torch.bfloat16), ((17, 5), torch.int64), ((17, 1), torch.int64), ((17,), torch.float32)],
)
@pytest.mark.parametrize("dim", [0, None])  # None: the negative spelling of dim 0
def test_index_select_equals_torch(shape: tuple[int, ...], dtype: torch.dtype, dim: int | None) -> None:
    g = generator(0)
    source = (torch.randn(shape, generator=g) * 1000).to(dtype).to(DEVICE)
    index = torch.tensor([16, 0, 3, 3, 9], device=DEVICE)
    dim = -len(shape) if dim is None else dim
    out = kernel.index_select_triton(source, dim, index, *CONFIG)
    assert torch.equal(out, torch.index_select(source, 0, index))


def test_index_select_refuses_other_dims() -> None:
    with pytest.raises(ValueError, match="dim 0 only"):
        kernel.index_select_triton(torch.zeros(3, 4, device=DEVICE), 1, torch.tensor([0], device=DEVICE), *CONFIG)


def test_index_select_op_registration() -> None:
    source = torch.randn(7, 3, 10).to(DEVICE)
    opcheck(torch.ops.graphspec.index_select_triton.default, (source, 0, torch.tensor([6, 1], device=DEVICE), *CONFIG))
