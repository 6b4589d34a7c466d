"""Rejection sampling as the step runs it, for drafters' distribution tests."""

from __future__ import annotations

import torch

from graphspec import ops


def sample_and_verify(draft_logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(drafts [rows, K], tokens [rows, K+1], accepted [rows]): drafts sampled from draft_logits
    [rows, K, V] as the step samples them (ops.sample on the draft lanes, temperature 1, no top-k/top-p,
    seed = row), then ops.verify_rejection against the target logits [V] at every position."""
    rows, k, vocab = draft_logits.shape
    params = (torch.ones(rows), torch.zeros(rows, dtype=torch.int64), torch.ones(rows))
    seeds, counter = torch.arange(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64)
    drafts = torch.stack(
        [ops.sample(draft_logits[:, i], *params, seeds, counter, ops.DRAFT_LANE + i) for i in range(k)], 1
    )
    tokens, accepted = ops.verify_rejection(
        target.expand(rows, k + 1, vocab), draft_logits, drafts, *params, seeds, counter
    )
    return drafts, tokens, accepted
