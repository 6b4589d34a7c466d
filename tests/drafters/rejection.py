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
    if draft_logits.stride(0) == 0 and rows > SHARED_CHECK_ROWS:
        return _sample_and_verify_shared(draft_logits, target, params, seeds, counter)
    drafts = torch.stack(
        [ops.sample(draft_logits[:, i], *params, seeds, counter, ops.DRAFT_LANE + i) for i in range(k)], 1
    )
    tokens, accepted = ops.verify_rejection(
        target.expand(rows, k + 1, vocab), draft_logits, drafts, *params, seeds, counter
    )
    return drafts, tokens, accepted


# Rows whose ops.sample / ops.verify_rejection results the shared-logits path is checked against.
SHARED_CHECK_ROWS = 2_000


def _sample_and_verify_shared(draft_logits, target, params, seeds, counter) -> tuple[torch.Tensor, ...]:
    """sample_and_verify for draft logits that are one row expanded over all rows (stride 0), as the
    distribution tests build them: the ops' per-row work, once. ops.sample is sample_from(sampling_weights,
    uniform(seed, counter, lane)) and ops.verify_rejection is rejection_from_probabilities(process_logits
    of target and draft), each row on its own; with every row's logits equal, the weights and p/q are
    computed for one row (the sort over 100k rows x (2K+1) positions was nearly all of the time) and the
    draws, accepts and residual draws still run per row with each row's own seed. The first
    SHARED_CHECK_ROWS rows are also run through ops.sample and ops.verify_rejection themselves and must
    come out identical, token for token."""
    rows, k, vocab = draft_logits.shape
    one = tuple(p[:1] for p in params)
    weights = ops.sampling_weights(draft_logits[:1], *one)[0]  # [K, V], the row every row samples from
    drafts = torch.stack(
        [ops.sample_from(weights[i], ops.uniform(seeds, counter, ops.DRAFT_LANE + i)) for i in range(k)], 1
    )
    p = ops.process_logits(target.expand(1, k + 1, vocab), *one)
    q = ops.process_logits(draft_logits[:1], *one)
    tokens, accepted = ops.rejection_from_probabilities(
        p.expand(rows, -1, -1), q.expand(rows, -1, -1), drafts, seeds, counter
    )
    check = slice(0, SHARED_CHECK_ROWS)
    small = sample_and_verify(draft_logits[check], target)  # contiguous rows: the ops themselves
    for got, want in zip((drafts[check], tokens[check], accepted[check]), small, strict=True):
        assert torch.equal(got, want)
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
