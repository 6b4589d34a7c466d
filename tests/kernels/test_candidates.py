"""kernels/candidates.py's top_logits (the candidates' selection): the values of torch.topk over whole rows, the
indices of those values, from two selections over vocabulary chunks."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels.candidates import MAX_CHUNKS, top_logits, vocab_chunks

from tests.kernels.helpers import DEVICE


@pytest.mark.parametrize(
    ("vocab", "cap", "chunks"),
    [
        (128256, 128, 32),
        (151936, 128, 32),
        (32000, 128, 16),
        (50257, 128, 29),
        (1000, 128, 2),
        (97, 16, 1),
        (255, 128, 1),
    ],
)
def test_vocab_chunks_cut_into_equal_chunks_near_sqrt(vocab: int, cap: int, chunks: int) -> None:
    """Equal chunks (a divisor of the vocabulary, at most MAX_CHUNKS) of at least twice cap entries, nearest
    sqrt(cap x vocab) entries; 1 (one selection over the whole row) where no divisor qualifies."""
    assert vocab_chunks(vocab, cap) == chunks
    assert vocab % chunks == 0 and (chunks == 1 or vocab // chunks >= 2 * cap) and chunks <= MAX_CHUNKS


def special_logits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random logits with what a selection can get wrong: ties across chunk boundaries and the cut, both zeros,
    infinities, and a NaN in one row."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=g).round(decimals=1)  # many ties
    flat = logits.view(-1, shape[-1])
    flat[0, :: shape[-1] // 5] = 3.0  # equal values in several chunks
    flat[0, 1], flat[0, 2] = 0.0, -0.0
    flat[-1, 7], flat[-1, 8] = float("inf"), float("-inf")
    flat[-1, 9] = float("nan")
    return logits.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("vocab", "cap"), [(1000, 16), (1024, 128), (97, 16)])  # 31, 4 chunks; one selection
def test_top_logits_are_topk_values_and_their_indices(dtype: torch.dtype, vocab: int, cap: int) -> None:
    logits = special_logits((2, 3, vocab), dtype, seed=vocab + cap)
    values, index = top_logits(logits, cap)
    expected, _ = torch.topk(logits, cap, dim=-1)
    assert values.shape == index.shape == (2, 3, cap) and values.dtype == dtype and index.dtype == torch.int64
    # The same values (NaN sorts highest in both), each read at its index, no index twice.
    torch.testing.assert_close(values.sort(-1, descending=True).values, expected, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(torch.gather(logits, -1, index), values, equal_nan=True, rtol=0, atol=0)
    assert (index.sort(-1).values.diff(dim=-1) > 0).all()


def test_top_logits_reads_strided_rows() -> None:
    """Logits may come with any strides (a verify's rows of a wider buffer): a strided view selects as its copy."""
    wide = special_logits((3, 2 * 1000), torch.float32, seed=5)
    logits = wide[:, ::2]  # stride 2 along the vocabulary
    values, index = top_logits(logits, 16)
    expected, _ = torch.topk(logits.contiguous(), 16, dim=-1)
    torch.testing.assert_close(values.sort(-1, descending=True).values, expected, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(torch.gather(logits, -1, index), values, equal_nan=True, rtol=0, atol=0)
