"""Rejection sampling as the step runs it, for drafters' distribution tests."""

from __future__ import annotations

import torch

from graphspec import ops
from graphspec.drafters.base import StepView
from tests.test_ops import g_test_p_value


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


def assert_drafts_follow_their_logits(
    drafter, state: dict, last_tokens: torch.Tensor, length: int, k: int, temperature: float = 0.1
) -> None:
    """Rejection sampling is exact only if the logits a proposal reports for draft i are what draft i was
    drawn from, and with chained drafts draft 2's depend on the sampled draft 1. `state` holds one
    prefilled slot (slot 0; committed length `length`, last two tokens `last_tokens` [2]). Its copy in
    8,000 slots proposes with the step's sampler (ops.sample on the draft lanes at `temperature`, chosen
    so that some draft-1 groups are large, and a seed per row). Draft 1 must follow its reported
    distribution over all rows (G-test), and draft 2 its reported one within each of the (up to three)
    largest groups of rows, at least 300 each, that drew the same draft 1."""
    rows = 8_000
    # Copies of slot 0 in every slot: KV caches ([L, 2, SLOTS, ...]) keep slots in their third dimension.
    state = {
        name: tensor.expand(-1, -1, rows, *tensor.shape[3:]).clone()
        if name.endswith("cache")
        else tensor.expand(rows, *tensor.shape[1:]).clone()
        for name, tensor in state.items()
    }
    slots, zeros = torch.arange(rows), torch.zeros(rows, dtype=torch.int64)
    inputs = {
        "committed_len": torch.full((rows,), length),
        "slot_ids": slots,
        "last_tokens": last_tokens.expand(rows, 2),
    }
    params = (torch.full((rows,), temperature), zeros, torch.ones(rows), slots, zeros)  # T, top-k, top-p, seed, step

    def pick(logits: torch.Tensor, index: int) -> torch.Tensor:
        return ops.sample(logits, *params, ops.DRAFT_LANE + index)

    proposal = drafter.propose(drafter.params(), StepView(inputs, k, pick), state)
    drafts, q = proposal.tokens, torch.softmax(proposal.logits.double() / temperature, -1)
    vocab = q.shape[-1]
    assert torch.allclose(q[:, 0], q[:1, 0])  # one distribution for draft 1
    assert g_test_p_value(torch.bincount(drafts[:, 0], minlength=vocab), q[0, 0]) > 1e-3
    # The three largest groups (each G-test at 1e-3: more groups would add chance failures, not power).
    tokens, sizes = drafts[:, 0].unique(return_counts=True)
    order = sizes.argsort(descending=True)[:3]
    largest = [int(tokens[i]) for i in order if sizes[i] >= 300]
    assert len(largest) >= 2  # draft 2's distribution is checked under different draft 1s
    for token in largest:
        members = drafts[:, 0] == token
        assert torch.allclose(q[members, 1], q[members, 1][:1])
        assert g_test_p_value(torch.bincount(drafts[members, 1], minlength=vocab), q[members, 1][0]) > 1e-3
