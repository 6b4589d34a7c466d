"""The CPU table's sample and verify_rejection (kernels/sample_cpu.py, verify_rejection_cpu.py over
kernels/sampling_cpu.py): the reference's weights, tokens and accepted counts exactly, with the sort
skipped where each row's top candidates settle its cuts and the reference taken where they do not."""

from __future__ import annotations

import pytest
import torch
from graphspec.kernels import sample_cpu, sampling_cpu, verify_rejection_cpu

from graphspec import ops
from tests.kernels.candidate_rows import CAP, KINDS, kind_logits, kind_parameters
from tests.kernels.helpers import generator

# Kinds the CPU's candidates do not settle: top_k > CAP, or a top-p cut past the CAP-th key. (Unlike the
# GPU's, the CPU's take argmax and ties from the whole row: exact order keys, not float compares.)
UNSETTLED = {"top_k_past_cap", "top_p_wide", "top_k_top_p_past_cap"}


def kind_batch(kinds: list[str], vocab: int, positions: int, seed: int):
    """logits [B, positions, V] of these kinds and their (temperature, top_k, top_p)."""
    g = generator(seed)
    logits = torch.stack([torch.stack([kind_logits(kind, vocab, g) for _ in range(positions)]) for kind in kinds])
    return logits, kind_parameters(kinds)[:3]


@pytest.mark.parametrize("kind", list(KINDS))
def test_candidates_settle_exactly_the_rows_they_can(kind: str) -> None:
    """Each kind alone (3 rows of it): settled or not as intended, and when settled the reference's
    weights element for element."""
    logits, params = kind_batch([kind] * 3, 300, 1, seed=len(kind))
    logits = logits[:, 0]
    decided = sampling_cpu.decided_weights(logits, *params, candidates=CAP)
    assert (decided is None) == (kind in UNSETTLED)
    if decided is not None:
        assert torch.equal(decided[0], ops.sampling_weights(logits, *params))


def seeds_and_counter(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = generator(batch)
    return torch.randint(-(2**62), 2**62, (batch,), generator=g), torch.randint(0, 1000, (batch,), generator=g)


@pytest.mark.parametrize("unsettled", [False, True], ids=["settled", "one_unsettled_row"])
def test_sample_cpu_equals_the_reference(unsettled: bool) -> None:
    """A batch of every settled kind (the candidates path, asserted), and the same with one row they
    cannot settle (the reference for the whole batch): the reference op's tokens over several lanes."""
    kinds = [kind for kind in KINDS if kind not in UNSETTLED] + (["top_p_wide"] if unsettled else [])
    logits, params = kind_batch(kinds, 300, 1, seed=3)
    logits = logits[:, 0]
    seeds, counter = seeds_and_counter(len(kinds))
    assert (sampling_cpu.decided_weights(logits, *params) is None) == unsettled
    for lane in range(4):
        got = sample_cpu.sample_cpu(logits, *params, seeds, counter, lane)
        assert torch.equal(got, ops.sample(logits, *params, seeds, counter, lane))


@pytest.mark.parametrize("unsettled", [False, True], ids=["settled", "one_unsettled_row"])
def test_verify_rejection_cpu_equals_the_reference(unsettled: bool) -> None:
    """Target [B, K+1, V] and draft [B, K, V] rows of every settled kind (and one row that 128
    candidates cannot settle): the reference op's tokens and accepted counts."""
    kinds = [kind for kind in KINDS if kind not in UNSETTLED] + (["top_p_wide"] if unsettled else [])
    k = 3
    target, params = kind_batch(kinds, 300, k + 1, seed=4)
    draft, _ = kind_batch(kinds, 300, k, seed=5)
    seeds, counter = seeds_and_counter(len(kinds))
    q = ops.process_logits(draft, *params)
    drafts = torch.stack([ops.sample_from(q[:, j], ops.uniform(seeds, counter, j)) for j in range(k)], dim=1)
    assert (sampling_cpu.decided_weights(draft, *params) is None) == unsettled
    args = (target, draft, drafts, *params, seeds, counter)
    tokens, accepted = verify_rejection_cpu.verify_rejection_cpu(*args)
    expected_tokens, expected_accepted = ops.verify_rejection(*args)
    assert torch.equal(tokens, expected_tokens) and torch.equal(accepted, expected_accepted)


@pytest.mark.parametrize("distinct", [2, 7, 1000])  # few distinct keys: long groups of ties
def test_weight_above_is_the_weight_of_every_strictly_larger_candidate(distinct: int) -> None:
    g = generator(distinct)
    keys = torch.randint(0, distinct, (3, 4, 128), generator=g).sort(-1, descending=True).values
    weights = torch.randint(0, 2**20, (3, 4, 128), generator=g) * (torch.rand(3, 4, 128, generator=g) > 0.2)
    pairwise = (weights.unsqueeze(-2) * (keys.unsqueeze(-2) > keys.unsqueeze(-1))).sum(-1)
    assert torch.equal(sampling_cpu.weight_above(weights, keys), pairwise)
