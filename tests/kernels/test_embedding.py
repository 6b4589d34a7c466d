"""embedding kernel (a row gather) vs torch.nn.functional.embedding: a copy, so equal bit for bit, at a
decode step's few indices and a verify's many, any index shape, widths that are not a power of 2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graphspec.kernels import embedding as kernel
from torch.library import opcheck

from tests.kernels.helpers import DEVICE, generator

CONFIG = tuple(kernel.CONFIGS["default"].values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("index_shape", "width"), [((16,), 96), ((2, 5), 1000), ((1, 1), 64), ((3, 7), 2048)])
def test_embedding_equals_torch(dtype: torch.dtype, index_shape: tuple[int, ...], width: int) -> None:
    g = generator(0)
    weight = torch.randn(50, width, generator=g).to(DEVICE, dtype)
    indices = torch.randint(0, 50, index_shape, generator=g).to(DEVICE)
    out = kernel.embedding_triton(weight, indices, -1, False, False, *CONFIG)
    assert out.shape == (*index_shape, width) and out.dtype == dtype
    assert torch.equal(out, F.embedding(indices, weight))


def test_embedding_block_narrower_than_the_row_and_int32_indices() -> None:
    """Several column blocks per index (block 32 over 100 columns: a partial last block) and int32 ids."""
    weight = torch.randn(9, 100, generator=generator(1)).to(DEVICE)
    indices = torch.tensor([[8, 0, 3], [3, 3, 1]], dtype=torch.int32, device=DEVICE)
    out = kernel.embedding_triton(weight, indices, -1, False, False, 32, 1)
    assert torch.equal(out, F.embedding(indices.long(), weight))


def test_embedding_index_outside_the_table_reads_nothing() -> None:
    """An out-of-range id gives a zero row (torch would stop the process), never a read past the table."""
    weight = torch.randn(4, 8, generator=generator(2)).to(DEVICE)
    out = kernel.embedding_triton(weight, torch.tensor([1, 4, -1], device=DEVICE), -1, False, False, *CONFIG)
    assert torch.equal(out[0], weight[1])
    assert torch.equal(out[1:], torch.zeros(2, 8, device=DEVICE))


def test_embedding_no_indices() -> None:
    weight, indices = torch.randn(4, 8).to(DEVICE), torch.zeros(2, 0, dtype=torch.int64, device=DEVICE)
    out = kernel.embedding_triton(weight, indices, -1, False, False, *CONFIG)
    assert out.shape == (2, 0, 8)


def test_embedding_op_registration() -> None:
    weight = torch.randn(6, 40).to(DEVICE, torch.bfloat16)
    indices = torch.tensor([[5, 0, 2]], device=DEVICE)
    opcheck(torch.ops.graphspec.embedding_triton.default, (weight, indices, -1, False, False, *CONFIG))
