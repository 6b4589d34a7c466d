"""The n-gram drafter's proposals against transformers' prompt-lookup matcher, its settings checks, and
the filler rule (rows with fewer than K proposals never accept filler) on the verify ops."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from graphspec import ops
from graphspec.drafters.base import StepView
from graphspec.drafters.ngram import NGram
from graphspec.errors import InputError
from tests.test_ops import g_test_p_value

SLOTS, MAX_SEQ = 5, 40


def propose(drafter: NGram, histories: list[list[int]], k: int) -> tuple[list[list[int]], torch.Tensor]:
    """Run propose() eagerly on rows whose history is `histories` (slot = row); drafts cut at length."""
    history = torch.full((SLOTS, MAX_SEQ), 10**6, dtype=torch.int64)  # dead entries: ids no model has
    for row, tokens in enumerate(histories):
        history[row, : len(tokens) - 2] = torch.tensor(tokens[:-2])  # the step writes the last two itself
    rows = len(histories)
    inputs = {
        "committed_len": torch.tensor([len(h) for h in histories]),
        "slot_ids": torch.arange(rows),
        "last_tokens": torch.tensor([h[-2:] for h in histories]),
    }
    proposal = drafter.propose({}, StepView(inputs, k, pick=None), {"token_history": history})
    lengths = proposal.length
    assert torch.equal(proposal.state["token_history"][:rows, : MAX_SEQ - 2].ne(10**6).sum(1), inputs["committed_len"])
    return [proposal.tokens[row, : int(lengths[row])].tolist() for row in range(rows)], proposal.tokens


def transformers_candidates(history: list[int], k: int, ngram_max: int) -> list[int]:
    generator = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=ngram_max, max_length=10**6)
    ids = torch.tensor([history])
    candidates, _ = generator.get_candidates(ids)
    return candidates[0, len(history) :].tolist()


@pytest.mark.parametrize("ngram_max", [1, 2, 3, 5])
@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_proposals_equal_transformers_prompt_lookup(ngram_max, k):
    generator = torch.Generator().manual_seed(ngram_max * 10 + k)
    drafter = NGram(ngram_min=1, ngram_max=ngram_max)
    compared = matched = 0
    for _ in range(30):
        # Small vocabularies make matches (and several candidate n-gram lengths) common.
        vocab = int(torch.randint(2, 9, (1,), generator=generator))
        histories = [
            torch.randint(
                0, vocab, (int(torch.randint(2, MAX_SEQ - 2, (1,), generator=generator)),), generator=generator
            ).tolist()
            for _ in range(SLOTS)
        ]
        got, tokens = propose(drafter, histories, k)
        for history, drafts in zip(histories, got, strict=True):
            assert drafts == transformers_candidates(history, k, ngram_max), history
            compared += 1
            matched += bool(drafts)
        assert tokens.ge(0).all() and tokens.lt(10).all()  # filler and drafts are valid ids, never dead entries
    assert matched > compared // 2  # the comparison covered many matches, not only empty proposals


def test_longest_ngram_wins_and_earliest_occurrence_is_taken():
    drafter = NGram(ngram_min=1, ngram_max=3)
    #        0  1  2  3  4  5  6  7  8  9 10 11: suffix [5, 6] matches at 1 (followed by 7) and at 7 (by 9)
    history = [5, 5, 6, 7, 1, 2, 5, 6, 9, 3, 5, 6]
    assert propose(drafter, [history], 2)[0] == [[7, 1]]
    # With [4, 5, 6] the 3-gram occurrence at 6 beats the earlier 2-gram one.
    history = [5, 6, 8, 0, 0, 4, 5, 6, 2, 9, 4, 5, 6]
    assert propose(drafter, [history], 3)[0] == [[2, 9, 4]]


def test_ngram_min_leaves_shorter_matches_unproposed():
    history = [1, 2, 3, 4, 5, 3]  # only the 1-gram [3] recurs
    assert propose(NGram(ngram_min=1, ngram_max=2), [history], 2)[0] == [[4, 5]]
    assert propose(NGram(ngram_min=2, ngram_max=2), [history], 2)[0] == [[]]


def test_proposals_stop_at_the_committed_tokens():
    history = [7, 8, 9, 1, 7, 8]  # [7, 8] recurs at 0, followed by 9, 1, 7, 8: only 4 committed tokens
    got, tokens = propose(NGram(ngram_min=1, ngram_max=2), [history], 6)
    assert got == [[9, 1, 7, 8]]
    assert tokens[0, 4:].tolist() == [0, 0]  # filler


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ngram_min": 0}, "ngram_min must be an int between 1 and 16"),
        ({"ngram_max": 17}, "ngram_max must be an int between 1 and 16"),
        ({"ngram_min": 3, "ngram_max": 2}, "must not exceed"),
        ({"ngram_max": True}, "ngram_max must be an int"),
        ({"ngram_min": 1.5}, "ngram_min must be an int"),
    ],
)
def test_bad_settings_are_refused(options, message):
    with pytest.raises(InputError, match=message):
        NGram(**options)


def rows_params(rows: int, temperature: float) -> tuple[torch.Tensor, ...]:
    return (
        torch.full((rows,), temperature),
        torch.zeros(rows, dtype=torch.int64),
        torch.ones(rows),
        torch.arange(rows, dtype=torch.int64),
        torch.zeros(rows, dtype=torch.int64),
    )


def one_hot_logits(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.full((*tokens.shape, vocab), float("-inf")).scatter(-1, tokens[..., None], 0.0)


@pytest.mark.parametrize("draft_length", [0, 1])
def test_filler_is_never_accepted_and_the_next_token_follows_the_target(draft_length):
    """One-hot drafts whose first `draft_length` are real: over 240k rows the token at draft_length
    follows the target's distribution there (given the real drafts were accepted), and no row accepts
    past its real drafts, even where the filler is the target's most likely token."""
    rows, vocab, k = 240_000, 12, 3
    generator = torch.Generator().manual_seed(7)
    target = torch.randn(vocab, generator=generator) * 1.5
    filler = int(target.argmax())  # the worst case: the target likes the filler best
    drafts = torch.full((rows, k), filler)
    drafts[:, :draft_length] = int(target.argmax())
    params = rows_params(rows, 1.0)
    target_logits = target.expand(rows, k + 1, vocab)
    tokens, accepted = ops.verify_rejection(target_logits, one_hot_logits(drafts, vocab), drafts, *params)
    lengths = torch.full((rows,), draft_length)
    tokens, accepted = ops.limit_accepted(tokens, accepted, lengths, target_logits, *params)
    assert accepted.le(draft_length).all()
    p = torch.softmax(target, -1)
    reached = accepted == draft_length
    assert reached.sum() > 50_000
    counts = torch.bincount(tokens[reached, draft_length], minlength=vocab)
    assert g_test_p_value(counts, p) > 1e-3


def test_greedy_limit_keeps_the_target_argmax():
    logits = torch.randn(3, 4, 9, generator=torch.Generator().manual_seed(1))
    drafts = logits[:, :3].argmax(-1)  # every draft matches: verify accepts all 3
    tokens, accepted = ops.verify_greedy(logits, drafts)
    limited, capped = ops.limit_accepted(tokens, accepted, torch.tensor([0, 2, 3]), logits, *rows_params(3, 0.0))
    assert capped.tolist() == [0, 2, 3]
    assert torch.equal(limited, tokens)  # at temperature 0 the target's own token is its argmax
