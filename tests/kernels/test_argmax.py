"""argmax kernel vs graphspec.ops.argmax (torch.argmax over the last dim, then the ids given): tokens, exactly."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import argmax as kernel

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def wide_slice(rows: int, vocab: int, dtype: torch.dtype, seed: int, pad: int = 37) -> torch.Tensor:
    """Logits [rows, V] as a slice of a wider tensor (row stride > V, offset start), as [B, V] draft logits."""
    wide = torch.randn(rows, vocab + pad, generator=generator(seed)).to(DEVICE, dtype)
    return wide[:, 5 : vocab + 5]


def check(logits: torch.Tensor, ids: torch.Tensor | None = None, **config: int) -> None:
    poison_allocator()
    tokens = kernel.argmax(logits, ids, **config)
    assert tokens.dtype == torch.int64 and tokens.shape == logits.shape[:-1]
    torch.testing.assert_close(tokens, kernel.argmax_reference(logits, ids), rtol=0, atol=0)


def token_ids(vocab: int, seed: int) -> torch.Tensor:
    """Distinct ascending target ids of a reduced vocabulary (EAGLE-3's d2t applied, a token map), all but
    column 0 far from their column (a lookup that was skipped or off by one shows)."""
    gaps = torch.randint(1, 50, (vocab,), generator=generator(seed))
    return (torch.cumsum(gaps, 0) + 1000).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "vocab"), [(1, 100), (1, 8193), (5, 3000), (21, 257)])
def test_argmax_matches_reference(dtype: torch.dtype, rows: int, vocab: int) -> None:
    """One row (the draft at batch 1), several, more rows than one merge program takes (21 > 16)."""
    check(wide_slice(rows, vocab, dtype, seed=rows * vocab), block_v=1024, max_splits=4)


def test_argmax_ties_take_first_index() -> None:
    """Equal maxima across splits and inside a block, and an all -inf row: torch.argmax's first index."""
    logits = torch.zeros(3, 300, device=DEVICE)
    logits[0, [250, 7]] = 5.0  # different splits
    logits[1, [131, 130]] = 5.0  # same block
    logits[2] = float("-inf")
    check(logits, block_v=64, max_splits=4)


@pytest.mark.parametrize(("rows", "vocab"), [(1, 100), (1, 8193), (21, 257)])
def test_argmax_maps_through_ids(rows: int, vocab: int) -> None:
    """With ids: ids[first index of the maximum], the lookup done by the merge kernel (one row, several,
    more rows than one merge program takes)."""
    logits = wide_slice(rows, vocab, torch.bfloat16, seed=vocab + rows)
    check(logits, token_ids(vocab, seed=rows), block_v=1024, max_splits=4)


def test_argmax_refuses_ids_that_do_not_fit() -> None:
    logits = wide_slice(2, 100, torch.float32, seed=2)
    with pytest.raises(ValueError, match="ids must be int64"):
        kernel.argmax(logits, token_ids(99, seed=0))
    with pytest.raises(ValueError, match="ids must be int64"):
        kernel.argmax(logits, token_ids(100, seed=0).to(torch.int32))


def test_argmax_keeps_leading_dims() -> None:
    """[B, K, V] in, [B, K] out (rows collapsed and restored)."""
    check(torch.randn(2, 3, 500, generator=generator(5)).to(DEVICE), block_v=128, max_splits=2)


def test_argmax_op_takes_config() -> None:
    logits = wide_slice(2, 100, torch.float32, seed=2)
    tokens = torch.ops.graphspec.argmax_triton(logits, None, 32, 1, 2, 1)
    assert torch.equal(tokens, kernel.argmax_reference(logits))
    ids = token_ids(100, seed=3)
    mapped = torch.ops.graphspec.argmax_triton(logits, ids, 32, 1, 2, 1)
    assert torch.equal(mapped, ids[tokens])


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "vocab"), [(1, 128256), (1, 151936), (8, 128256), (64, 151936)])
def test_argmax_real_shapes_gpu(rows: int, vocab: int) -> None:
    check(wide_slice(rows, vocab, torch.bfloat16, seed=rows, pad=64), **kernel.CONFIGS[90])
    mapped = wide_slice(rows, vocab // 8, torch.bfloat16, seed=rows + 1, pad=64)  # a 16k-19k token map's logits
    check(mapped, token_ids(vocab // 8, seed=rows), **kernel.CONFIGS[90])


@pytest.mark.gpu
def test_argmax_replays_in_cuda_graph_gpu() -> None:
    logits = wide_slice(4, 128256, torch.bfloat16, seed=3)
    config = kernel.CONFIGS[90]
    kernel.argmax(logits, **config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = torch.ops.graphspec.argmax_triton(logits, None, *config.values())
    logits.copy_(wide_slice(4, 128256, torch.bfloat16, seed=4))
    graph.replay()
    assert torch.equal(tokens, kernel.argmax_reference(logits))
