"""verify_greedy kernel vs graphspec.ops.verify_greedy: argmax tokens and accepted counts, exactly."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import verify_greedy as kernel

from tests.kernels.helpers import DEVICE, generator, poison_allocator


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int, pad: int = 37):
    """Logits [B, K+1, V] as a slice of a wider tensor (non-contiguous, offset start), and drafts that
    agree with the target's argmax for a random prefix of each row (every accept count shows up)."""
    g = generator(seed)
    wide = torch.randn(batch, k + 1, vocab + pad, generator=g).to(DEVICE, dtype)
    logits = wide[:, :, 5 : vocab + 5]
    drafts = logits.argmax(-1)[:, :k].clone()
    agree = torch.randint(0, k + 1, (batch,), generator=g).to(DEVICE)
    for row, prefix in enumerate(agree.tolist()):
        if prefix < k:
            drafts[row, prefix] = (drafts[row, prefix] + 1) % vocab
    return logits, drafts


def check(logits: torch.Tensor, drafts: torch.Tensor, **config: int) -> None:
    poison_allocator()
    tokens, accepted = kernel.verify_greedy(logits, drafts, **config)
    ref_tokens, ref_accepted = kernel.verify_greedy_reference(logits, drafts)
    assert tokens.dtype == accepted.dtype == torch.int64
    torch.testing.assert_close(tokens, ref_tokens, rtol=0, atol=0)
    torch.testing.assert_close(accepted, ref_accepted, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [100, 8193])
def test_verify_greedy_matches_reference(dtype: torch.dtype, vocab: int) -> None:
    logits, drafts = make_inputs(3, 3, vocab, dtype, seed=vocab)
    check(logits, drafts, block_v=1024, max_splits=4)


def test_verify_greedy_qwen_vocab() -> None:
    """151936 (Qwen2.5's padded vocab, not a multiple of the block), batch 1."""
    logits, drafts = make_inputs(1, 2, 151936, torch.bfloat16, seed=1)
    check(logits, drafts, block_v=16384, max_splits=4)


def test_verify_greedy_ties_take_first_index() -> None:
    """Equal maxima inside a block, across blocks and across splits: torch.argmax's first index."""
    logits = torch.zeros(2, 3, 300, device=DEVICE)
    logits[0, 0, [7, 250]] = 5.0  # different splits
    logits[0, 1, [130, 131]] = 5.0  # same block
    logits[1, :, :] = float("-inf")  # all -inf: index 0
    logits[1, 2, [299, 64]] = 1.0
    drafts = torch.tensor([[7, 130], [0, 0]], device=DEVICE)
    check(logits, drafts, block_v=64, max_splits=4)


def test_verify_greedy_op_takes_config() -> None:
    logits, drafts = make_inputs(2, 1, 100, torch.float32, seed=2)
    tokens, accepted = torch.ops.graphspec.verify_greedy_triton(logits, drafts, 32, 1, 2)
    ref_tokens, ref_accepted = kernel.verify_greedy_reference(logits, drafts)
    assert torch.equal(tokens, ref_tokens) and torch.equal(accepted, ref_accepted)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "k"), [(1, 1), (1, 8), (8, 4), (64, 8)])
def test_verify_greedy_real_shapes_gpu(batch: int, k: int) -> None:
    logits, drafts = make_inputs(batch, k, 151936, torch.bfloat16, seed=batch * k, pad=64)
    check(logits, drafts, **kernel.CONFIGS[90])


@pytest.mark.gpu
def test_verify_greedy_replays_in_cuda_graph_gpu() -> None:
    logits, drafts = make_inputs(4, 4, 151936, torch.bfloat16, seed=3)
    config = kernel.CONFIGS[90]
    kernel.verify_greedy(logits, drafts, **config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, accepted = torch.ops.graphspec.verify_greedy_triton(logits, drafts, *config.values())
    fresh, fresh_drafts = make_inputs(4, 4, 151936, torch.bfloat16, seed=4)
    logits.copy_(fresh)
    drafts.copy_(fresh_drafts)
    graph.replay()
    ref_tokens, ref_accepted = kernel.verify_greedy_reference(logits, drafts)
    assert torch.equal(tokens, ref_tokens) and torch.equal(accepted, ref_accepted)
